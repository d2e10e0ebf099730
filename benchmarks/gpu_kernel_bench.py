#!/usr/bin/env python3
"""Benchmark DSpark's fused sequential-head kernel against the per-position pattern.

Needs only torch + triton (it puts this repo's ``kernels/`` and root on ``sys.path``;
SGLang is optional). Compares, per (batch, gamma, vocab) and for greedy and sampled
drafts:

* ``fused``     -- dspark_kernels.sequential_head, Triton, launch_mode=auto
                   (one persistent launch when the grid fits the SMs);
* ``fused_sw``  -- the same kernel in ``stepwise`` mode (gamma + 1 launches);
* ``perstep``   -- dspark_kernels.baseline_perstep: SGLang 0.5.23's per-position launch
                   pattern (gather, cuBLAS GEMM, add/noise/partial-argmax, finish) plus
                   torch confidence ops, re-expressed with this package's kernels;
* ``upstream``  -- SGLang's own ``draft_markov_block`` + ``DSparkConfidenceHead.predict``,
                   only when ``sglang`` imports (skipped otherwise).

Each variant covers the whole block: tokens, step logits (sampling), confidence.
On CUDA every variant is captured in a CUDA graph and timed by replay (what SGLang's
draft graph does); a failed capture falls back to eager timing (marked ``*``).
Before timing, every config's tokens are checked against the torch reference.

Modes:

* ``--check-only``: CUDA-graph capture/replay of the sequential head (Triton persistent
  and stepwise, and the torch backend), the capture's non-blocking device copy
  (:mod:`sglang_dspark.capture`), and the correctness sweep.
* default: the timing table above.

``--smoke`` runs a tiny configuration on CPU (TRITON_INTERPRET=1 is set automatically);
the timings are then meaningless. The policy's host cost and the summary table of
``benchmarks/run_gpu_bench.sh`` are in ``benchmarks/gpu_bench_host.py`` (no torch).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[1]
# kernels/ (dspark_kernels), the repo root (sglang_dspark: settings, capture) and
# controller/ (dspark_controller): nothing here needs SGLang itself.
for _path in (_REPO / "controller", _REPO, _REPO / "kernels"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

_HAS_CUDA = torch.cuda.is_available()
if not _HAS_CUDA:
    # Triton kernels only run on CPU through the interpreter; it must be set before
    # the kernels are defined.
    os.environ["TRITON_INTERPRET"] = "1"

from dspark_kernels import reserve_workspace, sequential_head, sequential_head_reference  # noqa: E402
from dspark_kernels.baseline_perstep import sequential_head_perstep  # noqa: E402
from dspark_kernels.contract import step_dtype_for  # noqa: E402

VARIANTS = ("fused", "fused_sw", "perstep", "upstream")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny CPU-sized run (interpreter on CPU)")
    p.add_argument("--check-only", action="store_true", help="graph checks + correctness, no timing")
    p.add_argument("--skip-checks", action="store_true", help="skip the graph checks (timing run)")
    p.add_argument("--batches", type=_ints, default=None, help="default 1,16,64,256 (smoke: 1,3)")
    p.add_argument("--gammas", type=_ints, default=None, help="default 4,7,15 (smoke: 3)")
    p.add_argument("--vocabs", type=_ints, default=None, help="default 32000,151936 (smoke: 70)")
    p.add_argument("--rank", type=int, default=None, help="default 256 (smoke: 16)")
    p.add_argument("--hidden", type=int, default=None, help="default 4096 (smoke: 32)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    p.add_argument("--iters", type=int, default=None, help="default 20 (smoke: 1)")
    p.add_argument("--time-budget", type=float, default=400.0, help="seconds; later configs are skipped")
    p.add_argument("--no-upstream", action="store_true", help="do not try to import SGLang")
    p.add_argument("--json", type=str, default=None, help="write results here")
    args = p.parse_args(argv)
    smoke = {"batches": [1, 3], "gammas": [3], "vocabs": [70], "rank": 16, "hidden": 32, "iters": 1}
    full = {"batches": [1, 16, 64, 256], "gammas": [4, 7, 15], "vocabs": [32000, 151936], "rank": 256,
            "hidden": 4096, "iters": 20}
    for name, value in (smoke if args.smoke else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


# ---------------------------------------------------------------------------
# inputs and variants
# ---------------------------------------------------------------------------


class Case:
    def __init__(self, *, batch, gamma, vocab, rank, hidden, dtype, device, seed=0):
        g = torch.Generator(device="cpu").manual_seed(seed)

        def randn(*shape, scale=1.0, dt=dtype):
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

        self.batch, self.gamma, self.vocab = batch, gamma, vocab
        self.base = randn(batch, gamma, vocab, scale=3.0)
        self.w1 = randn(vocab, rank, scale=0.5)
        self.w2 = randn(vocab, rank, scale=0.5 / rank**0.5)
        self.anchor = torch.randint(0, vocab, (batch,), generator=g).to(device)
        self.hidden = randn(batch, gamma, hidden)
        self.conf_w = randn(hidden + rank, scale=0.02, dt=torch.float32)
        self.conf_b = randn(1, dt=torch.float32)
        self.sts = torch.linspace(0.8, 1.5, gamma, device=device)
        self.temps = torch.full((batch,), 0.8, dtype=torch.float32, device=device)
        self.offset = torch.zeros(1, dtype=torch.int64, device=device)
        self.key = 0x2D2A9C317E44B1F3 ^ 1234
        self.step_dtype = step_dtype_for(dtype, dtype)
        self.logits_out = torch.empty((batch, gamma, vocab), dtype=self.step_dtype, device=device)

    def kwargs(self, greedy: bool) -> dict:
        return dict(
            base_logits=self.base,
            anchor_tokens=self.anchor,
            w1=self.w1,
            w2=self.w2,
            temperatures=self.temps,
            seed=self.key,
            offset=self.offset,
            greedy=greedy,
            logits_out=None if greedy else self.logits_out,
            hidden=self.hidden,
            conf_weight=self.conf_w,
            conf_bias=self.conf_b,
            sts_temperatures=self.sts,
        )


def make_variants(case: Case, greedy: bool, upstream) -> dict:
    kw = case.kwargs(greedy)

    def fused():
        out = sequential_head(backend="triton", **kw)
        if not greedy:
            case.offset.add_(1)
        return out.tokens

    def fused_sw():
        out = sequential_head(backend="triton", launch_mode="stepwise", **kw)
        if not greedy:
            case.offset.add_(1)
        return out.tokens

    def perstep():
        out = sequential_head_perstep(**kw)
        if not greedy:
            case.offset.add_(1)
        return out.tokens

    variants = {"fused": fused, "fused_sw": fused_sw, "perstep": perstep}
    if upstream is not None:
        variants["upstream"] = upstream.make(case, greedy)
    return variants


class Upstream:
    """SGLang's own draft walk + confidence, built around the case's tensors."""

    def __init__(self):
        from sglang.srt.models.dspark import DSparkConfidenceHead, VanillaMarkov
        from sglang.srt.speculative.dspark_components.dspark_draft import (
            DraftNoise,
            draft_markov_block,
        )

        self._conf_cls, self._markov_cls = DSparkConfidenceHead, VanillaMarkov
        self._noise_cls, self._walk = DraftNoise, draft_markov_block

    def make(self, case: Case, greedy: bool):
        vocab, rank = case.w1.shape
        hidden = case.hidden.shape[-1]
        with torch.device("meta"):  # weights are replaced below; skip the random init
            markov = self._markov_cls(vocab_size=vocab, markov_rank=rank)
            conf = self._conf_cls(hidden_size=hidden, markov_rank=rank)
        markov.markov_w1.weight = torch.nn.Parameter(case.w1, requires_grad=False)
        markov.markov_w2.weight = torch.nn.Parameter(case.w2, requires_grad=False)
        conf.proj.weight = torch.nn.Parameter(case.conf_w.view(1, -1), requires_grad=False)
        conf.proj.bias = torch.nn.Parameter(case.conf_b, requires_grad=False)
        conf.sts_temperatures = case.sts
        noise = self._noise_cls(key=case.key, offset=case.offset)
        features = case.hidden.reshape(-1, hidden)

        class _Sync:
            def sync(self, site, values):
                return values

        def run():
            tokens, _ = self._walk(
                markov_head=markov,
                base_logits=case.base,
                anchor_tokens=case.anchor,
                draft_hidden=case.hidden,
                step_temperatures=case.temps,
                noise=noise,
                tp_sync=_Sync(),
                logits_out=None if greedy else case.logits_out,
                greedy_draft=greedy,
            )
            conf.predict(features, anchor_tokens=case.anchor, draft_tokens=tokens, markov_head=markov)
            return tokens

        return run


def load_upstream(disabled: bool):
    if disabled:
        return None, "disabled"
    try:
        return Upstream(), "sglang"
    except Exception as exc:  # noqa: BLE001 -- any import failure means "not available"
        return None, f"unavailable ({type(exc).__name__}: {exc})"[:160]


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


def time_variant(fn, iters: int) -> tuple[float, bool]:
    """Milliseconds per call; True when timed by CUDA-graph replay."""
    if not _HAS_CUDA:
        fn()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters, False
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = None
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception as exc:  # noqa: BLE001
        print(f"    (graph capture failed: {type(exc).__name__}: {str(exc)[:120]}; timing eagerly)")
        torch.cuda.synchronize()
        graph = None
        run = fn
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    del graph
    return ms, run is not fn


# ---------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------


def check_tokens(case: Case, greedy: bool) -> dict:
    """Fused (both modes) and per-step tokens vs the torch reference, same offset."""
    kw = case.kwargs(greedy)
    ref_logits = None if greedy else torch.empty_like(case.logits_out)
    ref = sequential_head_reference(**{**kw, "logits_out": ref_logits})
    result = {}
    for name, call in (
        ("fused", lambda: sequential_head(backend="triton", **kw)),
        ("fused_sw", lambda: sequential_head(backend="triton", launch_mode="stepwise", **kw)),
        ("perstep", lambda: sequential_head_perstep(**kw)),
    ):
        out = call()
        match = (out.tokens == ref.tokens).float().mean().item()
        rows_off = int((out.tokens != ref.tokens).any(dim=1).sum().item())
        # One diverging row is tolerated (an fp32 accumulation-order near-tie flips one
        # draft token and everything after it in that row); more is a failure.
        entry = {"token_match": match, "rows_mismatched": rows_off, "ok": rows_off <= max(1, case.batch // 100)}
        if out.confidence is not None:
            entry["conf_max_err"] = (out.confidence - ref.confidence).abs().max().item()
        if not greedy:
            entry["logits_max_err"] = (out.step_logits.float() - ref_logits.float()).abs().max().item()
        result[name] = entry
    return result


GRAPH_VARIANTS = (("triton", "auto"), ("triton", "stepwise"), ("torch", "auto"))


def graph_check(device, dtype) -> dict:
    """Capture the sequential head (with the offset bump) in a CUDA graph and replay it:
    the Triton kernel's auto launch (persistent on one H200 at batch 16) and stepwise
    launch, and the torch backend; greedy and sampling; inputs changed between replays."""
    if not _HAS_CUDA:
        return {"skipped": "no CUDA"}
    from dspark_kernels import triton_seq_head as tsh

    report = {"available_sms": tsh.device_available_sms(device),
              "plan_b16": repr(tsh.plan_launch(batch=16, vocab=32000, rank=256, device=device))}
    reserve_workspace(device=device, max_batch=4096)
    for backend, launch_mode in GRAPH_VARIANTS:
        for greedy in (True, False):
            label = f"{backend}-{launch_mode}-{'greedy' if greedy else 'sample'}"
            try:
                ok = _graph_check_one(device, dtype, backend, launch_mode, greedy)
                report[label] = "PASS" if ok else "FAIL"
            except Exception as exc:  # noqa: BLE001
                report[label] = f"FAIL ({type(exc).__name__}: {str(exc)[:160]})"
            print(f"  graph {label}: {report[label]}", flush=True)
    return report


def _graph_check_one(device, dtype, backend: str, launch_mode: str, greedy: bool) -> bool:
    case = Case(batch=16, gamma=7, vocab=32000, rank=256, hidden=1024, dtype=dtype, device=device, seed=7)
    kw = case.kwargs(greedy)
    static = {}

    def body():
        out = sequential_head(backend=backend, launch_mode=launch_mode, **kw)
        static["tokens"], static["conf"] = out.tokens, out.confidence
        if not greedy:
            case.offset.add_(1)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    ok = True
    for trial in range(3):
        case.base.copy_(torch.randn_like(case.base, dtype=torch.float32).mul_(3.0).to(dtype))
        case.offset.fill_(100 + trial)
        graph.replay()
        torch.cuda.synchronize()
        case.offset.fill_(100 + trial)
        ref = sequential_head_reference(**{**kw, "logits_out": None if greedy else torch.empty_like(case.logits_out)})
        same_rows = (static["tokens"] == ref.tokens).all(dim=1)
        diff = (static["conf"] - ref.confidence)[same_rows].abs()
        conf_err = diff.max().item() if diff.numel() else float("inf")
        ok &= int((~same_rows).sum().item()) <= 1 and conf_err < 1e-3
    if not greedy:
        case.offset.fill_(5)
        graph.replay()
        first = static["tokens"].clone()
        advanced = int(case.offset.item())
        graph.replay()
        second = static["tokens"].clone()
        case.offset.fill_(5)
        graph.replay()
        again = static["tokens"].clone()
        ok &= advanced == 6 and torch.equal(first, again) and not torch.equal(first, second)
    torch.cuda.synchronize()
    del graph
    return bool(ok)


def capture_check(device) -> dict:
    """``SGLANG_DSPARK_CAPTURE``'s observer must not wait for the device: with the GPU
    busy (a ~0.5 s sleep kernel queued first), ``StepCapture.observe`` returns while the
    device is still busy, and the line written afterwards holds the step's values."""
    if not _HAS_CUDA:
        return {"skipped": "no CUDA"}
    import tempfile
    from types import SimpleNamespace

    from sglang_dspark.capture import StepCapture

    bs, gamma = 8, 4
    g = torch.Generator(device="cpu").manual_seed(3)
    raw_cpu = torch.randn(bs + 2, gamma, generator=g).to(torch.bfloat16)
    correct_cpu = torch.randint(0, gamma + 1, (bs + 2,), generator=g)
    kw = {
        "bs": bs,
        "confidence_raw": raw_cpu.to(device),
        "confidence": torch.sigmoid(raw_cpu.float()).to(device),
        "correct_len": correct_cpu.to(device),
        "layout": SimpleNamespace(verify_lens=torch.full((bs + 2,), gamma + 1, device=device)),
        "sampling_info": SimpleNamespace(temperatures=torch.zeros(bs + 2, 1, device=device)),
        "reqs": [SimpleNamespace(rid=f"r{i}") for i in range(bs + 2)],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "capture.jsonl"
        cap = StepCapture(str(path), gamma=gamma)
        cap.observe(kw)  # warm-up: pinned allocator, writer thread, CUDA event
        cap.flush()
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # about 0.5 s of device time at ~2 GHz
        busy = torch.cuda.Event()
        busy.record()
        start = time.perf_counter()
        cap.observe(kw)
        observe_ms = (time.perf_counter() - start) * 1e3
        still_busy = not busy.query()
        cap.flush()
        cap.close()
        lines = [json.loads(x) for x in path.read_text().splitlines()]
    last = lines[-1] if lines else {}
    values_ok = (len(lines) == 2 and last.get("conf_raw") == raw_cpu[:bs].float().tolist()
                 and last.get("accepted") == [min(int(a), gamma) for a in correct_cpu[:bs]])
    ok = still_busy and values_ok and cap.errors == 0
    return {"result": "PASS" if ok else "FAIL", "observe_ms": round(observe_ms, 3),
            "returned_while_device_busy": still_busy, "values_ok": values_ok}


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def run_config(case: Case, greedy: bool, args, upstream, results: dict) -> bool:
    """Check (and unless --check-only, time) one config; True when a check failed."""
    mode = "greedy" if greedy else "sample"
    checks = check_tokens(case, greedy)
    tok_ok = min(v["token_match"] for v in checks.values())
    checks_failed = not all(v["ok"] for v in checks.values())
    row = {"batch": case.batch, "gamma": case.gamma, "vocab": case.vocab, "mode": mode, "checks": checks}
    results["configs"].append(row)
    if args.check_only:
        print(f"check B={case.batch} gamma={case.gamma} V={case.vocab} {mode}: {checks}", flush=True)
        return checks_failed
    times = {}
    for name, fn in make_variants(case, greedy, upstream).items():
        try:
            times[name] = time_variant(fn, args.iters)
        except Exception as exc:  # noqa: BLE001
            print(f"    {name} failed: {type(exc).__name__}: {str(exc)[:160]}")
            times[name] = (float("nan"), False)
    row["ms"] = {k: v[0] for k, v in times.items()}
    row["graphed"] = {k: v[1] for k, v in times.items()}

    def cell(name):
        if name not in times:
            return f"{'n/a':>10}"
        ms, graphed = times[name]
        return f"{ms:>9.4f}{' ' if graphed or not _HAS_CUDA else '*'}"

    fused_ms = times["fused"][0]
    r_pre = times["perstep"][0] / fused_ms
    r_up = times["upstream"][0] / fused_ms if "upstream" in times else float("nan")
    row["ratio_perstep_over_fused"], row["ratio_upstream_over_fused"] = r_pre, r_up
    print(f"{case.batch:>4} {case.gamma:>3} {case.vocab:>7} {mode:>6} "
          + " ".join(cell(n) for n in VARIANTS)
          + f" {r_pre:>9.2f} {r_up:>9.2f} {tok_ok:>6.3f}", flush=True)
    return checks_failed


def _write_json(args, results: dict) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if _HAS_CUDA else "cpu")
    dtype = _DTYPES[args.dtype]
    if not _HAS_CUDA and not args.smoke:
        print("No CUDA device: only --smoke runs on CPU (Triton interpreter).", file=sys.stderr)
        return 2
    upstream, upstream_status = load_upstream(args.no_upstream)
    props = torch.cuda.get_device_properties(device).name if _HAS_CUDA else "cpu (TRITON_INTERPRET=1)"
    print(f"device: {props}; dtype {args.dtype}; rank {args.rank}; hidden {args.hidden}; upstream: {upstream_status}")
    results = {"kind": "check" if args.check_only else "timing", "device": props,
               "upstream": upstream_status, "graph_check": None, "capture_check": None, "configs": []}
    failed = False
    started = time.monotonic()

    if not args.skip_checks:
        results["graph_check"] = graph_check(device, dtype)
        print(f"cuda graph capture/replay check: {results['graph_check']}")
        failed |= "FAIL" in json.dumps(results["graph_check"])
        results["capture_check"] = capture_check(device)
        print(f"capture non-blocking check: {results['capture_check']}")
        failed |= "FAIL" in json.dumps(results["capture_check"])

    header = f"{'B':>4} {'gam':>3} {'V':>7} {'mode':>6} " + " ".join(f"{n:>10}" for n in VARIANTS) + f" {'perstep/f':>9} {'upstrm/f':>9} {'tok_ok':>6}"
    if not args.check_only:
        print("times are ms per draft block (graph replay; * = eager)")
        print(header)
    configs = [(v, g, b) for v in args.vocabs for g in args.gammas for b in args.batches]
    for vocab, gamma, batch in configs:
        if time.monotonic() - started > args.time_budget:
            print(f"time budget {args.time_budget}s reached; skipping the remaining configs")
            results["truncated"] = True
            break
        case = Case(batch=batch, gamma=gamma, vocab=vocab, rank=args.rank, hidden=args.hidden,
                    dtype=dtype, device=device)
        for greedy in (True, False):
            failed |= run_config(case, greedy, args, upstream, results)
        del case
        if _HAS_CUDA:
            torch.cuda.empty_cache()
    print("ratios > 1 mean the fused kernel is faster.")
    print("RESULT:", "FAIL" if failed else "PASS", f"({time.monotonic() - started:.1f}s)")
    _write_json(args, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
