"""``--dp-size 2`` on CPU with a real controller: each data-parallel replica registers as
its own engine (``.../tp0/dp0`` and ``.../tp0/dp1``, the replica index SGLang publishes to
each scheduler), both stay registered, and both replicas' telemetry is kept.  Before, both
replicas registered as ``dp0``: each registration replaced the other's engine (new
client instance) and its telemetry was dropped as coming from an unknown engine."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from sglang_dspark.server_process import SGLangServer, free_port, http_json


def _status(cli_addr):
    out = subprocess.run([sys.executable, "-m", "dspark_controller", "status", "--connect",
                          cli_addr, "--json", "--timeout", "5"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _load(srv, n, concurrency=8, max_new=24):
    def one(i):
        r = http_json(srv.url + "/generate", {"text": f"def g{i}(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=300)
        return r["meta_info"]["completion_tokens"]
    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, range(n)))


def _cores_per_rank(ranks: int) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND value giving each of ``ranks`` ranks its share of the
    cores this process may use (at least one each; shared when there are fewer cores)."""
    cores = sorted(os.sched_getaffinity(0))
    per = max(len(cores) // ranks, 1)
    groups = [cores[(i * per) % len(cores):(i * per) % len(cores) + per] for i in range(ranks)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def test_dp_replicas_register_as_distinct_engines(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    port = free_port()
    addr, cli = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 2}"
    ctrl = subprocess.Popen([sys.executable, "-m", "dspark_controller", "serve", "--bind", addr,
                             "--profiles-dir", str(tmp_path / "profiles"), "--decision-interval-s", "0.2"],
                            stdout=open(tmp_path / "controller.log", "a"), stderr=subprocess.STDOUT)
    srv = SGLangServer(model_path=tiny_pair["target"], draft_path=tiny_pair["draft"],
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_CONTROLLER": addr,
                            "SGLANG_DSPARK_ENGINE_ID": "srv", "SGLANG_DSPARK_LOG_INTERVAL_S": "0",
                            # SGLang's CPU path binds each rank to a NUMA node unless told
                            # which cores each rank uses (two ranks, one NUMA node here)
                            "SGLANG_CPU_OMP_THREADS_BIND": _cores_per_rank(2)},
                       extra_args=["--dp-size", "2", "--max-running-requests", "8"],
                       cpu_kv_tokens=8192)
    try:
        srv.start()
        deadline, st = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            assert all(n == 24 for n in _load(srv, 8))   # SGLang's DP controller spreads them
            st = _status(cli)
            by_id = {e["engine_id"]: e for e in st["engines"]}
            if set(by_id) == {"srv/tp0/dp0", "srv/tp0/dp1"} and all(e["steps"] > 0 for e in by_id.values()):
                break
            time.sleep(1.0)
        assert st is not None and sorted(e["engine_id"] for e in st["engines"]) == \
            ["srv/tp0/dp0", "srv/tp0/dp1"], st and st["engines"]
        first = {e["engine_id"]: e for e in st["engines"]}
        assert all(e["steps"] > 0 and e["state"] == "connected" for e in first.values()), first
        assert first["srv/tp0/dp0"]["worker_id"] != first["srv/tp0/dp1"]["worker_id"]
        # more traffic: the same two registrations keep learning (no re-registration
        # replaces either engine, which would reset its step count and worker id)
        assert all(n == 24 for n in _load(srv, 16))
        time.sleep(2.0)
        later = {e["engine_id"]: e for e in _status(cli)["engines"]}
        assert set(later) == set(first)
        for eid, e in later.items():
            assert e["worker_id"] == first[eid]["worker_id"], (eid, e, first[eid])
            assert e["steps"] >= first[eid]["steps"] and e["state"] == "connected", (eid, e)
        assert sum(later[k]["steps"] for k in later) > sum(first[k]["steps"] for k in first)
        dropped = _status(cli)["dropped"]
        assert not dropped.get("unregistered"), dropped
        assert len(_status(cli)["profiles"]) == 1      # one fingerprint (ranks aside): one profile
    finally:
        srv.stop()
        if ctrl.poll() is None:
            ctrl.terminate()
            ctrl.wait(timeout=30)
