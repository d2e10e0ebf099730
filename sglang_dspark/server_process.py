"""Start and stop ``python -m sglang.launch_server`` as a child process.

Used by the demo, tests and benchmarks: one place that knows how to wait for
readiness, surface a start-up failure with the server's own log, and shut the
whole process tree down cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    pass


def http_json(url: str, payload: dict | None = None, timeout: float = 120.0) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


@dataclass
class SGLangServer:
    model_path: str
    draft_path: str | None = None
    port: int = 0
    device: str = "cpu"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    startup_timeout: float = 300.0
    # On CPU SGLang sizes the KV pool from free RAM; cap it so several servers fit
    # on a small machine (None: leave SGLang's default, e.g. to test the bare command).
    cpu_kv_tokens: int | None = 32768
    proc: subprocess.Popen | None = None

    def __post_init__(self):
        if not self.port:
            self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_path,
               "--device", self.device, "--port", str(self.port), "--host", "127.0.0.1"]
        if self.draft_path:
            cmd += ["--speculative-algorithm", "DSPARK",
                    "--speculative-draft-model-path", self.draft_path]
        extra = list(self.extra_args)
        if (self.device == "cpu" and self.cpu_kv_tokens and "--max-total-tokens" not in extra
                and "--mem-fraction-static" not in extra):
            extra += ["--max-total-tokens", str(self.cpu_kv_tokens)]
        return cmd + extra

    def start(self) -> "SGLangServer":
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="sglang-server-", suffix=".log")[1])
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        if self.draft_path:
            from sglang_dspark.plugin import skip_reason

            reason = skip_reason(env)   # SGLang would run its own DSPARK worker, not ours
            if reason:
                raise ServerStartError(reason)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"SGLang server exited with code {self.proc.returncode} during start-up; "
                    f"last log lines:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerStartError(f"SGLang server not healthy after {self.startup_timeout:.0f}s; "
                               f"last log lines:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def server_info(self) -> dict:
        return http_json(self.url + "/server_info")

    def set_internal_state(self, server_args: dict) -> bool:
        """``POST /set_internal_state``; True when every DP rank applied it."""
        from dspark_controller.profiling.live import internal_state_updated

        return internal_state_updated(http_json(self.url + "/set_internal_state", {"server_args": server_args}))

    def _signal_group(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        """Stop the server's whole process group (SIGSTOP) until :meth:`resume`.  Two SGLang
        servers on one CPU host slow each other even when one is idle (its scheduler polls a
        core), so a server not being measured is paused, not left idle."""
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a paused server (SIGCONT; harmless on a running one)."""
        self._signal_group(signal.SIGCONT)

    @contextmanager
    def running(self):
        """``with srv.running():`` resumes the server for the block and pauses it after, so
        several servers stay up while only the one being measured runs."""
        self.resume()
        try:
            yield self
        finally:
            self.pause()

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the process group (resumed first: a paused process does not handle it), and
        SIGKILL it after ``timeout`` seconds; the server's exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.resume()
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        else:
            # the group may still hold children (scheduler, detokenizer)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
