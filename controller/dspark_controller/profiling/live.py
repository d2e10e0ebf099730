"""Profiling: measure an engine's step-time curve t(R, B) and write a profile file.

Active (``dspark-controller profile --url http://HOST:PORT``)
-------------------------------------------------------------
Drives a running SGLang DSPARK server over HTTP (any device). The server must run with
``SGLANG_DSPARK_ENABLE_SPS_RECORD=1`` (SGLang then keeps a per-step record in
``/server_info``: running requests, verify tokens, step wall time) and, to sweep the
verify budget, ``SGLANG_RAGGED_VERIFY_MODE=compact`` (the budget fraction is pinned with
``POST /set_internal_state {"server_args": {"dspark_force_budget_frac": f}}``; in other
modes only verify-all steps can be measured and the sweep degrades to that, with a
warning).

One *round* = pin fraction f, send R concurrent ``/generate`` requests (greedy,
``ignore_eos``, sized to give about ``steps_per_round`` decode steps at R), wait for
them, read the new step records (``forward_ct`` above the round's watermark). Every
timed decode step is a sample ``(R', B, t)`` (steps of the ramp-up and the tail, where
fewer requests run, are samples too); the steps at exactly R give the round's median
for the cell (R, f). A *pass* visits every cell that is not yet precise, in a seeded
random order (so slow drift does not line up with R or f). The run stops when every
cell has at least ``min_passes`` rounds, the relative standard error of 90% of the
cells' estimates is below ``precision`` and the fitted curve moved on average less than
``precision / 2`` since the previous pass (:meth:`ActiveProfiler.converged`); or at
``max_time`` / ``max_passes``.

SGLang's step records are cleared before each round (``dspark_clear_info_records``;
``--keep-records`` keeps them) so the ``/server_info`` reply the profiler polls stays
small: with thousands of records one read costs the server a few hundred milliseconds,
which would land in the very steps being measured.

Failures: a failed request is retried as part of its round; a round whose requests all
fail, or during which the server restarted (its ``forward_ct`` went backwards or its
launch identity changed), is discarded and repeated after the server answers
``/health`` again (waiting up to ``restart_wait_s``). State is checkpointed after every
round (``OUT.partial.json``); anything unrecoverable stops with a message and exit code
1 and ``--resume`` continues from the checkpoint. A profile file is only written once
every cell was measured at least once.

Passive (``dspark-controller profile --from-controller ADDR``)
--------------------------------------------------------------
Asks a running controller (its CLI socket) for the profile it learned from live worker
telemetry and writes it as a profile file (same schema).
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TextIO

import numpy as np

from dspark_controller.core.profile_file import EngineFingerprint, Measurement, ProfileFile, save_profile
from dspark_controller.profiling.tools import ProfileToolError, build_profile, write_json_atomic
from dspark_controller.core.sps_model import SpsModel

__all__ = ["ProfilingError", "ServerGone", "ProfileSettings", "HttpServer", "ServerContext", "Progress",
           "ActiveProfiler", "RunResult", "fetch_from_controller", "ZERO_FRAC"]

CHECKPOINT_FORMAT = 1
ZERO_FRAC = 1e-6            # SGLang wants a fraction in (0, 1]; int(1e-6 * R * gamma) = 0 draft tokens


class ProfilingError(RuntimeError):
    """The profile could not be made (the message says why and how to continue)."""


class ServerGone(ProfilingError):
    """The server stopped answering, or restarted (its state is gone)."""


# ------------------------------------------------------------------ settings
@dataclass
class ProfileSettings:
    url: str
    out: str
    concurrency: Optional[list[int]] = None        # None: powers of two up to the server's max
    fractions: list[float] = field(default_factory=lambda: [1.0, 0.75, 0.5, 0.25, 0.0])
    steps_per_round: int = 12
    warmup_steps: int = 2
    precision: float = 0.05
    min_passes: int = 2
    max_passes: int = 8
    max_time_s: float = 600.0
    round_timeout_s: float = 120.0
    request_timeout_s: float = 300.0
    restart_wait_s: float = 300.0
    max_retries: int = 3
    heldout_frac: float = 0.1
    seed: int = 0
    device_name: Optional[str] = None
    time_field: str = "step_cpu_ms"
    clear_records: bool = True
    checkpoint: Optional[str] = None
    resume: bool = False
    command: str = ""

    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint else Path(str(self.out) + ".partial.json")

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must look like http://HOST:PORT, got {self.url!r}")
        if self.concurrency is not None and (not self.concurrency or min(self.concurrency) < 1):
            raise ValueError("--concurrency needs positive request counts, e.g. 1,2,4,8")
        if not self.fractions or any(not (0.0 <= f <= 1.0) for f in self.fractions):
            raise ValueError("--fractions must be numbers in [0, 1] (0 = verify no draft token)")
        if self.steps_per_round < 2 or self.warmup_steps < 0:
            raise ValueError("--steps-per-round must be >= 2 and --warmup-steps >= 0")
        if not 0.0 < self.precision < 1.0:
            raise ValueError("--precision is a relative standard error in (0, 1), e.g. 0.05")
        if self.min_passes < 1 or self.max_passes < self.min_passes:
            raise ValueError("need 1 <= --min-passes <= --max-passes")
        if not self.max_time_s > 0 or not self.round_timeout_s > 0:
            raise ValueError("--max-time and --round-timeout must be > 0")
        if not 0.0 <= self.heldout_frac < 0.9:
            raise ValueError("--heldout must be in [0, 0.9)")
        if self.time_field not in ("step_cpu_ms", "step_gpu_ms"):
            raise ValueError("--time-field is step_cpu_ms or step_gpu_ms")


# ------------------------------------------------------------------ HTTP
def internal_state_updated(reply: Any) -> bool:
    """Whether SGLang applied a ``/set_internal_state`` request: its reply is one
    ``{"updated": bool}`` (or a bare bool) per DP rank, alone or in a list; every rank must
    say yes, and an empty reply is no."""
    outs = reply if isinstance(reply, list) else [reply]
    return bool(outs) and all(bool(o.get("updated")) if isinstance(o, dict) else bool(o) for o in outs)


class HttpServer:
    """The few SGLang HTTP endpoints the profiler uses (stdlib only)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = exc.read().decode("utf-8", "replace")[:300]
            except Exception:
                pass
            raise ProfilingError(f"{path}: HTTP {exc.code} {exc.reason} {detail}".strip()) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerGone(f"{self.url}{path}: {reason}") from None
        try:
            return json.loads(raw.decode("utf-8")) if raw else None
        except ValueError:
            raise ProfilingError(f"{path}: the server's reply is not JSON") from None

    def server_info(self) -> dict:
        info = self._call("/server_info")
        if not isinstance(info, dict):
            raise ProfilingError("/server_info did not return a JSON object")
        return info

    def healthy(self) -> bool:
        try:
            req = urllib.request.Request(self.url + "/health")
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status == 200
        except Exception:
            return False

    def set_internal(self, args: dict) -> None:
        out = self._call("/set_internal_state", {"server_args": args})
        if not internal_state_updated(out):
            raise ProfilingError(f"the server refused /set_internal_state {args}: {out}")

    def generate(self, text: str, max_new_tokens: int, *, timeout: float, rid: Optional[str] = None) -> dict:
        body: dict[str, Any] = {"text": text, "sampling_params": {
            "temperature": 0, "max_new_tokens": int(max_new_tokens), "ignore_eos": True}}
        if rid is not None:
            body["rid"] = rid
        out = self._call("/generate", body, timeout=timeout)
        return out if isinstance(out, dict) else {}

    def abort(self, rid: str) -> None:
        """Abort one of our requests (best effort; other clients' requests are never touched)."""
        try:
            self._call("/abort_request", {"rid": rid}, timeout=10)
        except ProfilingError:
            pass


# ------------------------------------------------------------------ server context
@dataclass
class ServerContext:
    mode: str
    gamma: int
    dp_size: int
    tp_size: int
    max_running: int
    instance: str
    fingerprint: EngineFingerprint
    sglang_version: str
    plugin: Optional[dict]

    @property
    def can_force_budget(self) -> bool:
        return self.mode in ("compact", "cap-accept")


def _payloads(info: dict) -> list[dict]:
    states = info.get("internal_states") or []
    return [(s or {}).get("dspark_info_record") or {} for s in states] if states else []


def server_context(info: dict, *, url: str, device_name: Optional[str], warn: Callable[[str], None]) -> ServerContext:
    """Check the server is a DSPARK server with step records, and fingerprint it."""
    algo = info.get("speculative_algorithm")
    if algo != "DSPARK":
        raise ProfilingError(f"{url} runs speculative_algorithm={algo!r}; profile a DSPARK server "
                             "(--speculative-algorithm DSPARK).")
    payloads = _payloads(info)
    if not payloads or not payloads[0]:
        raise ProfilingError(f"{url} reports no dspark_info_record in /server_info internal_states: relaunch the "
                             "server with SGLANG_DSPARK_ENABLE_SPS_RECORD=1 (and SGLANG_RAGGED_VERIFY_MODE=compact "
                             "to sweep the verify budget).")
    p0 = payloads[0]
    comps = set(p0.get("components") or [])
    if not {"core", "step_cpu_time"} <= comps:
        raise ProfilingError(f"the server records components {sorted(comps)}; the profiler needs core and "
                             "step_cpu_time: relaunch with SGLANG_DSPARK_ENABLE_SPS_RECORD=1.")
    gamma = int(p0.get("gamma") or (int(p0.get("verify_num_draft_tokens", 1)) - 1))
    if gamma < 1:
        raise ProfilingError(f"the server reports gamma={gamma}; cannot profile verify budgets")
    st0 = (info.get("internal_states") or [{}])[0] or {}
    dp = int(info.get("dp_size") or 1)
    tp = int(info.get("tp_size") or 1)
    per_dp = st0.get("effective_max_running_requests_per_dp") or info.get("max_running_requests") or 16
    max_running = max(1, int(per_dp))
    version = str(info.get("version") or "")
    device = str(info.get("device") or "")
    plugin = p0.get("sglang_dspark") if isinstance(p0.get("sglang_dspark"), dict) else None
    if device_name is None and plugin and plugin.get("device_name"):
        device_name = str(plugin["device_name"])
    if device_name is None:
        host = urllib.parse.urlparse(url).hostname or ""
        if device in ("cpu", "") and host in ("127.0.0.1", "localhost", "::1"):
            import platform

            # the same name sglang_dspark's worker registers with the controller
            device_name = f"cpu:{platform.machine()}:{os.cpu_count()}cores"
        else:
            device_name = device or "unknown"
            warn(f"device name unknown (server device {device!r}); the profile is keyed as {device_name!r}. Pass "
                 "--device-name (e.g. 'NVIDIA H200', as torch.cuda.get_device_name reports it) so the controller "
                 "matches this profile to the engine.")
    fp = EngineFingerprint(target_model=str(info.get("model_path") or "unknown"),
                           draft_model=str(info.get("speculative_draft_model_path") or ""), gamma=gamma,
                           device_name=device_name, tp_size=tp, dp_size=dp, dtype=str(info.get("dtype") or ""),
                           attention_backend=str(info.get("attention_backend") or ""), sglang_version=version)
    instance = json.dumps([info.get("random_seed"), info.get("model_path"), info.get("port"),
                           info.get("speculative_draft_model_path")], default=str)
    return ServerContext(mode=str(p0.get("mode") or ""), gamma=gamma, dp_size=dp, tp_size=tp,
                         max_running=max_running, instance=instance, fingerprint=fp, sglang_version=version,
                         plugin=plugin)


# ------------------------------------------------------------------ progress
def _fmt_dur(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """A progress bar with an ETA on a TTY (one rewritten line), plain lines otherwise."""

    def __init__(self, stream: Optional[TextIO] = None, *, enabled: bool = True, width: int = 28) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self._line_open = False

    def update(self, frac: float, text: str, *, elapsed: float, eta: float) -> None:
        if not self.enabled:
            return
        frac = min(1.0, max(0.0, frac))
        if self.tty:
            n = int(round(frac * self.width))
            bar = "#" * n + "-" * (self.width - n)
            line = f"\r[{bar}] {100 * frac:3.0f}% {text} | {_fmt_dur(elapsed)} elapsed, ETA {_fmt_dur(eta)}"
            self.stream.write(line[:200].ljust(120) if len(line) < 120 else line[:200])
            self._line_open = True
        else:
            self.stream.write(f"profile: {100 * frac:3.0f}% {text} | elapsed {_fmt_dur(elapsed)}, "
                              f"ETA {_fmt_dur(eta)}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if not self.enabled and not text.startswith(("warning", "error")):
            return
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
        self.stream.write(f"profile: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self._line_open:
            self.stream.write("\n")
            self.stream.flush()
            self._line_open = False


# ------------------------------------------------------------------ the profiler
@dataclass
class RoundRecord:
    pass_no: int
    R: int
    frac: float
    ok: bool
    n_target: int
    median_s: Optional[float]
    mad_rel: Optional[float]
    n_samples: int
    wall_s: float
    max_new_tokens: int
    tokens_per_req_step: Optional[float]
    note: str = ""


@dataclass
class RunResult:
    profile: ProfileFile
    out: str
    converged: bool
    passes: int
    rounds: int
    samples: int
    wall_s: float
    cells: list[dict]
    heldout: dict
    warnings: list[str]


def default_levels(max_running: int) -> list[int]:
    levels = [1]
    while levels[-1] * 2 <= max_running:
        levels.append(levels[-1] * 2)
    if levels[-1] != max_running:
        levels.append(max_running)
    return levels


class ActiveProfiler:
    """Sweeps concurrency x budget fraction on a live server until the estimates are stable."""

    def __init__(self, settings: ProfileSettings, *, progress: Optional[Progress] = None,
                 server: Optional[HttpServer] = None, clock: Callable[[], float] = time.monotonic) -> None:
        settings.validate()
        self.s = settings
        self.progress = progress or Progress(enabled=False)
        self.server = server or HttpServer(settings.url)
        self.clock = clock
        self.samples: list[list[float]] = []          # [R, B, t, round_id]
        self.rounds: list[RoundRecord] = []
        self.warnings: list[str] = []
        self.ctx: Optional[ServerContext] = None
        self.cells: list[tuple[int, float]] = []
        self.mnt: dict[str, int] = {}                 # cell -> max_new_tokens for its next round
        self.tps: dict[str, float] = {}               # frac -> tokens per request-step
        self.pass_no = 0
        self.elapsed_before = 0.0
        self._t0 = 0.0
        self._fit_prev: Optional[np.ndarray] = None
        self._fit_change: Optional[float] = None
        self._watermarks: list[int] = []
        self._forced = False

    # ---------------------------------------------------------------- helpers
    def warn(self, msg: str) -> None:
        if msg in self.warnings:
            return
        self.warnings.append(msg)
        self.progress.message("warning: " + msg)

    @staticmethod
    def cell_key(r: int, f: float) -> str:
        return f"{r}:{f:g}"

    def elapsed(self) -> float:
        return self.elapsed_before + (self.clock() - self._t0)

    # ---------------------------------------------------------------- server state
    def _info(self) -> dict:
        return self.server.server_info()

    def _connect(self) -> None:
        try:
            info = self._info()
        except ProfilingError as exc:
            if isinstance(exc, ServerGone):
                raise ProfilingError(f"cannot reach the server: {exc}. Is it running at {self.s.url}?") from None
            # a fresh server can fail /server_info (HTTP 500: a NaN in its JSON) until it ran some decode
            # steps; a few warm-up requests fix that
            self.progress.message(f"/server_info failed ({exc}); sending warm-up requests and retrying")
            info = None
            for attempt in range(4):
                try:
                    self.server.generate(f"def warm_up_{attempt}(x):", 64, timeout=self.s.request_timeout_s)
                except ProfilingError:
                    pass
                try:
                    info = self._info()
                    break
                except ServerGone:
                    raise
                except ProfilingError:
                    if attempt == 3:
                        raise
        ctx = server_context(info, url=self.s.url, device_name=self.s.device_name, warn=self.warn)
        if self.ctx is not None and ctx.fingerprint != self.ctx.fingerprint:
            raise ProfilingError("the server now reports a different engine (model, draft, gamma, device, ...) than "
                                 f"the one this profile measured:\n  before: {self.ctx.fingerprint.model_dump()}\n  "
                                 f"now:    {ctx.fingerprint.model_dump()}")
        self.ctx = ctx

    def _wait_for_server(self, why: str) -> None:
        deadline = self.clock() + self.s.restart_wait_s
        self.progress.message(f"server unavailable ({why}); waiting up to {self.s.restart_wait_s:.0f}s for it")
        while self.clock() < deadline:
            if self.server.healthy():
                try:
                    old = self.ctx.instance if self.ctx else None
                    self._connect()
                    if old is not None and self.ctx.instance != old:
                        self.progress.message("the server restarted (new instance); continuing with it")
                    return
                except ProfilingError as exc:
                    if "different engine" in str(exc):
                        raise
                    why = str(exc)
            time.sleep(2.0)
        raise ServerGone(f"the server at {self.s.url} did not come back within {self.s.restart_wait_s:.0f}s "
                         f"(last problem: {why})")

    def _force(self, frac: Optional[float]) -> None:
        self.server.set_internal({"dspark_force_budget_frac": frac})
        self._forced = frac is not None

    def release(self) -> None:
        """Give the server its own budget decisions back (best effort).

        SGLang's handler accepts ``null`` to clear the pinned fraction, but SGLang 0.5.23's
        HTTP request schema (``Dict[str, Union[int, float]]``) refuses it with HTTP 400.
        Then sglang-dspark's own key (``dspark_unpin_budget``, on servers with our plugin)
        lifts the pin.  A server with neither is left at 1.0 (verify every draft token:
        what SGLang does with no SPS table) and the user is told to restart it.
        """
        if not self._forced:
            return
        self._forced = False
        try:
            self.server.set_internal({"dspark_force_budget_frac": None})
            return
        except ServerGone as exc:
            self.warn(f"could not clear the forced budget fraction ({exc}); if the server is still up it keeps "
                      "the last pinned fraction until it restarts")
            return
        except ProfilingError as exc:
            import re

            m = re.search(r"HTTP \d+", str(exc))
            first = f"it answered {m.group(0)}" if m else str(exc).splitlines()[0][:120]
        try:
            self.server.set_internal({"dspark_unpin_budget": 1})   # sglang_dspark/internal_state.py
            return
        except ProfilingError:
            pass
        try:
            self.server.set_internal({"dspark_force_budget_frac": 1.0})
            self.warn(f"the server refused to clear the pinned verify-budget fraction ({first}; SGLang 0.5.23's "
                      "/set_internal_state schema does not accept null, and the server has no sglang-dspark "
                      "plugin, whose dspark_unpin_budget key would), so it is left at 1.0: verify every "
                      "draft token, SGLang's behaviour without an SPS table. Restart the server to give it its own "
                      "budget decisions back.")
        except ProfilingError as exc:
            self.warn(f"could not reset the pinned verify-budget fraction ({exc}); restart the server to give it "
                      "its own budget decisions back")

    def _records(self, info: dict) -> list[list[dict]]:
        return [list(p.get("records") or []) for p in _payloads(info)]

    # ---------------------------------------------------------------- one round
    def run_round(self, r: int, frac: float) -> RoundRecord:
        """One measurement round for cell (R, frac); repeats after failures/restarts."""
        last = ""
        for attempt in range(self.s.max_retries + 1):
            if attempt:
                self.progress.message(f"retrying R={r} frac={frac:g} (attempt {attempt + 1}): {last}")
            try:
                return self._round_once(r, frac)
            except ServerGone as exc:
                last = str(exc)
                self._wait_for_server(last)
            except ProfilingError as exc:
                last = str(exc)
                if "refused /set_internal_state" in last:
                    raise
                time.sleep(1.0)
        raise ProfilingError(f"cell R={r} frac={frac:g} failed {self.s.max_retries + 1} times; last problem: {last}")

    def _instance(self, info: dict) -> str:
        return server_context(info, url=self.s.url, device_name=self.s.device_name, warn=lambda m: None).instance

    def _new_records(self, info: dict, wms: list[int]) -> list[list[dict]]:
        """Records after the watermarks, per DP rank; raises ServerGone on a restart."""
        if self.ctx is not None and self._instance(info) != self.ctx.instance:
            raise ServerGone("the server restarted during the round (new launch identity)")
        after = self._records(info)
        if len(after) != len(wms):
            raise ServerGone(f"the server now reports {len(after)} DP ranks instead of {len(wms)}")
        new: list[list[dict]] = []
        for recs, wm in zip(after, wms):
            mx = max((int(x.get("forward_ct", -1)) for x in recs), default=-1)
            if wm >= 0 and mx < wm and not self.s.clear_records:
                raise ServerGone("the server restarted during the round (its step counter went backwards)")
            sel = [x for x in recs if int(x.get("forward_ct", -1)) > wm]
            sel.sort(key=lambda x: int(x.get("forward_ct", 0)))
            new.append(sel)
        return new

    def _timed_at(self, new: list[list[dict]], r: int) -> int:
        tf = self.s.time_field
        return min((sum(1 for x in recs if x.get(tf) is not None and int(x.get("num_running_reqs", -1)) == r)
                    for recs in new), default=0)

    def _round_once(self, r: int, frac: float) -> RoundRecord:
        """Pin the fraction, run R requests until enough timed steps at R, stop them, read the records.

        Requests carry our own ``rid`` so the round ends by aborting exactly them (never
        other clients' requests). Progress is checked by reading ``/server_info`` every
        second or so (cheap next to a decode step; SGLang serialises its records between
        steps).
        """
        ctx = self.ctx
        assert ctx is not None
        t_start = self.clock()
        if ctx.can_force_budget:
            self._force(ZERO_FRAC if frac <= 0 else float(frac))
        if self.s.clear_records:
            try:
                self.server.set_internal({"dspark_clear_info_records": 1})
            except ProfilingError:
                pass
        info = self._info()
        if self._instance(info) != ctx.instance:
            raise ServerGone("the server restarted (new launch identity)")
        wms = [max((int(x.get("forward_ct", -1)) for x in recs), default=-1) for recs in self._records(info)]
        key = self.cell_key(r, frac)
        tps = self.tps.get(f"{frac:g}", 1.0 + 0.5 * frac * ctx.gamma)
        need = self.s.steps_per_round + self.s.warmup_steps
        # generous: the round normally ends by abort once `need` steps at R are recorded
        mnt = self.mnt.get(key) or int(min(4096, max(16, math.ceil(2.0 * (need + 4) * tps) + 8)))
        n_req = r * ctx.dp_size
        errors: list[str] = []
        stopping = threading.Event()
        tag = f"dspark-profile-{os.getpid()}-{len(self.rounds)}-{random.getrandbits(32):08x}"
        rids = [f"{tag}-{i}" for i in range(n_req)]

        def one(i: int) -> None:
            text = f"# request {i} {tag}\ndef function_{i}(x):"
            try:
                self.server.generate(text, mnt, timeout=self.s.round_timeout_s + 30, rid=rids[i])
            except ProfilingError as exc:
                if not stopping.is_set():
                    errors.append(str(exc))

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n_req)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.s.round_timeout_s
        prev = self.cell_stats(r, frac)
        est = (prev["median_ms"] or 100.0) / 1e3
        timed_out = False
        enough = False
        alive: list[int] = []

        def nap(seconds: float) -> None:
            end = min(time.monotonic() + seconds, deadline)
            while time.monotonic() < end and any(t.is_alive() for t in threads):
                time.sleep(0.05)

        try:
            nap(min(3.0, max(0.3, est * need * 0.5)))
            while any(t.is_alive() for t in threads):
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                n_at = self._timed_at(self._new_records(self._info(), wms), r)
                if n_at >= need:
                    enough = True
                    break
                nap(min(3.0, max(0.5, est * max(1, need - n_at))))
        finally:
            stopping.set()
            alive = [i for i, t in enumerate(threads) if t.is_alive()]
            for i in alive:
                self.server.abort(rids[i])
            for t in threads:
                t.join(15.0)
        if len(errors) == n_req:
            gone = [e for e in errors if "HTTP" not in e]
            if gone:
                raise ServerGone(f"all {n_req} requests failed: {gone[0]}")
            raise ProfilingError(f"all {n_req} requests failed: {errors[0]}")
        new = self._new_records(self._info(), wms)
        round_id = len(self.rounds)
        tf = self.s.time_field
        target: list[float] = []
        n_samples = 0
        req_steps = 0
        for recs in new:
            timed = 0
            for x in recs:
                rr = int(x.get("num_running_reqs", -1))
                bb = int(x.get("num_verify_tokens", -1))
                if rr >= 1:
                    req_steps += rr
                ms = x.get(tf)
                # only steady steps at R: ramp-up and tail steps share their step with prefills,
                # finishing requests and HTTP replies, and measure slower than the batch alone
                if ms is None or rr != r or bb < rr:
                    continue
                timed += 1
                if timed <= self.s.warmup_steps:
                    continue
                t = float(ms) / 1e3
                if not (t > 0 and math.isfinite(t)):
                    continue
                self.samples.append([rr, bb, t, round_id])
                n_samples += 1
                target.append(t)
        finished_naturally = not alive and not errors
        tps_obs = n_req * max(0, mnt - 1) / req_steps if req_steps and finished_naturally else None
        if tps_obs is not None and tps_obs > 0:
            old = self.tps.get(f"{frac:g}")
            self.tps[f"{frac:g}"] = tps_obs if old is None else 0.5 * (old + tps_obs)
        got = len(target)
        if not enough and finished_naturally and got < self.s.steps_per_round:
            # the requests ended before enough steps at R: make the next round's requests longer
            self.mnt[key] = int(min(4096, mnt * 2))
        else:
            self.mnt[key] = mnt
        note = ""
        if errors:
            note = f"{len(errors)}/{n_req} requests failed ({errors[0][:120]})"
            self.warn(f"R={r} frac={frac:g}: {note}; kept the {n_samples} steps that ran")
        if timed_out:
            note = (note + "; " if note else "") + f"round timed out after {self.s.round_timeout_s:.0f}s"
            self.warn(f"R={r} frac={frac:g}: only {got} timed steps at R within --round-timeout "
                      f"{self.s.round_timeout_s:.0f}s (steps over 1 s are not timed by SGLang); stopped the round")
        med = float(np.median(target)) if target else None
        mad = float(np.median(np.abs(np.log(np.asarray(target) / med)))) if target else None
        rec = RoundRecord(pass_no=self.pass_no, R=r, frac=float(frac), ok=got >= 3, n_target=got, median_s=med,
                          mad_rel=mad, n_samples=n_samples, wall_s=self.clock() - t_start, max_new_tokens=mnt,
                          tokens_per_req_step=tps_obs, note=note)
        self.rounds.append(rec)
        return rec

    # ---------------------------------------------------------------- statistics
    def cell_stats(self, r: int, f: float) -> dict:
        rs = [x for x in self.rounds if x.R == r and x.frac == f and x.ok and x.median_s]
        k = len(rs)
        if k == 0:
            return {"R": r, "frac": f, "rounds": 0, "steps": 0, "median_ms": None, "rel_se": math.inf}
        meds = np.asarray([x.median_s for x in rs])
        n = np.asarray([x.n_target for x in rs], dtype=np.float64)
        mean = float(np.mean(meds))
        within = float(np.median([x.mad_rel for x in rs])) * 1.4826 * 1.2533 / math.sqrt(max(1.0, n.sum()))
        between = float(np.std(meds, ddof=1)) / mean / math.sqrt(k) if k >= 2 else math.inf
        return {"R": r, "frac": f, "rounds": k, "steps": int(n.sum()), "median_ms": 1e3 * float(np.median(meds)),
                "rel_se": max(within, between)}

    def cell_done(self, st: dict) -> bool:
        return st["rounds"] >= self.s.min_passes and st["rel_se"] <= self.s.precision

    def _fit_grid(self) -> Optional[np.ndarray]:
        arr = np.asarray([x[:3] for x in self.samples], dtype=np.float64)
        if arr.shape[0] < 16 or self.ctx is None:
            return None
        model = SpsModel()
        for i in np.random.default_rng(self.s.seed).permutation(arr.shape[0]).tolist():
            model.update(int(arr[i, 0]), int(arr[i, 1]), float(arr[i, 2]))
        if not model.ready:
            return None
        g = self.ctx.gamma
        pts = []
        for r, f in self.cells:
            pts.append((r, r + int((ZERO_FRAC if f <= 0 else f) * r * g)))
        return np.asarray([model.predict_step_time(r, b) for r, b in pts], dtype=np.float64)

    def converged(self) -> bool:
        """Stable: every cell measured ``min_passes`` times, at least 90% of the cells precise to
        ``precision`` (relative standard error of their median), and the fitted curve moved on
        average less than ``precision / 2`` at the cells since the previous pass."""
        stats = [self.cell_stats(r, f) for r, f in self.cells]
        enough = all(s["rounds"] >= self.s.min_passes for s in stats)
        precise = sum(1 for s in stats if self.cell_done(s)) >= 0.9 * len(stats)
        cells_ok = enough and precise
        grid = self._fit_grid()
        if grid is not None and self._fit_prev is not None:
            self._fit_change = float(np.mean(np.abs(grid - self._fit_prev) / self._fit_prev))
        else:
            self._fit_change = None
        self._fit_prev = grid
        fit_ok = self._fit_change is not None and self._fit_change <= self.s.precision / 2
        return cells_ok and fit_ok

    def _eta(self, todo_this_pass: list[tuple[int, float]]) -> tuple[float, float]:
        """(fraction done, seconds left) from measured round times and each cell's precision."""
        wall: dict[tuple[int, float], list[float]] = {}
        for x in self.rounds:
            wall.setdefault((x.R, x.frac), []).append(x.wall_s)
        mean_all = float(np.mean([x.wall_s for x in self.rounds])) if self.rounds else 10.0

        def cost(c: tuple[int, float]) -> float:
            w = wall.get(c)
            return float(np.mean(w)) if w else mean_all

        left = sum(cost(c) for c in todo_this_pass)
        for c in self.cells:
            st = self.cell_stats(*c)
            k = st["rounds"] + (1 if c in todo_this_pass else 0)
            need = self.s.min_passes - k
            if st["rounds"] >= 2 and math.isfinite(st["rel_se"]):
                need = max(need, int(math.ceil(st["rounds"] * (st["rel_se"] / self.s.precision) ** 2)) - k)
            elif st["rounds"] < 2:
                need = max(need, 0)
            left += max(0, need) * cost(c)
        done = sum(x.wall_s for x in self.rounds)
        remaining_budget = max(0.0, self.s.max_time_s - self.elapsed())
        left = min(left, remaining_budget)
        return (done / (done + left) if done + left > 0 else 0.0), left

    # ---------------------------------------------------------------- checkpoint
    def checkpoint(self) -> None:
        assert self.ctx is not None
        state = {"format": CHECKPOINT_FORMAT, "url": self.s.url, "fingerprint": self.ctx.fingerprint.model_dump(),
                 "cells": [[r, f] for r, f in self.cells], "pass_no": self.pass_no, "elapsed_s": self.elapsed(),
                 "samples": self.samples, "rounds": [asdict(x) for x in self.rounds], "mnt": self.mnt,
                 "tps": self.tps, "warnings": self.warnings[-50:], "command": self.s.command}
        write_json_atomic(self.s.checkpoint_path(), state)

    def load_checkpoint(self) -> None:
        p = self.s.checkpoint_path()
        try:
            state = json.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ProfilingError(f"--resume: cannot read the checkpoint {p}: {exc}") from None
        except ValueError:
            raise ProfilingError(f"--resume: {p} is not a readable checkpoint (corrupt JSON)") from None
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ProfilingError(f"--resume: {p} has checkpoint format {state.get('format')!r}, expected "
                                 f"{CHECKPOINT_FORMAT}")
        assert self.ctx is not None
        fp = EngineFingerprint(**state["fingerprint"])
        if fp != self.ctx.fingerprint:
            raise ProfilingError(f"--resume: the checkpoint {p} was measured on a different engine:\n  checkpoint: "
                                 f"{fp.model_dump()}\n  server:     {self.ctx.fingerprint.model_dump()}")
        self.cells = [(int(r), float(f)) for r, f in state["cells"]]
        self.pass_no = int(state.get("pass_no", 0))
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.samples = [list(x) for x in state.get("samples", [])]
        self.rounds = [RoundRecord(**x) for x in state.get("rounds", [])]
        self.mnt = {str(k): int(v) for k, v in (state.get("mnt") or {}).items()}
        self.tps = {str(k): float(v) for k, v in (state.get("tps") or {}).items()}
        self.progress.message(f"resuming from {p}: {len(self.rounds)} rounds, {len(self.samples)} samples, "
                              f"{_fmt_dur(self.elapsed_before)} already spent")

    # ---------------------------------------------------------------- main loop
    def _plan_cells(self) -> None:
        ctx = self.ctx
        assert ctx is not None
        levels = self.s.concurrency or default_levels(ctx.max_running)
        too_big = [x for x in levels if x > ctx.max_running]
        if too_big:
            self.warn(f"concurrency {too_big} exceeds the server's max running requests ({ctx.max_running}); "
                      "those requests would queue, so they are dropped from the sweep")
            levels = [x for x in levels if x <= ctx.max_running] or [ctx.max_running]
        fracs = sorted(set(float(f) for f in self.s.fractions), reverse=True)
        if not ctx.can_force_budget and fracs != [1.0]:
            self.warn(f"the server runs SGLANG_RAGGED_VERIFY_MODE={ctx.mode or '?'}, where the verify budget cannot "
                      "be pinned; only verify-all steps (B = R * (gamma + 1)) are measured. Relaunch with "
                      "SGLANG_RAGGED_VERIFY_MODE=compact to profile every budget.")
            fracs = [1.0]
        self.cells = [(int(r), f) for r in sorted(set(levels)) for f in fracs]
        # t(R, B) = theta(B) + alpha(R): per-request and per-token costs are only told apart where
        # two request counts reach the same B (e.g. powers of two with quarter fractions)
        reach: dict[int, set[int]] = {}
        for r, f in self.cells:
            reach.setdefault(r + int((ZERO_FRAC if f <= 0 else f) * r * ctx.gamma), set()).add(r)
        if len({r for r, _ in self.cells}) > 1 and not any(len(v) > 1 for v in reach.values()):
            self.warn("no two request counts in this sweep reach the same batch size B, so the per-request and "
                      "per-token parts of the step time cannot be told apart (the fit may be off between the "
                      "measured points); e.g. use powers of two for --concurrency with --fractions 1,0.75,0.5,0.25,0")

    def run(self) -> RunResult:
        self._t0 = self.clock()
        self._connect()
        assert self.ctx is not None
        if self.s.resume:
            self.load_checkpoint()
        else:
            self._plan_cells()
        self.progress.message(
            f"{self.s.url}: {Path(self.ctx.fingerprint.target_model).name} + "
            f"{Path(self.ctx.fingerprint.draft_model).name}, gamma={self.ctx.gamma}, mode={self.ctx.mode}, "
            f"max running {self.ctx.max_running}; {len(self.cells)} cells (R x fraction) per pass, precision "
            f"{100 * self.s.precision:g}%, time limit {_fmt_dur(self.s.max_time_s)}")
        rng = random.Random(self.s.seed)
        converged = False
        out_of_time = False
        try:
            if not self.rounds:
                # warm-up: first steps of a fresh server (allocator, caches) are not representative
                r0 = min(4, self.ctx.max_running)
                self.progress.message(f"warm-up round (R={r0}, not recorded)")
                self.run_round(r0, 1.0)
                self.rounds.clear()
                self.samples.clear()
            while True:
                stats = {c: self.cell_stats(*c) for c in self.cells}
                todo = [c for c in self.cells if not self.cell_done(stats[c])]
                if not todo and self.pass_no >= self.s.min_passes:
                    todo = list(self.cells)        # cells precise but the fit still moved: one more pass
                self.pass_no += 1
                rng.shuffle(todo)
                for i, (r, f) in enumerate(todo):
                    if self.elapsed() >= self.s.max_time_s:
                        out_of_time = True
                        break
                    frac_done, eta = self._eta(todo[i:])
                    self.progress.update(frac_done, f"pass {self.pass_no} cell {i + 1}/{len(todo)} R={r} "
                                         f"frac={f:g}", elapsed=self.elapsed(), eta=eta)
                    rec = self.run_round(r, f)
                    self.checkpoint()
                    if not self.progress.tty:
                        med = "-" if rec.median_s is None else f"{1e3 * rec.median_s:.1f} ms"
                        self.progress.message(f"  R={r} frac={f:g}: {rec.n_target} steps at R (median {med}), "
                                              f"{rec.n_samples} samples, {rec.wall_s:.1f}s")
                if out_of_time:
                    break
                converged = self.converged()
                fc = "n/a" if self._fit_change is None else f"{100 * self._fit_change:.1f}%"
                worst = max((self.cell_stats(*c)["rel_se"] for c in self.cells), default=math.inf)
                self.progress.message(f"pass {self.pass_no} done: {len(self.samples)} samples, worst cell "
                                      f"precision {100 * worst:.1f}% (target {100 * self.s.precision:g}%), fit "
                                      f"moved {fc} since the previous pass")
                if converged or self.pass_no >= self.s.max_passes:
                    break
                if self.elapsed() >= self.s.max_time_s:
                    out_of_time = True
                    break
        finally:
            self.release()
            self.progress.close()
        unmeasured = [c for c in self.cells if self.cell_stats(*c)["rounds"] == 0]
        if unmeasured:
            raise ProfilingError(
                f"{len(unmeasured)} of {len(self.cells)} cells were never measured (time limit "
                f"{_fmt_dur(self.s.max_time_s)} reached after {_fmt_dur(self.elapsed())}): "
                f"{', '.join(f'R={r}/frac={f:g}' for r, f in unmeasured[:8])}. No profile written; the "
                f"measurements are kept in {self.s.checkpoint_path()}: rerun with --resume and a larger --max-time.")
        if not converged:
            why = "time limit" if out_of_time else f"--max-passes {self.s.max_passes}"
            self.warn(f"stopped at the {why} before every estimate reached {100 * self.s.precision:g}% precision; "
                      "the profile is written but less precise than asked (see the cell table)")
        return self._finish(converged)

    def _finish(self, converged: bool) -> RunResult:
        assert self.ctx is not None
        try:
            pf, model, err = build_profile([x[:3] for x in self.samples], fingerprint=self.ctx.fingerprint,
                                           command=self.s.command, heldout_frac=self.s.heldout_frac,
                                           seed=self.s.seed,
                                           measurement=Measurement(converged=converged, precision=self.s.precision,
                                                                   passes=self.pass_no, rounds=len(self.rounds),
                                                                   wall_s=round(self.elapsed(), 1)))
        except ProfileToolError as exc:
            raise ProfilingError(f"{exc}; measurements kept in {self.s.checkpoint_path()}") from None
        if err.n and err.mape > 0.25:
            self.warn(f"the measurements are very noisy: the fit misses held-out steps by {100 * err.mape:.0f}% on "
                      "average. Is something else running on this machine? Profiles are best measured on an "
                      "otherwise idle server (compare with `dspark-controller diff` after re-profiling).")
        save_profile(self.s.out, pf)
        try:
            self.s.checkpoint_path().unlink()
        except OSError:
            pass
        cells = [self.cell_stats(r, f) for r, f in self.cells]
        return RunResult(profile=pf, out=str(self.s.out), converged=converged, passes=self.pass_no,
                         rounds=len(self.rounds), samples=len(self.samples), wall_s=self.elapsed(), cells=cells,
                         heldout=err.to_dict(), warnings=self.warnings)


# ------------------------------------------------------------------ launching a server
class LaunchedServer:
    """``profile --launch CMD``: start the server command, wait for ``/health``, stop it afterwards.

    The child gets ``SGLANG_DSPARK_ENABLE_SPS_RECORD=1`` and ``SGLANG_RAGGED_VERIFY_MODE=compact``
    unless the environment already sets them; a missing ``--port`` is added; a leading
    ``python`` means this CLI's own interpreter. It runs in its own
    process group, which is terminated (then killed) at the end.
    """

    def __init__(self, command: str, *, log_path: Optional[str] = None, startup_timeout_s: float = 900.0,
                 message: Callable[[str], None] = lambda m: None) -> None:
        import shlex

        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError("--launch needs the server command, e.g. \"python -m sglang.launch_server ...\"")
        if self.argv[0] in ("python", "python3"):
            self.argv[0] = sys.executable          # the interpreter running this CLI (its venv has SGLang)
        if "--port" not in self.argv:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
            self.argv += ["--port", str(port)]
        self.port = int(self.argv[self.argv.index("--port") + 1])
        host = self.argv[self.argv.index("--host") + 1] if "--host" in self.argv else "127.0.0.1"
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{self.port}"
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.message = message
        self.proc: Any = None
        self._log: Any = None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])  # type: ignore[arg-type]
        except (OSError, TypeError):
            return "(no log)"

    def __enter__(self) -> "LaunchedServer":
        import subprocess
        import tempfile

        if self.log_path is None:
            self.log_path = tempfile.mkstemp(prefix="dspark-profile-server-", suffix=".log")[1]
        env = dict(os.environ)
        env.setdefault("SGLANG_DSPARK_ENABLE_SPS_RECORD", "1")
        env.setdefault("SGLANG_RAGGED_VERIFY_MODE", "compact")
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log = open(self.log_path, "w")
        self.message(f"launching: {' '.join(self.argv)} (log: {self.log_path})")
        try:
            self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise ProfilingError(f"--launch: cannot start {self.argv[0]!r}: {exc}") from None
        http = HttpServer(self.url)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._close()
                raise ProfilingError(f"the launched server exited with code {self.proc.returncode} while starting; "
                                     f"last lines of {self.log_path}:\n{self.log_tail()}")
            if http.healthy():
                self.message(f"server up at {self.url}")
                return self
            time.sleep(1.0)
        self.__exit__(None, None, None)
        raise ProfilingError(f"the launched server did not answer {self.url}/health within "
                             f"{self.startup_timeout_s:.0f}s; last lines of {self.log_path}:\n{self.log_tail()}")

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __exit__(self, *exc: Any) -> None:
        import signal
        import subprocess

        if self.proc is not None:
            for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    if sig == signal.SIGTERM:
                        try:                  # the group may still hold children (scheduler, detokenizer)
                            os.killpg(self.proc.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._close()


# ------------------------------------------------------------------ passive
def _controller_request(address: str, msg: Any, *, timeout: float, curve: Optional[tuple] = None,
                        max_bytes: int = 256 << 20) -> Any:
    import zmq

    from dspark_controller.service.protocol import DecodeError, decode_frames, encode

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            server_key, (pub, sec) = curve
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_key, pub, sec
        sock.connect(address)
        sock.send_multipart(encode(msg))
        if not sock.poll(int(timeout * 1000), zmq.POLLIN):
            raise ProfilingError(f"no reply from the controller at {address} within {timeout:g}s; is "
                                 "`dspark-controller serve` running there (the CLI endpoint is the base port + 2)?")
        try:
            return decode_frames(sock.recv_multipart(), max_bytes=max_bytes)
        except DecodeError as exc:
            raise ProfilingError(f"unreadable reply from the controller ({exc}); version mismatch?") from None
    finally:
        sock.close(0)
        ctx.term()


def fetch_from_controller(address: str, *, profile_key: Optional[str] = None, timeout: float = 10.0,
                          curve: Optional[tuple] = None, min_samples: int = 0,
                          command: str = "") -> tuple[ProfileFile, dict]:
    """The profile a running controller learned from live telemetry, as a profile file.

    Returns ``(profile, info)``; ``info`` has the controller id and the profile's status.
    """
    from dspark_controller.core.profile_file import make_provenance
    from dspark_controller.service.protocol import ErrorReply, ProfileReply, ProfileRequest, StatusReply, StatusRequest

    status = _controller_request(address, StatusRequest(), timeout=timeout, curve=curve)
    if isinstance(status, ErrorReply):
        raise ProfilingError(f"the controller refused: {status.message}")
    if not isinstance(status, StatusReply):
        raise ProfilingError(f"unexpected reply {getattr(status, 'type', '?')!r} from the controller")
    profs = {p.profile_key: p for p in status.profiles}
    if profile_key is None:
        with_data = [p for p in status.profiles if p.samples_seen > 0]
        if len(with_data) == 1:
            profile_key = with_data[0].profile_key
        elif not with_data:
            raise ProfilingError(f"the controller at {address} has no profile with telemetry yet "
                                 f"({len(profs)} profiles, none with samples); connect a worker "
                                 "(SGLANG_DSPARK_CONTROLLER=...) and serve some traffic first.")
        else:
            listing = "\n".join(f"  {p.profile_key}: {p.target_model} on {p.device_name}, gamma={p.gamma}, "
                                f"{p.samples_seen} samples" for p in with_data)
            raise ProfilingError(f"the controller has {len(with_data)} profiles with data; pick one with "
                                 f"--profile-key:\n{listing}")
    if profile_key not in profs:
        raise ProfilingError(f"the controller has no profile {profile_key!r}; it has: "
                             f"{', '.join(sorted(profs)) or 'none'}")
    st = profs[profile_key]
    if not st.ready:
        raise ProfilingError(f"profile {profile_key} has only {st.samples_seen} samples and is not ready yet; "
                             "let the controller learn longer.")
    if st.samples_seen < min_samples:
        raise ProfilingError(f"profile {profile_key} has {st.samples_seen} samples, fewer than --min-samples "
                             f"{min_samples}; let the controller learn longer or lower --min-samples.")
    reply = _controller_request(address, ProfileRequest(profile_key=profile_key), timeout=timeout, curve=curve)
    if isinstance(reply, ErrorReply):
        raise ProfilingError(f"the controller refused: {reply.message}")
    if not isinstance(reply, ProfileReply):
        raise ProfilingError(f"unexpected reply {getattr(reply, 'type', '?')!r} to a profile request; is the "
                             "controller older than this CLI (it needs the profile_request message)?")
    pf = reply.profile
    prov = make_provenance(command=command[:4096] if command else None, created_at=pf.provenance.created_at,
                           sglang_version=pf.fingerprint.sglang_version)
    pf = pf.model_copy(update={"provenance": prov})
    return pf, {"controller_id": status.controller_id, "profile_key": profile_key,
                "samples_seen": pf.samples_seen, "engines": list(st.engines)}
