#!/usr/bin/env python3
"""The host-only parts of ``benchmarks/run_gpu_bench.sh`` (numpy, no torch, no SGLang).

``policy``: the budget policy's host cost per decode step at R = 1 .. 256 running
requests, and with R changing every step (``mixed``): the decision (``budget``) and the
step-time learning (``observe``) of the simulator's ``online`` policy
(:func:`dspark_controller.sim.policies.make_policy`),
which runs the worker's own policy object, :class:`dspark_controller.core.policy.BudgetPolicy`
(numpy only: the same code with or without SGLang; survival calibration and admission
gain included), and :class:`SpsModel` learning.  Not timed: what only the worker does
around it (SGLang's lagged-survival relay and its copy to numpy, telemetry to a
controller).

``summary A.json B.json ...``: one table from the result files of
``gpu_kernel_bench.py`` (check and timing runs) and of ``policy``; exit status 1 when
a file is missing or anything failed.

    python benchmarks/gpu_bench_host.py policy [--smoke] [--json OUT]
    python benchmarks/gpu_bench_host.py summary check.json bench.json policy.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
for _path in (_REPO / "controller", _REPO):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------------
# the policy's host cost per step
# ---------------------------------------------------------------------------


def policy_host_cost(args) -> dict:
    """Per-step host seconds of the budget policy at each R (see the module docstring).

    Each R gets a fresh ``online`` policy, ``--policy-warmup`` untimed steps (the profile
    becomes ready, exploration settles from its young rate) and ``--policy-steps`` timed
    ones; a last row, ``mixed``, has R wander by up to 4 requests a step over 1 .. the
    largest R, as a serving batch does (a refit then fits dozens of R rows, not one).
    Lagged survival rows come from random confidences in [0.4, 1); the step time is a
    synthetic ``5 ms + 20 us per verified token`` with 5% noise."""
    import numpy as np

    from dspark_controller.sim.policies import make_policy, resolve_backend

    backend = resolve_backend(args.policy_backend)
    brain_name = "BudgetPolicy (dspark_controller.core.policy)"
    gamma = int(args.policy_gamma)
    rows = []

    def true_sps(b):
        return 1.0 / (0.005 + 2e-5 * np.asarray(b, dtype=np.float64))

    top = max(args.policy_rs)
    for R0 in [*args.policy_rs, "mixed"]:
        mixed = R0 == "mixed"      # as in serving: the batch changes every step, over many rows
        seed = 0 if mixed else R0
        pol = make_policy("online", backend=backend, gamma=gamma, engine_idx=0, shared={},
                          upstream_table=None, max_running=top, seed=seed,
                          sla_floor=None, controller_explore=0.0)
        rng = np.random.default_rng(seed)
        now = 0.0
        decide, learn = [], []
        R = top // 2 if mixed else R0
        for i in range(args.policy_warmup + args.policy_steps):
            if mixed:
                R = int(min(max(R + rng.integers(-4, 5), 1), top))
            surv = np.cumprod(rng.uniform(0.4, 1.0, size=(R, gamma)).astype(np.float32), axis=1)
            t0 = time.perf_counter()
            k = pol.budget(now=now, R=R, gamma=gamma, lagged_survival=surv, true_sps=true_sps)
            t1 = time.perf_counter()
            full = R * gamma
            K = full if k is None else max(0, min(int(k), full))
            lengths = np.full(R, K // R, dtype=np.int64)
            lengths[: K % R] += 1
            accepted = np.minimum(lengths, rng.integers(0, gamma + 1, size=R))
            dt = (0.005 + 2e-5 * (R + K)) * float(rng.lognormal(0.0, 0.05))
            now += dt
            t2 = time.perf_counter()
            pol.observe(now=now, R=R, B=R + K, t=dt, accepted=accepted, lengths=lengths)
            t3 = time.perf_counter()
            if i >= args.policy_warmup:
                decide.append(t1 - t0)
                learn.append(t3 - t2)
        d_us, l_us = np.asarray(decide) * 1e6, np.asarray(learn) * 1e6
        tot = d_us + l_us
        state = pol.state()
        row = {"R": R0, "steps": len(decide),
               "decide_us_p50": float(np.median(d_us)), "decide_us_p90": float(np.percentile(d_us, 90)),
               "learn_us_p50": float(np.median(l_us)), "learn_us_p90": float(np.percentile(l_us, 90)),
               "total_us_p50": float(np.median(tot)), "total_us_p99": float(np.percentile(tot, 99)),
               "total_us_max": float(tot.max()), "total_us_mean": float(tot.mean()),
               "sources": dict(state.get("sources", {})), "model_ready": state.get("model_ready")}
        rows.append(row)
        print(f"{R0:>4} {row['decide_us_p50']:>10.1f} {row['decide_us_p90']:>10.1f} {row['learn_us_p50']:>9.1f} "
              f"{row['learn_us_p90']:>9.1f} {row['total_us_p50']:>9.1f} {row['total_us_p99']:>9.1f} "
              f"{row['total_us_max']:>9.1f}  {row['sources']}", flush=True)
    return {"brain": brain_name, "backend": backend.name, "gamma": gamma, "rows": rows}


# ---------------------------------------------------------------------------
# one summary table from the result files
# ---------------------------------------------------------------------------


def _status(value) -> str:
    text = json.dumps(value, default=str)
    return "FAIL" if "FAIL" in text else ("skipped" if "skipped" in text else "PASS")


def summary_rows(results: list[dict]) -> list[tuple[str, str, str]]:
    """(section, case, value) rows for :func:`print_summary`."""
    rows = []
    for res in results:
        if "missing" in res:
            rows.append(("run", res["missing"], "no result file (timed out or failed)"))
            continue
        kind = res.get("kind")
        if res.get("graph_check") is not None:
            gc = res["graph_check"]
            if "skipped" in gc:
                rows.append(("graph", "CUDA-graph capture/replay", f"skipped ({gc['skipped']})"))
            else:
                rows.append(("graph", "available SMs", str(gc.get("available_sms"))))
                for label, value in gc.items():
                    if label not in ("available_sms", "plan_b16"):
                        rows.append(("graph", label, str(value)))
        if res.get("capture_check") is not None:
            cc = res["capture_check"]
            rows.append(("capture", "non-blocking device copy",
                         f"skipped ({cc['skipped']})" if "skipped" in cc else
                         f"{cc['result']} (observe {cc['observe_ms']} ms, device busy meanwhile: "
                         f"{cc['returned_while_device_busy']})"))
        configs = res.get("configs") or []
        if configs:
            bad = [c for c in configs if not all(v.get("ok") for v in c["checks"].values())]
            rows.append(("tokens", f"{kind or 'sweep'}: {len(configs)} configs vs torch reference",
                         "PASS" if not bad else f"FAIL ({len(bad)} configs)"))
        for c in configs:
            if "ms" not in c:
                continue
            ms = c["ms"]
            cells = " ".join(f"{n}={v:.4f}" for n, v in ms.items())
            rows.append(("kernel ms", f"B={c['batch']} g={c['gamma']} V={c['vocab']} {c['mode']}",
                         f"{cells} perstep/fused={c.get('ratio_perstep_over_fused', float('nan')):.2f}"))
        if res.get("truncated"):
            rows.append(("kernel ms", "time budget", "reached; later configs skipped"))
        if kind == "policy":
            for r in res["rows"]:
                rows.append(("policy us", f"R={r['R']} ({res['brain']})",
                             f"p50 {r['total_us_p50']:.1f} (decide {r['decide_us_p50']:.1f} + learn "
                             f"{r['learn_us_p50']:.1f}), p99 {r['total_us_p99']:.1f}, max {r['total_us_max']:.1f}"))
    return rows


def print_summary(paths: list[str]) -> int:
    results = []
    for path in paths:
        try:
            results.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            results.append({"missing": path})
    rows = summary_rows(results)
    w0 = max([len(r[0]) for r in rows] + [7])
    w1 = max([len(r[1]) for r in rows] + [4])
    print("== summary ==")
    print(f"{'section':<{w0}}  {'case':<{w1}}  value")
    for section, case, value in rows:
        print(f"{section:<{w0}}  {case:<{w1}}  {value}")
    failed = any("missing" in r for r in results) or any(
        "FAIL" in value for _, _, value in rows)
    print("SUMMARY:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


def main_policy(args) -> int:
    started = time.monotonic()
    print(f"budget policy host cost per decode step, gamma {args.policy_gamma}, "
          f"{args.policy_steps} timed steps per R after {args.policy_warmup} untimed (microseconds)")
    print(f"{'R':>4} {'decide p50':>10} {'decide p90':>10} {'learn p50':>9} {'learn p90':>9} "
          f"{'total p50':>9} {'total p99':>9} {'total max':>9}  sources")
    results = {"kind": "policy", **policy_host_cost(args)}
    print(f"policy: {results['brain']}")
    print("RESULT: PASS", f"({time.monotonic() - started:.1f}s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pol = sub.add_parser("policy", help="the budget policy's host cost per step")
    pol.add_argument("--smoke", action="store_true", help="R = 1,4,16, few steps, no SGLang import")
    pol.add_argument("--rs", dest="policy_rs", type=_ints, default=None,
                     help="running requests R (default 1,2,4,...,256; smoke: 1,4,16)")
    pol.add_argument("--steps", dest="policy_steps", type=int, default=None,
                     help="timed steps per R (default 300; smoke: 20)")
    pol.add_argument("--warmup", dest="policy_warmup", type=int, default=None,
                     help="untimed steps per R first (default 300; smoke: 30)")
    pol.add_argument("--gamma", dest="policy_gamma", type=int, default=7)
    pol.add_argument("--backend", dest="policy_backend", choices=("auto", "planner", "worker"), default=None,
                     help="the simulator backend around the policy (the policy is the same in both; "
                          "worker imports SGLang for its top-K; default auto; smoke: planner)")
    pol.add_argument("--json", default=None, help="write results here")
    summ = sub.add_parser("summary", help="one table from result files")
    summ.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "policy":
        smoke = {"policy_rs": [1, 4, 16], "policy_steps": 20, "policy_warmup": 30, "policy_backend": "planner"}
        full = {"policy_rs": [1, 2, 4, 8, 16, 32, 64, 128, 256], "policy_steps": 300, "policy_warmup": 300,
                "policy_backend": "auto"}
        for name, value in (smoke if args.smoke else full).items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cmd == "summary":
        return print_summary(args.files)
    return main_policy(args)


if __name__ == "__main__":
    sys.exit(main())
