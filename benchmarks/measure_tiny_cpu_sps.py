"""Measure the tiny CPU engine's SPS curve and write it as SGLang's SpsCostTable.

    python benchmarks/measure_tiny_cpu_sps.py [--out profiles/tiny-cpu-2core.sglang-sps-table.json]

Serves the tiny pair (built if missing) with DSPARK in static mode (verify all:
batch tokens = running requests x (gamma + 1)) and SGLang's own per-step records
(SGLANG_DSPARK_ENABLE_SPS_RECORD=1), sweeps concurrency, and takes the median step
time per batch-token count.  Steps/s is forced non-increasing in batch tokens.
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_dspark.server_process import SGLangServer, http_json
from sglang_dspark.tiny_models import PRESETS, ensure_pair


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="profiles/tiny-cpu-2core.sglang-sps-table.json")
    ap.add_argument("--models", default="artifacts/tiny")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--spec", default="tiny", choices=sorted(PRESETS))
    args = ap.parse_args(argv)
    ensure_pair(Path(args.models), PRESETS[args.spec])
    levels = [int(x) for x in args.concurrency.split(",")]
    srv = SGLangServer(model_path=f"{args.models}/target", draft_path=f"{args.models}/draft",
                       env={"SGLANG_RAGGED_VERIFY_MODE": "static",
                            "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"},
                       extra_args=["--max-running-requests", str(max(levels))])
    by_tokens = defaultdict(list)
    with srv:
        for r in levels:
            prompts = [f"def function_{i}(x):" for i in range(r)]
            def one(p):
                return http_json(srv.url + "/generate", {"text": p, "sampling_params": {
                    "temperature": 0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}})
            with ThreadPoolExecutor(r) as ex:
                list(ex.map(one, prompts))
            rec = srv.server_info()["internal_states"][0]["dspark_info_record"]
            for row in rec["records"]:
                if row.get("step_cpu_ms") and row["num_running_reqs"] == r:
                    by_tokens[row["num_verify_tokens"]].append(row["step_cpu_ms"])
            print(f"concurrency {r}: {len(by_tokens)} token buckets so far", file=sys.stderr)
    tokens = sorted(by_tokens)
    sps, best = [], float("inf")
    for t in tokens:
        s = 1000.0 / statistics.median(by_tokens[t])
        best = min(best, s)
        sps.append(round(best, 3))
    table = {"sample_batch_tokens": tokens, "sample_steps_per_sec": sps,
             "max_batch_tokens": max(tokens) * 2}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(table, indent=2) + "\n")
    meta = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
            "samples_per_bucket": {t: len(by_tokens[t]) for t in tokens}}
    Path(args.out).with_suffix(".provenance.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
