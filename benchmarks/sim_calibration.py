"""Calibration check of the fleet simulator against the measured CPU benchmark.

    # 1. measure the simulator's inputs on the CPU bench pair (one server, < 3 minutes):
    python benchmarks/sim_calibration.py measure
    # 2. compare the simulation with benchmarks/worker_bench.py's measured results:
    python benchmarks/sim_calibration.py compare [--bench benchmarks/results/worker_bench.json]

``measure`` serves the "bench" tiny pair (``artifacts/bench``, built if missing) with
DSPARK in compact mode and SGLang's per-step records (``SGLANG_DSPARK_ENABLE_SPS_RECORD``),
pins verify-budget fractions 1, 0.75, 0.5, 0.25 and 0 at concurrency 1, 4, 16, 32 (the
benchmark's levels; several fractions per level give the profile overlapping batch sizes
across request counts, so per-request and per-token costs separate), and writes

* ``benchmarks/results/sim_calibration_profile.json``: a DSpark profile fitted to the
  measured ``(R, B, step seconds)`` of every decode step (the loop period as SGLang's
  records time it: draft + verify + scheduling);
* ``benchmarks/results/sim_calibration_trace.json``: per request and step, the accepted
  draft tokens under full verification (captured from the worker's telemetry by the
  project's controller, run in-process) with confidence rows synthesised from how the tiny
  drafter is built (SGLang's per-request debug dump fails on CPU), plus the measured prompt
  length, per-request fixed latency, the no-speculation step time per running-request
  count (a second server, ``--nospec``: wall times of short and long outputs, differenced,
  since SGLang keeps per-step records only for DSpark) and the verify-all step time
  in SGLang's static mode (records of a third server, ``--static``; static steps skip the
  ragged layout and cost less than compact steps at the same budget on this CPU).

``compare`` builds the matching scenario (same concurrency levels, the benchmark's requests
per user, warm-up pass, colocated prefill, ``--max-running-requests 32``), simulates every
configuration present in the benchmark JSON (nospec, verify_all, upstream, online,
controller) through the simulator's production-code policies, and prints/writes the
measured vs simulated output tokens/s per level (``benchmarks/results/sim_calibration.md``
and ``.json``). Target: within 15%.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ZERO_FRAC = 1e-6
PROMPT = "def task_{i}(data):"          # benchmarks/worker_bench.py's prompts


# ------------------------------------------------------------------ measure
def _server_info(srv, tries: int = 5) -> dict:
    """``/server_info`` with retries (it queries the scheduler and can time out under load)."""
    for i in range(tries):
        try:
            return srv.server_info()
        except Exception:
            if i == tries - 1:
                raise
            time.sleep(2.0)
    return {}


def _records(srv) -> Optional[list[dict]]:
    """SGLang's per-step records, or None when ``/server_info`` fails (see the note in measure)."""
    try:
        info = _server_info(srv, tries=3)
    except Exception:
        return None
    states = info.get("internal_states") or [{}]
    return list((states[0].get("dspark_info_record") or {}).get("records") or [])


def _run(url: str, n: int, concurrency: int, max_new: int, offset: int) -> list[dict]:
    from sglang_dspark.server_process import http_json

    def one(i):
        t0 = time.perf_counter()
        r = http_json(url + "/generate", {"text": PROMPT.format(i=offset + i), "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=600)
        return {"latency_s": time.perf_counter() - t0, "tokens": r["meta_info"]["completion_tokens"],
                "prompt_tokens": r["meta_info"].get("prompt_tokens")}

    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, range(n)))


def _decode_log_step_times(log_text: str) -> dict[int, float]:
    """SGLang's periodic 'Decode batch' lines -> median seconds per step per running-request count."""
    by: dict[int, list[float]] = {}
    for m in re.finditer(r"#running-req: (\d+).*?gen throughput \(token/s\): ([0-9.]+)", log_text):
        r, thr = int(m.group(1)), float(m.group(2))
        if thr > 0:
            by.setdefault(r, []).append(r / thr)
    return {r: statistics.median(v) for r, v in by.items()}


def _differenced_step_times(url: str, levels: list[int], *, short: int = 8, long: int = 72,
                            reps: int = 3, offset: int = 20_000) -> dict[int, float]:
    """Seconds per decode step at each running-request count, from wall times: ``c``
    concurrent requests of ``long`` and of ``short`` output tokens (same prompts shape,
    so prefill and fixed costs cancel in the difference), repeated ``reps`` times
    interleaved; median(long) - median(short) over (long - short) steps.  For servers that
    keep no per-step records (no speculation)."""
    out: dict[int, float] = {}
    for c in levels:
        walls: dict[int, list[float]] = {short: [], long: []}
        for rep in range(reps):
            for n_tok in (short, long):
                t0 = time.perf_counter()
                _run(url, c, c, n_tok, offset)
                walls[n_tok].append(time.perf_counter() - t0)
                offset += c
        out[c] = max(statistics.median(walls[long]) - statistics.median(walls[short]), 0.0) / (long - short)
        print(f"nospec c={c}: {1000 * out[c]:.1f} ms per step (length differencing, {reps} reps)",
              file=sys.stderr)
    return out


def _capture_controller(work: Path):
    """The project's controller in-process, recording every step's accepted draft lengths.

    (SGLang's per-request debug dump, ``SGLANG_DSPARK_DEBUG_DUMP=reqs``, needs a device stream
    and fails on CPU; the worker's telemetry to the controller carries the accepted lengths.)
    """
    import threading

    from dspark_controller.service.protocol import PolicySpec
    from dspark_controller.service.server import Controller, ControllerConfig
    from sglang_dspark.server_process import free_port

    port = free_port()
    cfg = ControllerConfig(bind=f"tcp://127.0.0.1:{port}", pub_bind=f"ipc://{work}/pub",
                           cli_bind=f"ipc://{work}/cli", profiles_dir=None, policy=PolicySpec(mode="off"),
                           max_learn_steps_per_s=0)
    ctrl = Controller(config=cfg)
    steps: list = []
    orig = ctrl._on_step

    def on_step(eng, step, now):
        steps.append((step.num_running_requests, step.verify_tokens, list(step.accepted_lens or []),
                      step.budget_tokens, step.step_time_s))
        return orig(eng, step, now)

    ctrl._on_step = on_step
    th = threading.Thread(target=ctrl.run, daemon=True)
    th.start()
    if not ctrl.wait_ready(10):
        raise RuntimeError("the in-process controller did not start")
    return ctrl, th, steps, f"tcp://127.0.0.1:{port}"


def _synth_confidences(acc: list[int], gamma: int, hi: float, lo: float, row_acc: float, seed: int = 0):
    """Confidence rows for measured accepted lengths, following how the tiny drafter is built
    (``sglang_dspark.tiny_models``): its confidence head outputs ``confidence_hi`` for
    bigram rows its Markov head encodes and ``confidence_lo`` for the rows it gets wrong
    (and flags). Accepted positions had right rows (hi), the first rejected one a wrong row
    (lo), positions after it are right with probability ``draft_row_accuracy``."""
    import random

    rng = random.Random(seed)
    rows = []
    for a in acc:
        row = [hi] * min(a, gamma)
        if a < gamma:
            row.append(lo)
            row += [hi if rng.random() < row_acc else lo for _ in range(gamma - a - 1)]
        rows.append(row)
    return rows


def _fresh_steps(records: list[dict]):
    """SGLang per-step records, in step order -> ``(R, B, loop seconds)`` of every decode step
    whose period holds no prefill (the running count did not grow since the previous record)."""
    prev_r = None
    for x in records:
        R, B, ms = x.get("num_running_reqs"), x.get("num_verify_tokens"), x.get("step_cpu_ms")
        fresh = prev_r is not None and R is not None and R <= prev_r
        prev_r = R
        if ms and R and B and B >= R and fresh:
            yield int(R), int(B), float(ms) / 1000.0


def _measure_static(m: Path, levels: list[int], max_new: int) -> dict[int, float]:
    """Median loop seconds per step of DSPARK verify-all in SGLang's static mode (what the
    benchmark's ``verify_all`` row runs), per running-request count, from SGLang's records."""
    from sglang_dspark.server_process import SGLangServer

    env = {"SGLANG_RAGGED_VERIFY_MODE": "static", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1",
           "SGLANG_DSPARK_LOG_INTERVAL_S": "0"}
    srv = SGLangServer(model_path=str(m / "target"), draft_path=str(m / "draft"), env=env,
                       extra_args=["--max-running-requests", str(max(levels))])
    out: dict[int, float] = {}
    with srv:
        _run(srv.url, 8, 8, max_new, 30_000)                                   # warm-up
        for c in levels:
            before = _records(srv) or []
            wm = max((int(x.get("forward_ct", -1)) for x in before), default=-1)
            _run(srv.url, c * (3 if c == 1 else 1), c, max_new, 31_000 + 100 * c)
            time.sleep(0.3)
            new = sorted((x for x in (_records(srv) or []) if int(x.get("forward_ct", -1)) > wm),
                         key=lambda x: int(x["forward_ct"]))
            per = [t for (R, _B, t) in _fresh_steps(new) if R == c]
            if per:
                out[c] = statistics.median(per)
            print(f"static c={c}: {len(per or [])} steps, median {1000 * out.get(c, float('nan')):.1f} ms",
                  file=sys.stderr)
    return out


def measure(args) -> int:
    import signal
    import tempfile

    # a SIGTERM (e.g. from `timeout`) must still stop the server child (its own session)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from sglang_dspark.server_process import SGLangServer, http_json
    from sglang_dspark.tiny_models import PRESETS, ensure_pair

    t_begin = time.monotonic()
    m = Path(args.models)
    ensure_pair(m, PRESETS["bench"])
    manifest = json.loads((m / "manifest.json").read_text())
    levels = [int(x) for x in args.levels.split(",")]
    fracs = [float(x) for x in args.fractions.split(",")]
    work = Path(tempfile.mkdtemp(prefix="dspark-simcal-"))
    ctrl, th, tele, addr = _capture_controller(work)
    env = {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1",
           "SGLANG_DSPARK_LOG_INTERVAL_S": "0", "SGLANG_DSPARK_CONTROLLER": addr}
    srv = SGLangServer(model_path=str(m / "target"), draft_path=str(m / "draft"), env=env,
                       extra_args=["--max-running-requests", str(max(levels))])
    samples: list[list[float]] = []
    trace_acc: list[int] = []
    lat1: list[dict] = []
    gamma = None
    offset = 0
    time_source: dict = {}
    try:
        with srv:
            print(f"server up after {time.monotonic() - t_begin:.0f}s", file=sys.stderr)
            _run(srv.url, 8, 8, args.max_new_tokens, 10_000)                 # warm-up, as worker_bench
            for c in levels:
                for frac in fracs:
                    if time.monotonic() - t_begin > args.max_time:
                        print("time budget reached; stopping the sweep", file=sys.stderr)
                        break
                    http_json(srv.url + "/set_internal_state",
                              {"server_args": {"dspark_force_budget_frac": ZERO_FRAC if frac <= 0 else frac}})
                    before = _records(srv)
                    wm = max((int(x.get("forward_ct", -1)) for x in before or []), default=-1)
                    n0 = len(tele)
                    n = c * (3 if c == 1 else 1)
                    res = _run(srv.url, n, c, args.max_new_tokens, offset)
                    offset += n
                    time.sleep(0.3)                                         # telemetry in flight
                    after = _records(srv) if before is not None else None
                    if after is None:
                        # /server_info failed: the worker's own step clock (forward only, no scheduler
                        # overhead) from its telemetry instead
                        time_source["telemetry"] = time_source.get("telemetry", 0) + 1
                        new = [{"num_running_reqs": R, "num_verify_tokens": B, "step_cpu_ms": 1000 * t}
                               for (R, B, _a, _b, t) in tele[n0:]]
                    else:
                        time_source["sglang_records"] = time_source.get("sglang_records", 0) + 1
                        new = sorted((x for x in after if int(x.get("forward_ct", -1)) > wm),
                                     key=lambda x: int(x["forward_ct"]))
                    level_samples = [[R, B, t] for (R, B, t) in _fresh_steps(new)]
                    samples += level_samples
                    if frac >= 1.0:
                        for (R, B, acc, budget, _t) in tele[n0:]:
                            trace_acc.extend(int(a) for a in acc)
                    if c == 1 and frac == fracs[0]:
                        per = [s_[2] for s_ in level_samples if s_[0] == 1]
                        lat1 = [dict(r, records=len(new) / max(1, n),
                                     median_step_s=statistics.median(per) if per else None) for r in res]
                    print(f"c={c} frac {frac:g}: {len(new)} steps, {len(samples)} samples, {len(trace_acc)} "
                          f"accepted lengths ({time.monotonic() - t_begin:.0f}s)", file=sys.stderr)
            log_text = Path(srv.log_path).read_text(errors="replace")
    finally:
        ctrl.request_stop()
        th.join(timeout=5)
    if gamma is None:
        mm = re.search(r"gamma=(\d+), verify_num_draft_tokens", log_text)
        gamma = int(mm.group(1)) if mm else max(trace_acc or [3])
    gamma = int(gamma)
    nospec = {}
    if args.nospec and time.monotonic() - t_begin < args.max_time + 60:
        ns = SGLangServer(model_path=str(m / "target"), env={"SGLANG_DSPARK_LOG_INTERVAL_S": "0"},
                          extra_args=["--max-running-requests", str(max(levels))])
        with ns:
            _run(ns.url, 8, 8, args.max_new_tokens, 19_000)                 # warm-up
            nospec = _differenced_step_times(ns.url, levels, long=8 + args.max_new_tokens)
    static = {}
    if args.static and time.monotonic() - t_begin < args.max_time + 120:
        static = _measure_static(m, levels, args.max_new_tokens)
    spec_log = _decode_log_step_times(log_text)
    fixed = [r["latency_s"] - r["records"] * r["median_step_s"] for r in lat1 if r.get("median_step_s")]
    from dspark_controller.core.profile_file import EngineFingerprint, save_profile
    from dspark_controller.profiling.tools import build_profile

    fp = EngineFingerprint(target_model=str(m / "target"), draft_model=str(m / "draft"), gamma=gamma,
                           device_name="cpu:sim-calibration", dtype="float32")
    pf, model, err = build_profile(samples, fingerprint=fp, command="python " + " ".join(sys.argv), heldout_frac=0.1)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_profile(out / "sim_calibration_profile.json", pf)
    spec = manifest.get("spec", {})
    hi, lo = float(spec.get("confidence_hi", 0.92)), float(spec.get("confidence_lo", 0.08))
    row_acc = float(manifest.get("draft_row_accuracy", 0.73))
    trace_acc = [min(a, gamma) for a in trace_acc]
    conf = _synth_confidences(trace_acc, gamma, hi, lo, row_acc)
    ptoks = [r.get("prompt_tokens") for r in lat1 if r.get("prompt_tokens")]
    reach = [sum(1 for a in trace_acc if a >= j - 1) for j in range(1, gamma + 1)]
    succ = [sum(1 for a in trace_acc if a >= j) for j in range(1, gamma + 1)]
    meta = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"), "gamma": gamma,
            "levels": levels, "fractions": fracs, "samples": len(samples), "profile_heldout_mape": err.mape,
            "trace_rows": len(trace_acc), "step_time_source_cells": time_source,
            "acceptance_per_position": [round(s_ / r, 4) if r else None for s_, r in zip(succ, reach)],
            "tau_full_verify": round(1 + sum(trace_acc) / max(1, len(trace_acc)), 4),
            "confidences": f"synthesised from the tiny drafter's construction (hi={hi}, lo={lo}, "
                           f"row accuracy={row_acc:.3f}); SGLang's per-request dump fails on CPU",
            "prompt_tokens": statistics.median(ptoks) if ptoks else None,
            "fixed_latency_s_at_c1": statistics.median(fixed) if fixed else None,
            "latencies_c1": lat1, "nospec_step_s": nospec, "static_step_s": static,
            "nospec_step_source": "wall-time differencing of 8- and %d-token outputs" % (8 + args.max_new_tokens),
            "dspark_decode_log_step_s": spec_log,
            "elapsed_s": round(time.monotonic() - t_begin, 1)}
    (out / "sim_calibration_trace.json").write_text(json.dumps({"conf": conf, "acc": trace_acc, "meta": meta}))
    print(json.dumps({k: v for k, v in meta.items() if k not in ("latencies_c1",)}, indent=1))
    return 0


# ------------------------------------------------------------------ compare
def build_scenario(args, meta: dict, levels: list[int], requests_per_user: int = 2, warm_waves: int = 1):
    from dspark_controller.sim.simulate import LengthDist, Scenario, Workload

    gamma = int(meta.get("gamma") or 3)
    ptok = int(round(meta.get("prompt_tokens") or 8))
    nospec_frac = args.nospec_frac
    if nospec_frac is None:
        nospec_frac = _nospec_frac(meta, args.profile)
    fixed = float(meta.get("fixed_latency_s_at_c1") or 0.0)
    # the fixed latency at c = 1 holds the prefill (simulated on the engine) and what happens
    # outside the engine (HTTP, tokenisation): the latter is the per-request overhead
    from dspark_controller.profiling.tools import load_any

    prefill = args.prefill_frac * float(load_any(args.profile).model.predict_step_time(1, ptok))
    return Scenario(
        name="cpu-bench-calibration", gamma=gamma, engines=1, max_running=max(levels),
        cost=dict({"kind": "profile", "path": args.profile, "nospec_frac": nospec_frac,
                   "prefill_frac": args.prefill_frac},
                  **({"nospec_step_s": meta["nospec_step_s"]} if meta.get("nospec_step_s") and args.tables else {}),
                  **({"static_step_s": meta["static_step_s"]} if meta.get("static_step_s") and args.tables else {})),
        workload=Workload(prompt=LengthDist("fixed", value=ptok), output=LengthDist("fixed", value=args.max_new_tokens),
                          requests_per_user=requests_per_user,
                          request_overhead_s=max(0.0, (fixed - prefill) * args.overhead_share)),
        domains=[{"name": "bench-trace", "trace": args.trace}], prefill="colocated", levels=levels,
        # the benchmark's warm-up: ``warm_waves`` ramps of one request per user at each level
        warmup_level=list(levels) * max(0, int(warm_waves)), warmup_requests_per_user=1,
        step_noise=args.step_noise, sla_floor=None, anchors=[], controller_explore=0.0,
        full_budget_static=True,   # our worker's SGLANG_DSPARK_FULL_BUDGET_STATIC default on CPU
        upstream_table=(args.upstream_table if args.upstream_table and Path(args.upstream_table).is_file()
                        else "static-probe"), seed=args.seed,
        description="CPU bench pair (benchmarks/worker_bench.py) from a measured profile and acceptance trace")


def _nospec_frac(meta: dict, profile: str) -> float:
    """No-speculation step time / DSpark step time at B = R, from the measured decode logs."""
    ns = {int(k): v for k, v in (meta.get("nospec_step_s") or {}).items()}
    if not ns:
        return 0.8
    from dspark_controller.profiling.tools import load_any

    model = load_any(profile).model
    ratios = [v / float(model.predict_step_time(r, r)) for r, v in ns.items() if r >= 1]
    return float(statistics.median(ratios)) if ratios else 0.8


def compare(args) -> int:
    from dspark_controller.sim.simulate import run_frontier

    bench_path = Path(args.bench)
    if not bench_path.is_file():
        print(f"no benchmark results at {bench_path}; run: python benchmarks/worker_bench.py --json {bench_path}",
              file=sys.stderr)
        return 1
    for p in (args.profile, args.trace):
        if not Path(p).is_file():
            print(f"missing {p}; run: python benchmarks/sim_calibration.py measure", file=sys.stderr)
            return 1
    raw = json.loads(bench_path.read_text())
    bench = raw.get("results", raw)           # worker_bench.py >= 2 nests results beside its meta
    bmeta = raw.get("meta", {})
    if bmeta.get("max_new_tokens"):
        args.max_new_tokens = int(bmeta["max_new_tokens"])
    meta = json.loads(Path(args.trace).read_text()).get("meta", {})
    configs = [c for c in ("nospec", "verify_all", "upstream", "online", "controller") if c in bench]
    levels = sorted({int(k) for c in configs for k in bench[c] if str(k).isdigit()})
    res = []
    for lv in levels:  # each level with the benchmark's own request count
        m0 = next(bench[c].get(str(lv)) or bench[c].get(lv) for c in configs)
        sc = build_scenario(args, meta, levels, requests_per_user=max(1, int(m0.get("requests", 2 * lv)) // lv),
                            warm_waves=int(bmeta.get("warm_waves", 1)))
        res += run_frontier(sc, policies=configs, backend=args.budget_code, levels=[lv],
                            progress=(lambda s: print(s, file=sys.stderr)) if args.verbose else None)
    rows = []
    for r in res:
        m = bench[r.policy].get(str(int(r.level))) or bench[r.policy].get(int(r.level))
        if not m:
            continue
        err = r.throughput / m["tok_s"] - 1.0
        rows.append({"config": r.policy, "concurrency": int(r.level), "measured_tok_s": m["tok_s"],
                     "simulated_tok_s": r.throughput, "error": err,
                     "measured_tok_s_per_user": m.get("tok_s_per_user"), "simulated_tok_s_per_user": r.per_user_e2e,
                     "sim_budget_per_request": r.budget_per_request, "sim_tau": r.tau})
    within = sum(1 for x in rows if abs(x["error"]) <= 0.15)
    lines = [f"Simulated vs measured output tokens/s (benchmarks/worker_bench.py, {bench_path.name}); "
             f"{within}/{len(rows)} cells within 15%.", "",
             "| config | concurrency | measured tok/s | simulated tok/s | error | measured tok/s/user | "
             "simulated tok/s/user | sim budget/req | sim tau |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in rows:
        lines.append(f"| {x['config']} | {x['concurrency']} | {x['measured_tok_s']:.1f} | {x['simulated_tok_s']:.1f} | "
                     f"{100 * x['error']:+.1f}% | {x['measured_tok_s_per_user'] or 0:.1f} | "
                     f"{x['simulated_tok_s_per_user']:.1f} | {x['sim_budget_per_request']:.2f} | {x['sim_tau']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_calibration.md").write_text(text)
    (out / "sim_calibration.json").write_text(json.dumps({
        "rows": rows, "within_15pct": within, "cells": len(rows), "scenario": sc.to_dict(),
        "budget_code": args.budget_code, "bench": str(bench_path)}, indent=1))
    return 0 if rows and within == len(rows) else 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    me = sub.add_parser("measure", help="measure profile + acceptance trace on the CPU bench pair")
    me.add_argument("--models", default=str(ROOT / "artifacts" / "bench"))
    me.add_argument("--levels", default="1,4,16,32")
    me.add_argument("--fractions", default="1,0.75,0.5,0.25,0",
                    help="pinned budget fractions per level; several per level let the profile separate "
                         "the per-request and per-token costs")
    me.add_argument("--max-new-tokens", type=int, default=64, help="as worker_bench.py (acceptance varies "
                                                                   "along the output on the tiny pair)")
    me.add_argument("--max-time", type=float, default=300.0,
                    help="start no new cell after this many seconds (incl. server start-up)")
    me.add_argument("--nospec", action=argparse.BooleanOptionalAction, default=True,
                    help="also time no-speculation decode steps (a second, short server)")
    me.add_argument("--static", action=argparse.BooleanOptionalAction, default=True,
                    help="also time verify-all steps in SGLang's static mode (a third, short server)")
    me.add_argument("--out-dir", default=str(RESULTS))
    me.set_defaults(func=measure)
    co = sub.add_parser("compare", help="simulate the benchmark's configurations and compare")
    co.add_argument("--bench", default=str(RESULTS / "worker_bench.json"))
    co.add_argument("--profile", default=str(RESULTS / "sim_calibration_profile.json"))
    co.add_argument("--trace", default=str(RESULTS / "sim_calibration_trace.json"))
    co.add_argument("--upstream-table", default=str(RESULTS / "bench-upstream-sps-table.json"),
                    help="the SpsCostTable the benchmark's 'upstream' config used (default: the file "
                         "worker_bench.py was given; missing: derived from the profile in static mode)")
    co.add_argument("--max-new-tokens", type=int, default=48)
    co.add_argument("--nospec-frac", type=float, default=None,
                    help="no-speculation step / DSpark step at B = R (default: from the measured decode logs)")
    co.add_argument("--prefill-frac", type=float, default=1.0)
    co.add_argument("--overhead-share", type=float, default=1.0,
                    help="share of the measured fixed per-request latency spent outside the engine")
    co.add_argument("--tables", action=argparse.BooleanOptionalAction, default=True,
                    help="use the measured per-R step times of no-speculation and static verify-all "
                         "(--no-tables: derive both from the DSpark profile, as before)")
    co.add_argument("--step-noise", type=float, default=0.05)
    co.add_argument("--budget-code", default="auto", choices=("auto", "worker", "planner"))
    co.add_argument("--seed", type=int, default=0)
    co.add_argument("--out-dir", default=str(RESULTS))
    co.add_argument("--verbose", action="store_true")
    co.set_defaults(func=compare)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
