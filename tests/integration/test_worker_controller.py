"""Our worker with a real controller process: telemetry, decisions, fallback when
the controller dies, reconnection after it restarts, two servers sharing one
controller and one profile.  Real SGLang servers, real ZeroMQ, real processes."""

import json
import os
import signal
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


def _start_controller(addr, tmp_path):
    return subprocess.Popen([sys.executable, "-m", "dspark_controller", "serve", "--bind", addr,
                             "--profiles-dir", str(tmp_path / "profiles"),
                             "--decision-interval-s", "0.2"],
                            stdout=open(tmp_path / "controller.log", "a"),
                            stderr=subprocess.STDOUT)


def _plugin(srv):
    return srv.server_info()["internal_states"][0]["dspark_info_record"]["sglang_dspark"]


def _wait(pred, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _load(srv, n, concurrency=8, max_new=40):
    def one(i):
        r = http_json(srv.url + "/generate", {"text": f"def g{i}(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=300)
        return r["meta_info"]["completion_tokens"]
    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, range(n)))


def test_controller_link_fallback_reconnect_and_shared_profile(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    cli = f"tcp://127.0.0.1:{port + 2}"
    # every step drafts (no no-draft steps): this test follows who chose each step's budget,
    # and where plain decoding wins (the tiny pair on some CPUs) the gate would stop
    # drafting under the controller's budgets and no step would be planned at all
    # (tests/controller/test_no_draft.py has the gate under a controller)
    env = {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_CONTROLLER": addr,
           "SGLANG_DSPARK_DECISION_MAX_AGE_S": "1.5", "SGLANG_DSPARK_LOG_INTERVAL_S": "0",
           "SGLANG_DSPARK_NO_DRAFT": "0"}
    ctrl = _start_controller(addr, tmp_path)
    servers = [SGLangServer(model_path=tiny_pair["target"], draft_path=tiny_pair["draft"],
                            env=dict(env, SGLANG_DSPARK_ENGINE_ID=f"srv{i}"),
                            extra_args=["--max-running-requests", "8"]) for i in range(2)]
    try:
        # both start at once: a server that is up polls a core while the other starts
        with ThreadPoolExecutor(2) as ex:
            list(ex.map(lambda s: s.start(), servers))
        for s in servers:
            assert all(n == 40 for n in _load(s, 8))
        # both engines registered, one shared profile learned from both (more traffic while
        # waiting: how many steps feed the profile depends on the budgets chosen, e.g.
        # uniform-path steps stop feeding it once it is ready)
        def learning():
            x = _status(cli)
            if len(x["engines"]) == 2 and x["profiles"] and x["profiles"][0]["samples_seen"] > 20:
                return x
            for s in servers:
                _load(s, 4)
            return None

        st = _wait(learning, timeout=180, what="two engines and a learning profile")
        assert len(st["profiles"]) == 1
        assert sorted(st["profiles"][0]["engines"]) == sorted(e["engine_id"] for e in st["engines"])
        for s in servers:
            p = _plugin(s)
            assert p["controller"]["link_state"] == "connected"
        _wait(lambda: _plugin(servers[0])["budget_sources"].get("controller", 0) > 0 or
              (_load(servers[0], 4) and False), timeout=90, what="controller decisions applied")

        # the second server idles until the restart: an idle SGLang scheduler polls and
        # would take one of this machine's two cores from the first
        os.killpg(servers[1].proc.pid, signal.SIGSTOP)
        # kill the controller while requests are in flight: nothing fails
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_load, servers[0], 16)
            time.sleep(1.0)
            ctrl.send_signal(signal.SIGKILL)
            ctrl.wait(timeout=30)
            assert all(n == 40 for n in fut.result(timeout=600))
        # once the link is lost (later than the last decision's max age) the local
        # policy decides: the fallback
        _wait(lambda: _plugin(servers[0])["controller"]["link_state"] == "lost",
              timeout=30, what="link marked lost")
        before = _plugin(servers[0])["budget_sources"].get("local", 0)
        assert all(n == 40 for n in _load(servers[0], 8))
        p = _plugin(servers[0])
        assert p["budget_sources"].get("local", 0) > before, p  # fallback engaged

        # controller comes back on the same address: workers re-register
        os.killpg(servers[1].proc.pid, signal.SIGCONT)
        ctrl = _start_controller(addr, tmp_path)
        _wait(lambda: len(_status(cli)["engines"]) == 2, timeout=60, what="re-registration")
        c0 = _plugin(servers[0])["budget_sources"].get("controller", 0)
        _wait(lambda: (_load(servers[0], 4) and
                       _plugin(servers[0])["budget_sources"].get("controller", 0) > c0),
              timeout=120, what="decisions after restart")
        assert _plugin(servers[0])["controller"]["link_state"] == "connected"
    finally:
        for s in servers:
            if s.proc is not None and s.proc.poll() is None:
                os.killpg(s.proc.pid, signal.SIGCONT)
            s.stop()
        if ctrl.poll() is None:
            ctrl.terminate()
            ctrl.wait(timeout=30)
