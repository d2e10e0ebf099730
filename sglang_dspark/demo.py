"""`make demo`: DSPARK on CPU, end to end, with a tiny local model pair.

1. uses the committed trained pair ``models/tiny-stdlib`` (a tiny Qwen3 trained on
   standard-library code and its DSpark drafter, ``python -m sglang_dspark.train
   tiny-pair``); ``--constructed`` builds the hand-constructed pair of
   ``sglang_dspark.tiny_models`` in ``artifacts/tiny`` instead;
2. launches ``python -m sglang.launch_server --speculative-algorithm DSPARK
   --device cpu`` in compact ragged-verify mode. With no ``--sps-table`` our worker
   schedules verify budgets from its own online SPS profile (no offline profiling);
   ``--sps-table FILE`` gives SGLang a static table as well (the constructed pair uses
   the measured ``profiles/tiny-cpu-2core`` table);
3. runs the SGLang frontend program ``examples/frontend_program.py`` with several
   concurrent requests;
4. prints the outputs, SGLang's accept length and the verify budgets chosen;
5. says whether speculation paid: the same closed-loop workload (``--compare-requests``
   requests of ``--compare-tokens`` greedy tokens, all at once) on this server and on the
   target served without speculation, in ``--compare-rounds`` interleaved rounds (both
   servers up, the one not being measured paused: :meth:`SGLangServer.pause`), each
   round's tokens/s and ratio, the ratio of the medians and the share of the DSPARK
   server's decode steps that ran without drafting (no-draft steps,
   :mod:`sglang_dspark.no_draft`); then shuts the servers down.  One round of a few
   hundred tokens lasts under a second on a small host, so one round's ratio is mostly the
   host's noise; the rounds show its spread.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_dspark.server_process import SGLangServer, http_json
from sglang_dspark.tiny_models import TinySpec, ensure_pair

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = ROOT / "profiles" / "tiny-cpu-2core.sglang-sps-table.json"   # constructed pair
TRAINED = ROOT / "models" / "tiny-stdlib"


def _load_example():
    path = ROOT / "examples" / "frontend_program.py"
    spec = importlib.util.spec_from_file_location("frontend_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def summarize(info: dict) -> dict:
    st = info["internal_states"][0]
    rec = st.get("dspark_info_record") or {}
    rows = [r for r in rec.get("records", []) if r.get("budget") is not None]
    gamma = rec.get("gamma")
    fracs = [r["budget"] / (r["num_running_reqs"] * gamma) for r in rows if gamma]
    return {
        "worker": (rec.get("sglang_dspark") or {}).get("worker"),
        "mode": rec.get("mode"), "gamma": gamma,
        "avg_spec_accept_length (SGLang)": st.get("avg_spec_accept_length"),
        "mean_accept_length (plugin, incl. bonus)": (
            None if ((rec.get("sglang_dspark") or {}).get("telemetry") or {}).get(
                "mean_accepted_drafts") is None
            else round(rec["sglang_dspark"]["telemetry"]["mean_accepted_drafts"] + 1, 3)),
        "budgeted_steps": len(rows),
        "steps_below_full_budget": sum(1 for f in fracs if f < 1.0),
        "mean_budget_fraction": round(statistics.mean(fracs), 3) if fracs else None,
        "budget_by_running_requests": {
            n: round(statistics.mean(r["budget"] for r in rows if r["num_running_reqs"] == n), 2)
            for n in sorted({r["num_running_reqs"] for r in rows})},
    }


COMPARE_PROMPTS = ["import os\n", "def parse(", "class Config:\n", "for line in ", "with open(",
                   "try:\n    ", "def __init__(self", "return {"]


def closed_loop_tok_s(url: str, *, requests: int, tokens: int) -> float:
    """Output tokens/s of ``requests`` greedy requests of ``tokens`` tokens sent at once."""
    def one(i):
        r = http_json(url + "/generate", {"text": COMPARE_PROMPTS[i % len(COMPARE_PROMPTS)],
                                          "sampling_params": {"temperature": 0, "max_new_tokens": tokens,
                                                              "ignore_eos": True}}, timeout=600)
        return int(r["meta_info"]["completion_tokens"])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(requests) as ex:
        done = sum(ex.map(one, range(requests)))
    return done / (time.perf_counter() - t0)


def no_draft_share(info: dict) -> tuple[int, int]:
    """(no-draft steps, decode steps) of the DSPARK server so far."""
    st = ((info["internal_states"][0].get("dspark_info_record") or {}).get("sglang_dspark") or {})
    sources = st.get("budget_sources") or {}
    return int(sources.get("no_draft", 0)), int(sum(sources.values()))


def compare(spec: SGLangServer, target: str, *, requests: int, tokens: int, rounds: int) -> dict:
    """Did speculation pay?  The closed-loop workload on ``spec`` (running) and on ``target``
    served without speculation (started here, stopped at the end), ``rounds`` times each,
    interleaved (spec first in even rounds, plain first in odd ones, so the host's drift hits
    both alike), the server not being measured paused; prints each round and the verdict and
    returns the figures."""
    print(f"[demo] speculation vs none: {requests} requests x {tokens} tokens, {rounds} interleaved round(s) "
          "on this server and on the target alone (no speculation)...", flush=True)
    n0, s0 = no_draft_share(spec.server_info())
    spec.pause()        # the plain server starts alone
    plain = SGLangServer(model_path=target, draft_path=None, extra_args=["--max-running-requests", "16"])
    spec_tok_s, plain_tok_s = [], []
    try:
        plain.start()
        plain.pause()
        for r in range(rounds):
            for srv, out in ((spec, spec_tok_s), (plain, plain_tok_s))[::1 if r % 2 == 0 else -1]:
                with srv.running():
                    out.append(closed_loop_tok_s(srv.url, requests=requests, tokens=tokens))
            print(f"[demo]   round {r + 1}: DSPARK {spec_tok_s[-1]:.1f} tok/s, no speculation "
                  f"{plain_tok_s[-1]:.1f} tok/s ({spec_tok_s[-1] / plain_tok_s[-1]:.2f}x)", flush=True)
    finally:
        plain.stop()
        spec.resume()
    n1, s1 = no_draft_share(spec.server_info())
    ratios = [a / b for a, b in zip(spec_tok_s, plain_tok_s)]
    med_spec, med_plain = statistics.median(spec_tok_s), statistics.median(plain_tok_s)
    steps, off = s1 - s0, n1 - n0
    spread = f" (rounds {min(ratios):.2f}-{max(ratios):.2f}x)" if rounds > 1 else ""
    print(f"[demo] did speculation pay? DSPARK {med_spec:.1f} tok/s, no speculation {med_plain:.1f} tok/s"
          f"{' (medians)' if rounds > 1 else ''}: {med_spec / med_plain:.2f}x{spread}; {off} of {steps} decode "
          "steps ran without drafting" + (f" ({off / steps:.0%})" if steps else ""), flush=True)
    return {"spec_tok_s": spec_tok_s, "plain_tok_s": plain_tok_s, "ratio": med_spec / med_plain,
            "no_draft_steps": off, "decode_steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_dspark.demo")
    ap.add_argument("--models", default=None,
                    help="a directory with target/ and draft/ (default: models/tiny-stdlib, or "
                         "artifacts/tiny with --constructed)")
    ap.add_argument("--constructed", action="store_true",
                    help="the hand-constructed pair of sglang_dspark.tiny_models (built if missing)")
    ap.add_argument("--sps-table", default=None,
                    help="an SGLang SPS table for the server (default: none, our online profile; "
                         "with --constructed: profiles/tiny-cpu-2core.sglang-sps-table.json)")
    ap.add_argument("--mode", default="compact", choices=["static", "cap-accept", "compact"])
    ap.add_argument("--compare-requests", type=int, default=8,
                    help="concurrent requests of the speculation-vs-none comparison (0: skip it)")
    ap.add_argument("--compare-tokens", type=int, default=64, help="greedy tokens per comparison request")
    ap.add_argument("--compare-rounds", type=int, default=5,
                    help="interleaved rounds of the comparison (each runs the workload once per server)")
    args = ap.parse_args(argv)
    if args.compare_requests < 0 or args.compare_tokens < 1 or args.compare_rounds < 1:
        ap.error(f"--compare-requests must be >= 0 (got {args.compare_requests}), --compare-tokens >= 1 "
                 f"(got {args.compare_tokens}) and --compare-rounds >= 1 (got {args.compare_rounds})")

    if args.constructed:
        models = Path(args.models or ROOT / "artifacts" / "tiny")
        print(f"[demo] building the constructed tiny models in {models} (no downloads)...", flush=True)
        manifest = ensure_pair(models, TinySpec())
        print(f"[demo] draft Markov rows correct: {manifest['draft_row_accuracy']:.0%}", flush=True)
        table = args.sps_table or str(DEFAULT_TABLE)
    else:
        models = Path(args.models or TRAINED)
        missing = [d for d in ("target", "draft") if not (models / d / "config.json").is_file()]
        if missing:
            print(f"[demo] ERROR: {models} has no {' or '.join(missing)}/ model; rebuild the trained pair with "
                  f"`python -m sglang_dspark.train tiny-pair --out artifacts/trained` and pass "
                  f"--models with target/ and draft/ (draft-dspark), or run with --constructed", file=sys.stderr)
            return 2
        print(f"[demo] trained tiny pair from {models} (see its README.md)", flush=True)
        table = args.sps_table
    extra = ["--max-running-requests", "16"]
    if args.mode != "static" and table:
        extra += ["--speculative-dspark-sps-table-path", table]
    srv = SGLangServer(model_path=f"{models}/target", draft_path=f"{models}/draft",
                       env={"SGLANG_RAGGED_VERIFY_MODE": args.mode,
                            "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"},
                       extra_args=extra)
    print("[demo] launching:", " ".join(srv.command()[1:]), flush=True)
    with srv:
        print(f"[demo] server up at {srv.url}; running examples/frontend_program.py", flush=True)
        _load_example().main(["--url", srv.url])
        stats = summarize(srv.server_info())
        print("[demo] SGLang DSpark statistics:")
        for k, v in stats.items():
            print(f"    {k}: {v}")
        if stats["worker"] != "sglang_dspark.worker.DSparkControlledWorker":
            print(f"[demo] ERROR: the sglang-dspark worker was not active (SGLang ran {stats['worker']!r}); "
                  f"see the server log {srv.log_path}", file=sys.stderr)
            return 1
        if args.compare_requests:
            compare(srv, f"{models}/target", requests=args.compare_requests, tokens=args.compare_tokens,
                    rounds=args.compare_rounds)
    print("[demo] servers shut down cleanly.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
