"""SGLang's own SPS table for a tiny pair (``bench``, ``deep`` or ``deep-weak``), made by SGLang's own profiler.

    python benchmarks/upstream_table.py [--pair bench] [--out benchmarks/results/<pair>-upstream-sps-table.json]
                                        [--round-timeout SECONDS]

What the ``upstream`` row of ``benchmarks/worker_bench.py`` serves with: an
``SpsAdditiveCostTable`` written by ``python -m sglang.benchmark.dspark_sps_profiler all``
(SGLang 0.5.23) against the bench pair served in compact mode with per-step records.

Two things upstream's profiler needs that the bench pair does not give it as shipped (both
found by ``benchmarks/profiler_compare.py``, see docs/profiles.md):

* the server must run with ``SGLANG_SIMULATE_ACC_LEN=1.0`` (its own guard), so this
  script launches the profiling server that way;
* it draws random prompt tokens from ``[1000, vocab - 1000)``; the tiny vocabulary has 512
  tokens, so the module constants are moved into the vocabulary in-process (``SHIM`` in
  profiler_compare.py; nothing else of upstream's profiler is changed).

A ``.provenance.json`` beside the table records the command, date, wall time and host.

A slow host has two limits.  ``--round-timeout`` is passed to the profiler (its default:
300 s per round, in which each round must collect its steady steps); the whole profiler run
may then take ``max(3600, 28 * round_timeout)`` seconds (its 28 rounds at
``--max-batch-size 32``).  And SGLang 0.5.23's step recorder keeps no step longer than 1 s
(``INFO_DUMP_MAX_STEP_CPU_SECONDS`` in ``dspark_observability``), so a round whose steps take
longer never stabilizes, however long it runs: on an Intel Xeon model 207 host the ``deep``
pair's 24-request steps took 1.0-1.2 s and the profiler saw 7 of them.  There, lower
``--max-batch-size``; the failure message says which round it was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from profiler_compare import SHIM, warm_up  # noqa: E402

ROUNDS = 28     # the profiler's rounds for --fracs 0.25 0.5 0.75 1.0 --max-batch-size 32


def failure_hint(profiler_log: str) -> str:
    """What to change when the profiler's log says a round never stabilized ("" otherwise)."""
    m = re.search(r"Round bs=(\d+) never stabilized", profiler_log)
    if m is None:
        return ""
    bs = int(m.group(1))
    return (f". Its {bs}-request round never stabilized: SGLang's step recorder keeps no step "
            f"longer than 1 s, so on a host where that round's steps take longer, pass "
            f"--max-batch-size {max(1, bs - 1)} or less; if its steps are shorter but too few "
            f"arrived in time, pass a longer --round-timeout")


def make_table(*, models: Path, out: Path, max_batch: int = 32, log_dir: Path | None = None,
               pair: str = "bench", round_timeout: float | None = None) -> dict:
    from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path

    from sglang_dspark.server_process import SGLangServer
    from sglang_dspark.tiny_models import PRESETS, ensure_pair

    ensure_pair(models, PRESETS[pair])
    if log_dir is None:
        import tempfile

        log_dir = Path(tempfile.mkdtemp(prefix="dspark-upstream-table-"))
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1",
           "SGLANG_SIMULATE_ACC_LEN": "1.0"}
    args = ["all", "--fracs", "0.25", "0.5", "0.75", "1.0", "--max-batch-size", str(max_batch), "--no-plot"]
    if round_timeout is not None:
        args += ["--round-timeout", f"{round_timeout:g}"]
    whole_run_s = max(3600.0, ROUNDS * (round_timeout or 0.0))
    srv = SGLangServer(model_path=str(models / "target"), draft_path=str(models / "draft"), env=env,
                       extra_args=["--max-running-requests", str(max_batch)],
                       log_path=log_dir / "upstream-table-server.log")
    t0 = time.monotonic()
    with srv:
        warm_up(srv.url)
        log = log_dir / "upstream-table-profiler.log"
        with open(log, "w") as f:
            p = subprocess.run([sys.executable, "-c", SHIM, *args, "--base-url", srv.url, "--out", str(out)],
                               stdout=f, stderr=subprocess.STDOUT, cwd=str(ROOT), timeout=whole_run_s)
        if p.returncode != 0 or not out.is_file():
            raise SystemExit(f"SGLang's dspark_sps_profiler failed (rc={p.returncode}); see {log}"
                             + failure_hint(log.read_text(errors="replace")))
    wall = time.monotonic() - t0
    records = out.with_suffix(".records.jsonl")
    if records.is_file():  # raw per-step records (MBs): kept with the logs, not beside the table
        records.replace(log_dir / records.name)
    load_sps_table_from_path(str(out))  # SGLang's own loader must read it
    prov = {"command": "python benchmarks/upstream_table.py " + " ".join(sys.argv[1:]),
            "profiler": "python -m sglang.benchmark.dspark_sps_profiler " + " ".join(args),
            "profiler_shim": "RANDOM_TOKEN_LOW=10, RANDOM_TOKEN_HIGH_MARGIN=10 (tiny vocabulary)",
            "server_env": env, "models": str(models), "date": time.strftime("%Y-%m-%d %H:%M"),
            "wall_s": round(wall, 1), "logs": str(log_dir), "host": platform.node(), "cpus": os.cpu_count()}
    out.with_suffix(".provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    return prov


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="bench", choices=["bench", "deep", "deep-weak"],
                    help="tiny pair preset (sglang_dspark.tiny_models.PRESETS)")
    ap.add_argument("--models", default="", help="pair folder (default artifacts/<pair>)")
    ap.add_argument("--out", default="", help="table path (default benchmarks/results/<pair>-upstream-sps-table.json)")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--round-timeout", type=float, default=None, metavar="SECONDS",
                    help="the profiler's per-round wall-clock budget (its default: 300); raise it "
                         "on a slow host where a round collects too few steady steps")
    args = ap.parse_args(argv)
    if args.round_timeout is not None and not args.round_timeout > 0:
        ap.error(f"--round-timeout must be > 0 seconds, got {args.round_timeout:g}")
    models = Path(args.models or ROOT / "artifacts" / args.pair)
    out = Path(args.out or HERE / "results" / f"{args.pair}-upstream-sps-table.json")
    prov = make_table(models=models, out=out, max_batch=args.max_batch_size, pair=args.pair,
                      round_timeout=args.round_timeout)
    print(json.dumps(prov, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
