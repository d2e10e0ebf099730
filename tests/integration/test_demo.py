"""``make demo`` as a new user runs it (``python -m sglang_dspark.demo`` on the committed
trained pair, real SGLang servers), and the pause / resume it measures with."""

import subprocess
import sys
import time
from pathlib import Path

from dspark_testlib import user_env
from sglang_dspark.server_process import SGLangServer, http_json

REPO = Path(__file__).resolve().parents[2]


def _group_states(pgid: int) -> set:
    """The /proc state letters of the processes in process group ``pgid``."""
    states = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:      # after the state: ppid, pgrp
            states.add(fields[0])
    return states


def _all_stopped(pgid: int, timeout: float = 10.0) -> bool:
    """Every process of the group reaches the stopped state (T) within ``timeout`` seconds
    (a signal is delivered asynchronously; zombies, already gone, do not count)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _group_states(pgid) - {"Z"} == {"T"}:
            return True
        time.sleep(0.1)
    return False


def test_demo_runs_and_says_whether_speculation_paid():
    """The demo's whole path: the frontend program, its statistics, the interleaved
    comparison (both servers up, one paused) and a clean shutdown, exit code 0."""
    p = subprocess.run([sys.executable, "-m", "sglang_dspark.demo", "--compare-requests", "2",
                        "--compare-tokens", "16", "--compare-rounds", "2"],
                       cwd=REPO, env=user_env(), capture_output=True, text=True, timeout=600)
    out = p.stdout
    assert p.returncode == 0, out[-3000:] + p.stderr[-3000:]
    assert "worker: sglang_dspark.worker.DSparkControlledWorker" in out
    assert "[demo]   round 1: DSPARK" in out and "[demo]   round 2: DSPARK" in out
    verdict = [ln for ln in out.splitlines() if ln.startswith("[demo] did speculation pay?")]
    assert len(verdict) == 1 and "(medians)" in verdict[0] and "decode steps ran without drafting" in verdict[0]
    assert "[demo] servers shut down cleanly." in out


def test_demo_rejects_bad_comparison_arguments():
    p = subprocess.run([sys.executable, "-m", "sglang_dspark.demo", "--compare-rounds", "0"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--compare-rounds >= 1 (got 0)" in p.stderr


def test_paused_server_is_stopped_and_stops_promptly(tiny_pair):
    """``pause`` stops every process of the server (an idle SGLang scheduler would poll a
    core); ``running`` serves again; ``stop`` of a paused server does not wait out its
    SIGTERM timeout (a stopped process does not handle SIGTERM until continued)."""
    srv = SGLangServer(model_path=tiny_pair["target"])
    srv.start()
    try:
        pgid = srv.proc.pid
        srv.pause()
        assert _all_stopped(pgid), _group_states(pgid)
        with srv.running():
            r = http_json(srv.url + "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}},
                          timeout=60)
            assert r["meta_info"]["completion_tokens"] == 4
            assert "T" not in _group_states(pgid)
        assert _all_stopped(pgid), _group_states(pgid)
    finally:
        t0 = time.monotonic()
        rc = srv.stop(timeout=30)
        took = time.monotonic() - t0
    assert rc is not None and took < 25, (rc, took)
