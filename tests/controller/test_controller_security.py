"""Bind safety and CurveZMQ: unauthenticated peers are refused."""

from __future__ import annotations

import subprocess
import sys
import time

import zmq.auth

from dsc_helpers import fingerprint, free_port, replay, run_cli, subprocess_env, wait_for
from dspark_controller.sim.synthetic import CURVES


def test_public_tcp_bind_without_curve_is_refused(short_tmp):
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "dspark_controller.cli", "serve", "--bind", f"tcp://0.0.0.0:{port}",
                        "--profiles-dir", str(short_tmp / "p")], env=subprocess_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "refusing to bind" in r.stderr and "CurveZMQ" in r.stderr and "127.0.0.1" in r.stderr


def test_curve_authenticates_workers_and_refuses_others(controllers, clients, short_tmp):
    keys = short_tmp / "keys"
    authorized = short_tmp / "authorized"
    keys.mkdir()
    authorized.mkdir()
    zmq.auth.create_certificates(str(keys), "server")
    zmq.auth.create_certificates(str(keys), "good")
    zmq.auth.create_certificates(str(keys), "evil")
    (authorized / "good.key").write_bytes((keys / "good.key").read_bytes())
    server_pub, _ = zmq.auth.load_certificate(str(keys / "server.key"))
    good = zmq.auth.load_certificate(str(keys / "good.key_secret"))
    port, pport, cport = free_port(), free_port(), free_port()
    bind = f"tcp://127.0.0.1:{port}"
    cli = f"tcp://127.0.0.1:{cport}"
    ctl = controllers("--pub-bind", f"tcp://127.0.0.1:{pport}", "--cli-bind", cli,
                      "--curve-secret-key", str(keys / "server.key_secret"),
                      "--curve-authorized-dir", str(authorized), bind=bind, cli=cli, curve=(server_pub, good))
    ok = clients(address=bind, fingerprint=fingerprint(), engine_id="good", curve_server_key=server_pub,
                 curve_keys=str(keys / "good.key_secret"))
    evil = clients(address=bind, fingerprint=fingerprint(), engine_id="evil", curve_server_key=server_pub,
                   curve_keys=str(keys / "evil.key_secret"))
    plain = clients(address=bind, fingerprint=fingerprint(), engine_id="plain")
    wait_for(lambda: ok.link_state == "connected", 20, what="authorised client")
    replay(ok, CURVES["smooth"], steps=80, seed=1)
    wait_for(lambda: ok.latest_decision(5.0), 15, what="decision over CURVE")
    time.sleep(1.5)
    assert evil.link_state == "connecting" and plain.link_state == "connecting"
    assert evil.counters.get("registrations", 0) == 0 and plain.counters.get("registrations", 0) == 0
    st = ctl.status(curve=(server_pub, good))
    assert [e.engine_id for e in st.engines] == ["good"]
    assert st.counters["handshake_failures"] >= 1 and st.dropped.get("auth_failed", 0) >= 1
    # the CLI needs keys too
    r = run_cli("status", "--connect", cli, "--timeout", "1")
    assert r.returncode == 1
    r = run_cli("status", "--connect", cli, "--curve-server-key", str(keys / "server.key"),
                "--curve-client-cert", str(keys / "good.key_secret"), "--json")
    assert r.returncode == 0, r.stderr
