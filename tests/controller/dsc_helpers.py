"""Helpers and fixtures for the DSpark controller tests: real processes, real ZeroMQ.

(A uniquely named module rather than conftest.py content, so test modules can import it
without clashing with other components' conftest files.)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_DIR = REPO / "controller"
try:  # installed (pip install -e .) or on PYTHONPATH
    import dspark_controller  # noqa: F401
except ImportError:  # pragma: no cover - fallback for a bare checkout
    sys.path.insert(0, str(CONTROLLER_DIR))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from dspark_controller.service.client import ControllerClient  # noqa: E402
from dspark_controller.service.protocol import (  # noqa: E402
    DecodeError, EngineFingerprint, StatusReply, StatusRequest, StepTelemetry, decode_frames, encode,
)
from dspark_controller.sim.synthetic import TrueCurve, synth_step  # noqa: E402


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(CONTROLLER_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: SIGKILL this child when the test process dies, so no controller is orphaned."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, timeout: float = 60.0, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_controller.cli", *args], env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout, input=stdin,
                          preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)


def request(endpoint: str, msg: Any, *, timeout: float = 3.0, curve: Optional[tuple] = None) -> Any:
    """One request on the controller's CLI socket; None on timeout."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        server_pub, (pub, sec) = curve
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server_pub, pub, sec
    try:
        s.connect(endpoint)
        s.send_multipart(encode(msg))
        if not s.poll(int(timeout * 1000)):
            return None
        return decode_frames(s.recv_multipart())
    finally:
        s.close(0)
        ctx.term()


def wait_for(pred: Any, timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class ControllerProc:
    """A ``dspark-controller serve`` subprocess."""

    def __init__(self, *, workdir: Path, bind: str, extra: list[str], cli: Optional[str] = None,
                 name: str = "ctl", env: Optional[dict[str, str]] = None) -> None:
        self.workdir = workdir
        self.env = env
        self.bind = bind
        self.cli = cli or (bind + ".cli" if bind.startswith("ipc://") else None)
        self.extra = extra
        self.log_path = workdir / f"{name}.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, *, wait: bool = True, curve: Optional[tuple] = None) -> "ControllerProc":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "dspark_controller.cli", "serve", "--bind", self.bind,
                                      *self.extra], cwd=str(self.workdir), env=self.env or subprocess_env(),
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        if wait:
            wait_for(lambda: self.proc.poll() is not None or self.status(timeout=0.5, curve=curve) is not None,
                     30.0, 0.1, "controller to answer status")
            assert self.proc.poll() is None, f"controller exited: {self.log()}"
        return self

    def status(self, *, timeout: float = 3.0, curve: Optional[tuple] = None) -> Optional[StatusReply]:
        reply = request(self.cli, StatusRequest(), timeout=timeout, curve=curve)
        return reply if isinstance(reply, StatusReply) else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)
        finally:
            self._log.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


@pytest.fixture
def short_tmp():
    # ipc:// paths are limited to ~107 bytes, so keep the directory short
    d = Path(tempfile.mkdtemp(prefix="dsc", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def controllers(short_tmp):
    started: list[ControllerProc] = []

    def make(*extra: str, bind: Optional[str] = None, cli: Optional[str] = None, name: str = "ctl",
             start: bool = True, curve: Optional[tuple] = None) -> ControllerProc:
        b = bind or f"ipc://{short_tmp}/c"
        args = list(extra)
        if "--profiles-dir" not in args and "--no-persist" not in args:
            args += ["--profiles-dir", str(short_tmp / "profiles")]
        cp = ControllerProc(workdir=short_tmp, bind=b, extra=args, cli=cli, name=name)
        started.append(cp)
        if start:
            cp.start(curve=curve)
        return cp

    yield make
    for cp in started:
        if cp.alive():
            cp.stop(signal.SIGKILL)


@pytest.fixture
def clients():
    made: list[ControllerClient] = []

    def make(**kw: Any) -> ControllerClient:
        kw.setdefault("heartbeat_s", 0.2)
        c = ControllerClient(**kw)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.close()


def fingerprint(**kw: Any) -> EngineFingerprint:
    base = dict(target_model="Qwen/Qwen3-8B", draft_model="dspark-qwen3-8b", gamma=7, block_size=8,
                device_name="NVIDIA H200", tp_rank=0, tp_size=4, dp_rank=0, dtype="bfloat16",
                attention_backend="fa3", sglang_version="0.5.23")
    base.update(kw)
    return EngineFingerprint(**base)


def replay(client: ControllerClient, curve: TrueCurve, *, steps: int, seed: int, start_seq: int = 0,
           mult: float = 1.0, gamma: int = 7, max_requests: int = 64) -> int:
    """Publish ``steps`` synthetic steps, pacing so the bounded queue never overflows."""
    rng = np.random.default_rng(seed)
    for i in range(steps):
        s = synth_step(rng, curve, gamma=gamma, max_requests=max_requests, mult=mult)
        ok = client.publish_step(StepTelemetry(seq=start_seq + i, num_running_requests=s.num_requests,
                                               verify_tokens=s.verify_tokens, step_time_s=s.step_time_s,
                                               accepted_lens=s.accepted_lens, verify_lens=s.verify_lens,
                                               timestamp=time.time()))
        assert ok
        if i % 64 == 63:
            while client.counters["queue_len"] > 256:
                time.sleep(0.002)
    return start_seq + steps


def run_threads(fns: list[Any]) -> None:
    errors: list[BaseException] = []

    def wrap(f: Any) -> None:
        try:
            f()
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    ts = [threading.Thread(target=wrap, args=(f,)) for f in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if errors:
        raise errors[0]


__all__ = ["ControllerProc", "DecodeError", "fingerprint", "free_port", "replay", "request", "run_cli",
           "run_threads", "subprocess_env", "wait_for"]
