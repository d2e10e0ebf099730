"""Our profiler vs SGLang's ``python -m sglang.benchmark.dspark_sps_profiler`` on the CPU demo server.

    python benchmarks/profiler_compare.py [--json bench-out/profiler_compare.json]

The CPU demo server: the tiny pair, ``SGLANG_RAGGED_VERIFY_MODE=compact``,
``SGLANG_DSPARK_ENABLE_SPS_RECORD=1``, ``--max-running-requests 16``. In one run:

1. server A, exactly the demo server: upstream's profiler as shipped (``all --fracs 0.25
   0.5 0.75 1.0 --max-batch-size 16``). It refuses (it requires the server to run with
   ``SGLANG_SIMULATE_ACC_LEN=1.0``); the error is recorded.
2. server B, the demo server plus ``SGLANG_SIMULATE_ACC_LEN=1.0`` (upstream's requirement:
   every request advances exactly one token per step):
   a. held-out steps, first half: rounds at random (R in 1..16, budget fraction in [0, 1]),
      measured like the profiles (pinned fraction, steady steps at R);
   b. upstream as shipped again (its next blocker is recorded: random prompts need a
      vocabulary of more than 2000 tokens, the tiny one has 496);
   c. upstream with only its random-prompt token range moved into the vocabulary (a module
      constant patched in-process, nothing else): wall time to its table;
   d. ``dspark-controller profile --url ...`` with default settings: wall time to the profile;
   e. held-out steps, second half (slow drift of the shared machine hits both alike).

Prediction error of step time on the held-out steps: per step (MAPE, median, p90, bias)
and per held-out cell (the median step time of each (R, B) cell, which removes most of
the per-step noise), next to the noise floor (each step predicted by its own cell's
median). A profile is *usable* if SGLang's loader reads it and it predicts positive step
times for every R in 1..16 and B in [R, 5R].
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_ARGS = ["all", "--fracs", "0.25", "0.5", "0.75", "1.0", "--max-batch-size", "16"]
# The only change to upstream's profiler: draw random prompt tokens inside the tiny 496-token
# vocabulary (it draws from [1000, vocab - 1000)).
SHIM = """
import sys
import sglang.benchmark.dspark_sps_profiler as up
up.RANDOM_TOKEN_LOW = 10
up.RANDOM_TOKEN_HIGH_MARGIN = 10
sys.argv = ["dspark_sps_profiler"] + sys.argv[1:]
up.cli_main()
"""


def errors(pred: np.ndarray, t: np.ndarray) -> dict:
    rel = (pred - t) / t
    a = np.abs(rel)
    return {"n": int(t.size), "mape": float(a.mean()), "median_ape": float(np.median(a)),
            "p90_ape": float(np.quantile(a, 0.9)), "bias": float(np.median(rel))}


LOADS: dict = {}


def note_load(stage: str) -> None:
    """The machine's 1-minute load average at each stage (other jobs on a shared box skew timings)."""
    LOADS[stage] = round(os.getloadavg()[0], 2)


def run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float, str]:
    note_load("before " + Path(log).stem)
    t0 = time.monotonic()
    with open(log, "w") as f:
        try:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=str(ROOT))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    wall = time.monotonic() - t0
    note_load("after " + Path(log).stem)
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip() and "Warning" not in x
             and "warnings.warn" not in x]
    errs = [x for x in lines if x.startswith(("ValueError", "RuntimeError", "error:", "requests.exceptions"))]
    return rc, wall, errs[-1] if rc and errs else "\n".join(lines[-3:])


def warm_up(url: str) -> None:
    """A few requests, so the server has run decode steps before a profiler reads /server_info."""
    from sglang_dspark.server_process import http_json

    for i in range(3):
        http_json(url + "/generate", {"text": f"def warm_up_{i}(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": 64, "ignore_eos": True}})


def heldout_rounds(url: str, n: int, seed: int, samples: list, tag: str) -> None:
    from dspark_controller.profiling.live import ActiveProfiler, ProfileSettings

    prof = ActiveProfiler(ProfileSettings(url=url, out="/dev/null", steps_per_round=12, warmup_steps=2,
                                          round_timeout_s=60))
    prof._connect()
    note_load(f"held-out {tag}")
    rng = random.Random(seed)
    for _ in range(n):
        r = rng.randint(1, 16)
        f = rng.random()
        rec = prof.run_round(r, f)
        for s in prof.samples:
            if s[3] == len(prof.rounds) - 1:
                samples.append([s[0], s[1], s[2], tag])
        print(f"[compare] held-out {tag}: R={r} frac={f:.2f}: {rec.n_samples} steps", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=str(ROOT / "artifacts" / "tiny"))
    ap.add_argument("--out-dir", default=str(ROOT / "bench-out" / "profiler_compare"))
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--heldout-rounds", type=int, default=40, help="split evenly before and after the profiles")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path

    from dspark_controller.profiling.tools import load_any
    from sglang_dspark.server_process import SGLangServer
    from sglang_dspark.tiny_models import TinySpec, ensure_pair

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ensure_pair(Path(args.models), TinySpec())
    demo_env = {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"}

    def server(extra_env: dict, name: str) -> SGLangServer:
        return SGLangServer(model_path=f"{args.models}/target", draft_path=f"{args.models}/draft",
                            env={**demo_env, **extra_env}, extra_args=["--max-running-requests", "16"],
                            log_path=out / f"{name}.log")

    res: dict = {"command": "python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
                 "host": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M")}
    held: list = []
    with server({}, "server-a") as srv:
        res["server_a"] = {"env": demo_env, "command": " ".join(srv.command()[1:])}
        warm_up(srv.url)
        rc, wall, tail = run([sys.executable, "-m", "sglang.benchmark.dspark_sps_profiler", *UPSTREAM_ARGS,
                              "--base-url", srv.url, "--out", str(out / "upstream-a.json")],
                             out / "upstream-a.log", 900)
        res["upstream_as_shipped_on_demo_server"] = {"rc": rc, "wall_s": wall, "error": tail if rc else None}
        print(f"[compare] server A, upstream as shipped: rc={rc} ({wall:.0f}s): {tail[-300:]}", file=sys.stderr,
              flush=True)

    env_b = {"SGLANG_SIMULATE_ACC_LEN": "1.0"}
    with server(env_b, "server-b") as srv:
        res["server_b"] = {"env": {**demo_env, **env_b}, "command": " ".join(srv.command()[1:])}
        url = srv.url
        warm_up(url)
        half = args.heldout_rounds // 2
        heldout_rounds(url, half, args.seed, held, "before")

        rc, wall, tail = run([sys.executable, "-m", "sglang.benchmark.dspark_sps_profiler", *UPSTREAM_ARGS,
                              "--base-url", url, "--out", str(out / "upstream-b-asis.json")],
                             out / "upstream-b-asis.log", 900)
        res["upstream_as_shipped_on_server_b"] = {"rc": rc, "wall_s": wall, "error": tail if rc else None}
        print(f"[compare] server B, upstream as shipped: rc={rc} ({wall:.0f}s): {tail[-300:]}", file=sys.stderr,
              flush=True)

        up_tab = out / "upstream.json"
        rc, wall, tail = run([sys.executable, "-c", SHIM, *UPSTREAM_ARGS, "--base-url", url, "--out", str(up_tab),
                              "--no-plot"], out / "upstream.log", 1500)
        res["upstream"] = {"rc": rc, "wall_s": wall, "table": str(up_tab), "error": tail if rc else None,
                           "table_written": up_tab.is_file()}
        if (out / "upstream.rounds.jsonl").is_file():
            rounds = [json.loads(x) for x in (out / "upstream.rounds.jsonl").read_text().splitlines() if x.strip()]
            res["upstream"]["cells"] = len(rounds)
            res["upstream"]["steady_steps"] = int(sum(x["num_steady_steps"] for x in rounds))
        print(f"[compare] upstream (prompt tokens in range): rc={rc} ({wall:.0f}s) {tail[-200:] if rc else ''}",
              file=sys.stderr, flush=True)

        ours = out / "ours.profile.json"
        rc, wall, tail = run([sys.executable, "-m", "dspark_controller.cli", "profile", "--url", url, "-o", str(ours)],
                             out / "ours.log", 900)
        res["ours"] = {"rc": rc, "wall_s": wall, "profile": str(ours), "error": tail if rc else None,
                       "summary": tail.splitlines()[-2] if rc == 0 and tail else None}
        print(f"[compare] ours: rc={rc} ({wall:.0f}s)", file=sys.stderr, flush=True)

        heldout_rounds(url, args.heldout_rounds - half, args.seed + 1, held, "after")

    res["load_average"] = LOADS
    h = np.asarray([x[:3] for x in held], dtype=np.float64)
    tags = np.asarray([x[3] for x in held])
    r, b, t = h[:, 0].astype(int), h[:, 1].astype(int), h[:, 2]
    keys = sorted(set(zip(r.tolist(), b.tolist())))
    cell_med = {k: float(np.median(t[(r == k[0]) & (b == k[1])])) for k in keys}
    cr = np.asarray([k[0] for k in keys])
    cb = np.asarray([k[1] for k in keys])
    ct = np.asarray([cell_med[k] for k in keys])
    own = np.asarray([cell_med[(x, y)] for x, y in zip(r.tolist(), b.tolist())])
    res["heldout"] = {"steps": int(t.size), "cells": len(keys), "noise_floor_per_step": errors(own, t)}
    preds = {}
    grid_r = np.asarray([rr for rr in range(1, 17) for bb in range(rr, 5 * rr + 1)])
    grid_b = np.asarray([bb for rr in range(1, 17) for bb in range(rr, 5 * rr + 1)])
    if res["ours"]["rc"] == 0:
        m = load_any(str(ours)).model
        preds["ours"] = lambda rr, bb: np.asarray(m.predict_step_time(rr, bb), dtype=np.float64)
    if res["upstream"]["table_written"]:
        tab = load_sps_table_from_path(str(up_tab))
        if hasattr(tab, "step_time"):
            preds["upstream"] = lambda rr, bb: np.asarray([tab.step_time(num_reqs=int(x), budget=int(y - x))
                                                           for x, y in zip(rr, bb)])
        else:
            preds["upstream"] = lambda rr, bb: np.asarray([1.0 / tab.lookup(int(y)) for y in bb])
    for name, fn in preds.items():
        g = fn(grid_r, grid_b)
        bad = ~(g > 0) | ~np.isfinite(g)
        res[name]["usable"] = not bool(bad.any())
        res[name]["nonpositive_predictions"] = int(bad.sum())
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            res[name]["first_bad"] = {"R": int(grid_r[i]), "B": int(grid_b[i]), "step_time_s": float(g[i])}
        p = fn(r, b)
        res[name]["heldout_per_step"] = errors(p, t)
        for tag in ("before", "after"):
            sel = tags == tag
            if sel.any():
                res[name][f"heldout_per_step_{tag}"] = errors(p[sel], t[sel])
        res[name]["heldout_per_cell"] = errors(fn(cr, cb), ct)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    print("\n| profiler | wall time | usable | held-out steps MAPE | median APE | p90 APE | bias | "
          "per-cell MAPE |", file=sys.stderr)
    print("|---|---:|---|---:|---:|---:|---:|---:|", file=sys.stderr)
    for name in ("ours", "upstream"):
        x = res.get(name, {})
        if "heldout_per_step" in x:
            s, c = x["heldout_per_step"], x["heldout_per_cell"]
            print(f"| {name} | {x['wall_s']:.0f} s | {'yes' if x['usable'] else 'no'} | {100 * s['mape']:.1f}% | "
                  f"{100 * s['median_ape']:.1f}% | {100 * s['p90_ape']:.1f}% | {100 * s['bias']:+.1f}% | "
                  f"{100 * c['mape']:.1f}% |", file=sys.stderr)
    nf = res["heldout"]["noise_floor_per_step"]
    print(f"| noise floor (own cell median) | - | - | {100 * nf['mape']:.1f}% | {100 * nf['median_ape']:.1f}% | "
          f"{100 * nf['p90_ape']:.1f}% | - | 0 |", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
