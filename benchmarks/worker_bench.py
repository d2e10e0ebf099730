"""Side-by-side serving benchmark on this machine (ratios, one run).

    python benchmarks/worker_bench.py [--models artifacts/bench] [--levels 1,4,16,32]

Serves the same target (and draft) five ways, one server at a time, and measures
output tokens/s and tokens/s per user at each concurrency level:

  nospec     no speculation
  verify_all DSPARK, static mode (verify every draft token)
  upstream   DSPARK compact + SGLang's static SPS table, our online planning off
             (SGLANG_DSPARK_ONLINE=0, SGLang's own sequential head): SGLang's behaviour
  online     DSPARK compact, NO table, NO controller: our worker's online profile
  controller DSPARK compact, NO table, our controller (throughput policy)

Every server gets the same warm-up pass before measurement (the online configs
learn during it, as they would in production).  Model: the "bench" tiny pair
(hidden 768, so step time depends on batch tokens even on a CPU), built locally.
Ratios are vs ``verify_all`` at the same level.  Absolute numbers are CPU numbers
and say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_dspark.server_process import SGLangServer, free_port, http_json
from sglang_dspark.tiny_models import PRESETS, ensure_pair

BENCH_SPEC = PRESETS["bench"]


def run_level(url: str, concurrency: int, requests_per_user: int, max_new: int) -> dict:
    prompts = [f"def task_{i}(data):" for i in range(concurrency * requests_per_user)]

    def one(p):
        t0 = time.perf_counter()
        r = http_json(url + "/generate", {"text": p, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=600)
        return r["meta_info"]["completion_tokens"], time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        res = list(ex.map(one, prompts))
    wall = time.perf_counter() - t0
    tokens = sum(n for n, _ in res)
    per_user = sum(n / dt for n, dt in res) / len(res)
    return {"tok_s": tokens / wall, "tok_s_per_user": per_user, "tokens": tokens, "wall_s": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="artifacts/bench")
    ap.add_argument("--levels", default="1,4,16,32")
    ap.add_argument("--requests-per-user", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--configs", default="nospec,verify_all,upstream,online,controller")
    ap.add_argument("--table", default="", help="SGLang SPS table for 'upstream' "
                    "(default: measured now with benchmarks/measure_tiny_cpu_sps.py)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    m = Path(args.models)
    ensure_pair(m, BENCH_SPEC)
    work = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    table = args.table
    configs = args.configs.split(",")
    if "upstream" in configs and not table:
        table = str(work / "table.json")
        subprocess.run([sys.executable, str(Path(__file__).with_name("measure_tiny_cpu_sps.py")),
                        "--models", str(m), "--out", table, "--concurrency", "1,2,4,8,16,32",
                        "--spec", "bench"], check=True)
    base_env = {"SGLANG_DSPARK_LOG_INTERVAL_S": "0"}
    maxrun = ["--max-running-requests", str(max(levels))]
    ctrl = None
    results: dict = {}
    try:
        for name in configs:
            env = dict(base_env)
            draft = str(m / "draft")
            extra = list(maxrun)
            if name == "nospec":
                draft = None
            elif name == "verify_all":
                env["SGLANG_RAGGED_VERIFY_MODE"] = "static"
            elif name == "upstream":
                env.update(SGLANG_RAGGED_VERIFY_MODE="compact", SGLANG_DSPARK_ONLINE="0",
                           SGLANG_DSPARK_FUSED_SEQ_HEAD="upstream")
                extra += ["--speculative-dspark-sps-table-path", table]
            elif name == "online":
                env["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
            elif name == "controller":
                port = free_port()
                addr = f"tcp://127.0.0.1:{port}"
                ctrl = subprocess.Popen([sys.executable, "-m", "dspark_controller", "serve",
                                         "--bind", addr, "--no-persist", "--cli-bind",
                                         f"ipc://{work}/cli", "--pub-bind", f"ipc://{work}/pub"])
                env.update(SGLANG_RAGGED_VERIFY_MODE="compact", SGLANG_DSPARK_CONTROLLER=addr)
            else:
                raise SystemExit(f"unknown config {name!r}")
            srv = SGLangServer(model_path=str(m / "target"), draft_path=draft, env=env,
                               extra_args=extra)
            with srv:
                run_level(srv.url, 8, 2, args.max_new_tokens)  # warm-up (same for all)
                results[name] = {}
                for lv in levels:
                    results[name][lv] = run_level(srv.url, lv, args.requests_per_user,
                                                  args.max_new_tokens)
                    print(f"{name:>10} c={lv:<3} {results[name][lv]['tok_s']:8.1f} tok/s  "
                          f"{results[name][lv]['tok_s_per_user']:7.1f} tok/s/user", flush=True)
                if draft:
                    st = srv.server_info()["internal_states"][0]["dspark_info_record"]
                    results[name]["plugin"] = st.get("sglang_dspark", {}).get("budget_sources")
            if ctrl is not None:
                ctrl.terminate()
                ctrl.wait(timeout=30)
                ctrl = None
    finally:
        if ctrl is not None:
            ctrl.kill()
    print("\nratios vs verify_all (output tok/s | tok/s per user), same run:")
    print(f"{'config':>10} " + " ".join(f"{'c=' + str(lv):>15}" for lv in levels))
    for name in configs:
        cells = []
        for lv in levels:
            if "verify_all" in results:
                b = results["verify_all"][lv]
                r = results[name][lv]
                cells.append(f"{r['tok_s'] / b['tok_s']:6.2f}|{r['tok_s_per_user'] / b['tok_s_per_user']:5.2f}")
        print(f"{name:>10} " + " ".join(f"{c:>15}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
