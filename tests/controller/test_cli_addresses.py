"""Addresses and sources on the command line: one clear line and exit code 2, never a traceback.

Every ``dspark-controller`` subcommand that takes a ZeroMQ address (``status``/``set --connect``,
``serve --bind/--pub-bind/--cli-bind``, ``profile --from-controller``) checks it with
``endpoints.check_endpoint`` before ZeroMQ sees it; ``profile`` takes exactly one source.
"""

from __future__ import annotations

import pytest

from dsc_helpers import fingerprint, run_cli
from dspark_controller.service.client import ControllerClient
from dspark_controller.service.endpoints import ConfigError, check_endpoint

FORMS = "expected tcp://HOST:PORT"


def _one_clear_line(r, *, names: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "ZMQError" not in r.stderr, r.stderr
    assert len(err.splitlines()) == 1, err
    assert names in err and FORMS in err and "ipc://PATH" in err, err
    return err


@pytest.mark.parametrize("cmd", [["status"], ["set", "off"]])
@pytest.mark.parametrize("addr, why", [("garbage", "no transport"), ("tcp://127.0.0.1", "numeric port"),
                                       ("ipc://", "ipc path is empty"), ("tcp://*:7152", "only binds"),
                                       ("tcp://127.0.0.1:70000", "outside 1..65535")])
def test_connect_garbage_is_one_line_and_exit_2(cmd, addr, why):
    r = run_cli(*cmd, "--connect", addr, "--timeout", "0.5")
    err = _one_clear_line(r, names=f"--connect {addr!r}")
    assert why in err and err.startswith(f"dspark-controller {cmd[0]}: error: ")
    assert "tcp://127.0.0.1:7152" in err          # the example is the CLI endpoint (base port + 2)


def test_connect_to_nobody_is_still_exit_1(short_tmp):
    r = run_cli("status", "--connect", f"ipc://{short_tmp}/nobody.cli", "--timeout", "0.3")
    assert r.returncode == 1 and "no reply from the controller" in r.stderr


@pytest.mark.parametrize("args, names", [
    (["--bind", "garbage"], "--bind 'garbage'"),
    (["--bind", "tcp://127.0.0.1:7150", "--pub-bind", "nope"], "--pub-bind 'nope'"),
    (["--bind", "tcp://127.0.0.1:7150", "--cli-bind", "tcp://127.0.0.1"], "--cli-bind 'tcp://127.0.0.1'"),
    (["--bind", "tcp://127.0.0.1:65535"], "--pub-bind (derived from --bind) 'tcp://127.0.0.1:65536'"),
    (["--bind", "LONG_IPC"], "--pub-bind (derived from --bind) 'ipc://"),    # a 105-byte path is fine, + .pub not
])
def test_serve_bind_garbage_is_one_line_and_exit_2(args, names, short_tmp):
    base = f"{short_tmp}/"
    long_ipc = "ipc://" + base + "p" * (105 - len(base))
    args = [long_ipc if a == "LONG_IPC" else a for a in args]
    r = run_cli("serve", *args, "--profiles-dir", str(short_tmp / "p"), timeout=30)
    _one_clear_line(r, names=names)
    assert not (short_tmp / "p").exists()


def test_profile_from_controller_garbage_is_one_line_and_exit_2(tmp_path):
    r = run_cli("profile", "--from-controller", "garbage", "-o", str(tmp_path / "p.json"))
    _one_clear_line(r, names="--from-controller 'garbage'")
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args, clash", [
    (["--url", "http://127.0.0.1:9", "--launch", "python -c pass"],
     "argument --launch: not allowed with argument --url"),
    (["--launch", "python -c pass", "--from-controller", "tcp://127.0.0.1:7152"],
     "argument --from-controller: not allowed with argument --launch"),
    (["--url", "http://127.0.0.1:9", "--from-controller", "tcp://127.0.0.1:7152"],
     "argument --from-controller: not allowed with argument --url"),
])
def test_profile_takes_exactly_one_source(args, clash, tmp_path):
    marker = tmp_path / "launched"
    args = [a.replace("python -c pass", f"python -c 'open({str(marker)!r}, \"w\")'") for a in args]
    r = run_cli("profile", *args, "-o", str(tmp_path / "p.json"))
    assert r.returncode == 2 and clash in r.stderr, r.stderr
    assert "[--url URL | --launch CMD | --from-controller ADDR]" in " ".join(r.stderr.split())
    assert not marker.exists() and not (tmp_path / "p.json").exists()       # nothing was started
    r = run_cli("profile", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "exactly one source" in r.stderr


@pytest.mark.parametrize("addr", ["tcp://127.0.0.1:7150", "tcp://ctrl.example.org:1", "tcp://[::1]:7150",
                                  "tcp://eth0;10.0.0.1:7150", "ipc:///run/dspark/c", "ipc://@abstract"])
def test_good_addresses_pass_unchanged(addr):
    assert check_endpoint(addr) == addr
    assert check_endpoint(addr, bind=True) == addr


@pytest.mark.parametrize("addr", ["", " tcp://127.0.0.1:1", "tcp://a b:1", "tcp://::1:7150", "tcp://[zz]:1",
                                  "tcp://:7150", "tcp://127.0.0.1:0", "udp://127.0.0.1:1", "inproc://x",
                                  "ipc:///" + "x" * 107, None, 7150])
def test_bad_addresses_are_refused_with_one_line(addr):
    with pytest.raises(ConfigError) as e:
        check_endpoint(addr, option="--connect")
    msg = str(e.value)
    assert msg.startswith(f"--connect {addr!r} is not a ZeroMQ address: ") and "\n" not in msg and FORMS in msg


def test_bind_only_forms():
    assert check_endpoint("tcp://*:7150", bind=True) == "tcp://*:7150"
    assert check_endpoint("tcp://127.0.0.1:0", bind=True) == "tcp://127.0.0.1:0"
    assert check_endpoint("inproc://x", allow_inproc=True) == "inproc://x"


def test_client_refuses_a_malformed_address_at_construction():
    with pytest.raises(ConfigError, match="controller address 'garbage' is not a ZeroMQ address"):
        ControllerClient(address="garbage", fingerprint=fingerprint(), engine_id="e1")
    with pytest.raises(ConfigError, match="controller publisher address"):
        ControllerClient(address="tcp://127.0.0.1:7150", pub_address="tcp://x", fingerprint=fingerprint(),
                         engine_id="e1")
