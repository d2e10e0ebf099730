"""`make demo`: DSPARK on CPU, end to end, with the tiny local models.

1. builds (or reuses) the tiny target + DSpark draft in ``artifacts/tiny``;
2. launches ``python -m sglang.launch_server --speculative-algorithm DSPARK
   --device cpu`` in compact ragged-verify mode with the measured CPU SPS table
   from ``profiles/``;
3. runs the SGLang frontend program ``examples/frontend_program.py`` with several
   concurrent requests;
4. prints the outputs, SGLang's accept length and the verify budgets SGLang chose,
   then shuts the server down.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

from sglang_dspark.server_process import SGLangServer
from sglang_dspark.tiny_models import TinySpec, ensure_pair

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = ROOT / "profiles" / "tiny-cpu-2core.sglang-sps-table.json"


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_dspark.demo")
    ap.add_argument("--models", default=str(ROOT / "artifacts" / "tiny"))
    ap.add_argument("--sps-table", default=str(DEFAULT_TABLE))
    ap.add_argument("--mode", default="compact", choices=["static", "cap-accept", "compact"])
    args = ap.parse_args(argv)

    print(f"[demo] building tiny models in {args.models} (no downloads)...", flush=True)
    manifest = ensure_pair(Path(args.models), TinySpec())
    print(f"[demo] draft Markov rows correct: {manifest['draft_row_accuracy']:.0%}", flush=True)
    extra = ["--max-running-requests", "16"]
    if args.mode != "static":
        extra += ["--speculative-dspark-sps-table-path", args.sps_table]
    srv = SGLangServer(model_path=f"{args.models}/target", draft_path=f"{args.models}/draft",
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
    print("[demo] server shut down cleanly.")
    if stats["worker"] != "sglang_dspark.worker.DSparkControlledWorker":
        print("[demo] ERROR: the sglang-dspark worker was not active", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
