"""The DSpark controller process.

Sockets (all owned by the single event-loop thread):

* ROUTER ``endpoints.router``: workers send Register, Heartbeat and TelemetryBatch and
  get RegisterAck / HeartbeatAck back.
* PUB ``endpoints.pub``: BudgetDecision (topic ``D|engine|``) and ProfileUpdate (topic
  ``P|profile|``) broadcasts.
* ROUTER ``endpoints.cli``: StatusRequest and SetPolicy from ``dspark-controller``.

Every engine belongs to the profile of its fingerprint (ranks ignored). Each telemetry
step updates that profile's :class:`~dspark_controller.core.sps_model.SpsModel` and the
engine's per-position acceptance estimate (exponentially forgotten Kaplan-Meier counts
from accepted/verified lengths). Decisions are computed at most every
``decision_interval_s`` per engine with :func:`planner.compute_lagged_budget` over the
estimated acceptance (old data by construction, so the budget is lossless to apply) and
published with the learned curve around the engine's batch size; an engine whose request
count has not changed since its last decision gets a new one at most every
``decision_refresh_s`` (its telemetry still updates the profile and the acceptance at
once). Profiles are published every ``profile_publish_s`` and persisted atomically every
``persist_interval_s`` and at shutdown, then reloaded at start.

Nothing a peer sends can stop the loop: bad input is dropped, counted by reason
(``dspark_controller_dropped_messages_total``) and logged rate-limited.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dspark_controller.service.endpoints import DEFAULT_BASE, ConfigError, Endpoints, load_curve_keypair, require_safe_bind
from dspark_controller.core.method import PlanError, PlanPolicy, compute_lagged_budget, fraction_budget
from dspark_controller.core.strategies import profile_takes_step
from dspark_controller.core.profile_file import (ErrorMetrics, ProfileFile, SpsModelState, default_profiles_dir,
                           describe_validation_error, looks_like_profile, make_provenance, profile_path,
                           save_profile)
from dspark_controller.service.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES, BudgetDecision, DecodeError, DropCounter, EngineFingerprint,
    EngineStatus, ErrorReply, Heartbeat, HeartbeatAck, PolicySpec, ProfileReply, ProfileRequest, ProfileStatus,
    ProfileUpdate,
    RateLimitedLog, Register, RegisterAck, SetPolicy, SetPolicyReply, SpsAdditiveTable, SpsTable, StatusReply,
    StatusRequest, StepTelemetry, TelemetryBatch, decode_frames, encode, encode_pub,
)
from dspark_controller.core.sps_model import PriorCurve, SpsModel, SpsModelConfig

__all__ = ["ControllerConfig", "Controller", "load_prior"]

# under policy no_draft, an engine's decision is re-published at least this often (or every
# decision_valid_s / 4 if shorter), telemetry or not: see Controller._tick
NO_DRAFT_REFRESH_S = 0.5
# housekeeping (profile publishes, persistence, gauges) runs at most this often; it is also
# the longest the event loop sleeps with nothing due
HOUSEKEEPING_S = 0.25
# the profile gauges (held-out error: a pass over the held-out samples) are set at most this
# often; Prometheus scrapes every 15 s or so
GAUGE_REFRESH_S = 5.0

logger = logging.getLogger("dspark_controller.service.server")


def _is_key_name(path: Path) -> bool:
    """Named ``<profile_key>.json``, as the controller saves profiles."""
    return looks_like_profile(path, None)


@dataclass(frozen=True)
class ControllerConfig:
    bind: str = DEFAULT_BASE
    pub_bind: Optional[str] = None
    cli_bind: Optional[str] = None
    # None: no persistence; default: a per-user state folder (profile_file.default_profiles_dir)
    profiles_dir: Optional[str] = field(default_factory=default_profiles_dir)
    metrics_port: Optional[int] = None
    metrics_addr: str = "127.0.0.1"
    curve_secret_key_file: Optional[str] = None
    curve_authorized_dir: Optional[str] = None
    policy: PolicySpec = field(default_factory=PolicySpec)
    heartbeat_s: float = 1.0
    engine_timeout_s: float = 10.0
    decision_interval_s: float = 0.1
    # same request count as the last decision: re-decide at most this often (see _tick)
    decision_refresh_s: float = 0.5
    decision_valid_s: float = 5.0
    profile_publish_s: float = 1.0
    persist_interval_s: float = 10.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    model: SpsModelConfig = field(default_factory=SpsModelConfig)
    prior_file: Optional[str] = None
    acceptance_half_life_steps: float = 200.0
    stale_telemetry_s: float = 2.0
    max_learn_steps_per_s: float = 5000.0
    drain_budget_s: float = 0.05
    log_interval_s: float = 5.0
    command: str = ""

    @property
    def stale_refresh_s(self) -> float:
        """How long after its last decision an engine with only new telemetry at the decided
        request count gets a new one: ``decision_refresh_s``, never under
        ``decision_interval_s`` (the least time between two decisions)."""
        return max(self.decision_refresh_s, self.decision_interval_s)

    @property
    def curve_enabled(self) -> bool:
        return bool(self.curve_secret_key_file)

    def endpoints(self) -> Endpoints:
        return Endpoints.derive(self.bind, pub=self.pub_bind, cli=self.cli_bind)

    def validate(self) -> None:
        if bool(self.curve_secret_key_file) != bool(self.curve_authorized_dir):
            raise ConfigError("CurveZMQ needs both --curve-secret-key (the controller's .key_secret) and "
                              "--curve-authorized-dir (a directory of the clients' public .key files)")
        if self.curve_authorized_dir and not Path(self.curve_authorized_dir).is_dir():
            raise ConfigError(f"--curve-authorized-dir {self.curve_authorized_dir} is not a directory")
        require_safe_bind(self.endpoints(), curve_configured=self.curve_enabled)
        for name in ("heartbeat_s", "engine_timeout_s", "decision_interval_s", "decision_refresh_s",
                     "decision_valid_s",
                     "profile_publish_s", "persist_interval_s", "acceptance_half_life_steps",
                     "stale_telemetry_s", "drain_budget_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0")
        self.model.validate()


def load_prior(path: str) -> PriorCurve:
    """A prior from a DSpark profile file or an SGLang SPS table JSON."""
    import json

    try:
        text = Path(path).read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read prior {path}: {exc}") from None
    if isinstance(data, dict) and "profile_key" in data:
        try:
            pf = ProfileFile.model_validate(data)
            return PriorCurve.from_model(SpsModel.from_state(pf.model.model_dump()))
        except Exception as exc:
            raise ConfigError(f"prior {path} is not a usable profile file: {exc}") from None
    try:
        return PriorCurve.from_sglang_table(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"prior {path}: {exc}") from None


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.steps = Counter("dspark_controller_telemetry_steps", "Telemetry steps ingested", ["engine"], registry=r)
        self.messages = Counter("dspark_controller_messages", "Messages received by type", ["type"], registry=r)
        self.dropped = Counter("dspark_controller_dropped_messages", "Dropped messages by reason", ["reason"],
                               registry=r)
        self.decision_latency = Histogram(
            "dspark_controller_decision_latency_seconds", "Time to compute and publish one decision",
            buckets=(1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1), registry=r)
        self.profile_error = Gauge("dspark_controller_profile_prediction_error",
                                   "Held-out mean absolute relative step-time error (a fraction: 0.05 = 5%)",
                                   ["profile"], registry=r)
        self.profile_samples = Gauge("dspark_controller_profile_samples", "Samples learned", ["profile"],
                                     registry=r)
        self.budget = Gauge("dspark_controller_budget_tokens", "Current draft-token budget", ["engine"],
                            registry=r)
        self.engines = Gauge("dspark_controller_engines_connected", "Engines heard from recently", registry=r)
        self.telemetry_rate = Gauge("dspark_controller_telemetry_steps_per_second",
                                    "Telemetry steps per second over the last 5 s", registry=r)


@dataclass
class _Engine:
    engine_id: str
    worker_id: str
    client_nonce: str
    fingerprint: EngineFingerprint
    profile_key: str
    identity: bytes
    last_seen: float
    registered_at: float
    gamma: int
    steps: int = 0
    last_seq: int = -1
    num_requests: int = 0
    acc_trials: np.ndarray = field(default_factory=lambda: np.zeros(0))
    acc_succ: np.ndarray = field(default_factory=lambda: np.zeros(0))
    dirty: bool = False          # re-decide after decision_interval_s (R changed, policy set, ...)
    stale: bool = False          # new telemetry at the decided R: re-decide after decision_refresh_s
    last_decision_at: float = 0.0
    decision_seq: int = 0
    last_decision: Optional[BudgetDecision] = None
    table_sent_at: float = -1e9
    table_profile_seq: int = -1

    def acceptance(self) -> np.ndarray:
        """Per-position conditional acceptance estimate (Beta(1, 1) prior)."""
        return (self.acc_succ + 1.0) / (self.acc_trials + 2.0)


@dataclass
class _Profile:
    key: str
    fingerprint: EngineFingerprint
    model: SpsModel
    created_at: str
    samples_seen: int = 0
    dirty_publish: bool = False
    dirty_persist: bool = False
    last_publish: float = 0.0
    publish_seq: int = 0
    engines: set = field(default_factory=set)
    learn_tokens: float = -1.0
    learn_refill_at: float = 0.0
    metrics_at_samples: int = -1     # samples_seen when the error gauges were last set

    def admit(self, now: float, rate: float) -> bool:
        """Token bucket (burst: 2 s worth): learn at most ``rate`` steps/s for this profile."""
        if rate <= 0:
            return True
        if self.learn_tokens < 0:
            self.learn_tokens = 2.0 * rate
        else:
            self.learn_tokens = min(2.0 * rate, self.learn_tokens + (now - self.learn_refill_at) * rate)
        self.learn_refill_at = now
        if self.learn_tokens >= 1.0:
            self.learn_tokens -= 1.0
            return True
        return False


class Controller:
    """The controller event loop. ``run()`` blocks until ``stop()`` (or SIGTERM in ``serve``)."""

    def __init__(self, *, config: ControllerConfig) -> None:
        config.validate()
        self.config = config
        self.endpoints = config.endpoints()
        self.controller_id = uuid.uuid4().hex[:16]
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.metrics = _Metrics()
        self.drops = DropCounter()
        self._log = RateLimitedLog(logger, interval_s=config.log_interval_s)
        self.policy: PolicySpec = config.policy
        self.engine_policies: dict[str, PolicySpec] = {}
        self.engines: dict[str, _Engine] = {}
        self.profiles: dict[str, _Profile] = {}
        self.counters: dict[str, float] = {"telemetry_steps": 0, "telemetry_batches": 0, "decisions_published": 0,
                                           "profiles_published": 0, "registrations": 0, "heartbeats": 0,
                                           "profiles_persisted": 0, "handshake_failures": 0}
        self._latencies: deque = deque(maxlen=4096)
        self._rate_window: deque = deque()
        self._prior = load_prior(config.prior_file) if config.prior_file else None
        self._running = threading.Event()
        self._stop_req = threading.Event()
        self._ready = threading.Event()
        self._ctx: Optional[zmq.Context] = None
        self._auth = None
        self._last_persist = time.monotonic()
        self._last_housekeeping = 0.0
        self._last_gauges = -math.inf
        self._metrics_server = None
        self._load_profiles()

    # ------------------------------------------------------------------ profiles
    def _load_profiles(self) -> None:
        """Load every profile in ``profiles_dir``. Files that are not profiles (SGLang SPS
        tables, provenance notes, any other JSON; see ``profile_file.looks_like_profile``)
        are skipped with a debug line; a file that claims to be a profile but does not load
        gets one warning naming it and what is wrong, and is left as it is."""
        import json

        d = self.config.profiles_dir
        if not d:
            return
        if not Path(d).is_dir():
            logger.info("profiles: none yet in %s (created on the first save; --profiles-dir to change)", d)
            return
        loaded = 0
        for p in sorted(Path(d).glob("*.json")):
            why = ""
            try:
                data = json.loads(p.read_text(encoding="utf-8"))
                if data is None:
                    data = "null"          # JSON null: parsed, and not an object (None means unreadable)
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                data = None
                why = f"cannot read it as JSON ({exc})"
            if not looks_like_profile(p, data):
                logger.debug("profiles: %s is not a DSpark profile (no profile_key); ignored", p)
                continue
            try:
                if data is None:
                    raise ValueError(why)
                try:
                    pf = ProfileFile.model_validate(data)
                except Exception as exc:
                    raise ValueError(describe_validation_error(exc)) from None
                model = SpsModel.from_state(pf.model.model_dump())
            except Exception as exc:  # a bad file must not stop the controller
                named = p.stem if _is_key_name(p) else None
                logger.warning("profiles: not loading %s, which does not load as a DSpark profile: %s "
                               "(`dspark-controller validate %s` checks it); engines of its fingerprint "
                               "start a new profile%s", p, exc, p,
                               f", which is saved under this name if its key is {named}" if named else "")
                continue
            if pf.profile_key != pf.fingerprint.profile_key():
                logger.warning("profiles: not loading %s: its profile_key %s does not match its fingerprint "
                               "(%s); was the fingerprint edited?", p, pf.profile_key, pf.fingerprint.profile_key())
                continue
            loaded += 1
            self.profiles[pf.profile_key] = _Profile(key=pf.profile_key, fingerprint=pf.fingerprint, model=model,
                                                     created_at=pf.provenance.created_at,
                                                     samples_seen=pf.samples_seen)
            logger.info("loaded profile %s (%s on %s, %d samples) from %s", pf.profile_key,
                        pf.fingerprint.target_model, pf.fingerprint.device_name, pf.samples_seen, p)
        logger.info("profiles: %d loaded from %s, where they persist (--profiles-dir to change)", loaded, d)

    def _profile_for(self, fp: EngineFingerprint) -> _Profile:
        key = fp.profile_key()
        prof = self.profiles.get(key)
        if prof is None:
            model = SpsModel(config=self.config.model, prior=self._prior)
            prof = _Profile(key=key, fingerprint=fp, model=model, created_at=make_provenance().created_at)
            self.profiles[key] = prof
            logger.info("new profile %s for %s / %s on %s (gamma=%d, tp=%d)", key, fp.target_model,
                        fp.draft_model, fp.device_name, fp.gamma, fp.tp_size)
        return prof

    def profile_file(self, prof: _Profile) -> ProfileFile:
        state = prof.model.to_state()
        prov = make_provenance(command=self.config.command or None, created_at=prof.created_at,
                               sglang_version=prof.fingerprint.sglang_version)
        return ProfileFile(profile_key=prof.key, fingerprint=prof.fingerprint, model=SpsModelState(**state),
                           heldout_error=ErrorMetrics.from_summary(prof.model.heldout_error()),
                           samples_seen=prof.samples_seen, provenance=prov)

    def persist(self, *, force: bool = False) -> int:
        d = self.config.profiles_dir
        if not d:
            return 0
        n = 0
        for prof in list(self.profiles.values()):
            if not (prof.dirty_persist or force) or prof.samples_seen == 0:
                continue
            try:
                save_profile(profile_path(d, prof.key), self.profile_file(prof))
                prof.dirty_persist = False
                n += 1
            except Exception as exc:
                self._log.warning("persist", "could not persist profile %s to %s: %s", prof.key, d, exc)
        self.counters["profiles_persisted"] += n
        return n

    # ------------------------------------------------------------------ lifecycle
    def request_stop(self) -> None:
        self._stop_req.set()

    def wait_ready(self, timeout: float = 10.0) -> bool:
        return self._ready.wait(timeout)

    def _secure_server(self, sock: zmq.Socket, keys: Optional[tuple[bytes, bytes]]) -> None:
        if keys is not None:
            sock.curve_publickey = keys[0]
            sock.curve_secretkey = keys[1]
            sock.curve_server = True

    def run(self) -> None:
        cfg = self.config
        self._ctx = ctx = zmq.Context()
        keys = None
        socks: list[zmq.Socket] = []
        monitor = None
        try:
            if cfg.curve_enabled:
                from zmq.auth.thread import ThreadAuthenticator

                keys = load_curve_keypair(cfg.curve_secret_key_file)
                self._auth = ThreadAuthenticator(ctx)
                self._auth.start()
                self._auth.configure_curve(domain="*", location=str(cfg.curve_authorized_dir))
            router = ctx.socket(zmq.ROUTER)
            pub = ctx.socket(zmq.PUB)
            cli = ctx.socket(zmq.ROUTER)
            socks = [router, pub, cli]
            for s in socks:
                s.setsockopt(zmq.LINGER, 0)
                self._secure_server(s, keys)
            for s in (router, cli):
                s.setsockopt(zmq.MAXMSGSIZE, 4 * cfg.max_message_bytes)
                s.setsockopt(zmq.RCVHWM, 64)
                s.setsockopt(zmq.SNDHWM, 1000)
            pub.setsockopt(zmq.SNDHWM, 10000)
            monitor = router.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            try:
                router.bind(self.endpoints.router)
                pub.bind(self.endpoints.pub)
                cli.bind(self.endpoints.cli)
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot bind ({exc}); is another controller running on "
                                  f"{self.endpoints.router}? Pick another --bind.") from None
            if cfg.metrics_port is not None:
                from prometheus_client import start_http_server

                self._metrics_server = start_http_server(cfg.metrics_port, addr=cfg.metrics_addr,
                                                         registry=self.metrics.registry)
            self._router, self._pub, self._cli = router, pub, cli
            poller = zmq.Poller()
            poller.register(router, zmq.POLLIN)
            poller.register(cli, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            self._running.set()
            self._ready.set()
            logger.info("controller %s listening: workers %s, publisher %s, cli %s%s", self.controller_id,
                        self.endpoints.router, self.endpoints.pub, self.endpoints.cli,
                        " (CurveZMQ)" if keys else "")
            wait_s = 0.0
            while not self._stop_req.is_set():
                # sleep until a message arrives or the next decision / housekeeping is due
                events = dict(poller.poll(max(1, math.ceil(1000 * wait_s))))
                if router in events:
                    self._drain(router, self._on_worker_frames, budget_s=cfg.drain_budget_s)
                if cli in events:
                    self._drain(cli, self._on_cli_frames, budget_s=cfg.drain_budget_s)
                if monitor in events:
                    self._drain_monitor(monitor)
                try:
                    wait_s = self._tick()
                except Exception as exc:  # never let housekeeping take the controller down
                    wait_s = 0.02
                    self._log.warning("tick", "housekeeping error (continuing): %s: %s",
                                      exc.__class__.__name__, exc)
                    logger.debug("tick error", exc_info=True)
        finally:
            self._running.clear()
            try:
                self.persist(force=False)
            except Exception:
                logger.exception("final persist failed")
            if monitor is not None:
                try:
                    socks[0].disable_monitor()
                except Exception:
                    pass
                monitor.close(0)
            for s in socks:
                s.close(0)
            if self._auth is not None:
                self._auth.stop()
            if self._metrics_server is not None:
                try:
                    self._metrics_server[0].shutdown()
                except Exception:
                    pass
            ctx.term()
            self._ready.set()

    def _drain(self, sock: zmq.Socket, handler: Any, *, budget_s: float) -> None:
        """Handle queued messages for at most ``budget_s`` so no socket starves the others."""
        deadline = time.monotonic() + budget_s
        for _ in range(100_000):
            if time.monotonic() > deadline:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                handler(frames)
            except Exception as exc:  # last line of defence: never die on input
                self._drop("internal_error", f"{exc.__class__.__name__}: {exc}")
                logger.debug("handler error", exc_info=True)

    def _drain_monitor(self, monitor: zmq.Socket) -> None:
        from zmq.utils.monitor import recv_monitor_message

        for _ in range(100):
            try:
                evt = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            except Exception:
                return
            self.counters["handshake_failures"] += 1
            self._drop("auth_failed", f"handshake with {evt.get('endpoint', b'?')!r} failed (event {evt.get('event')})")

    def _drop(self, reason: str, detail: str) -> None:
        self.drops.add(reason)
        self.metrics.dropped.labels(reason=reason).inc()
        self._log.warning(reason, "dropped message: %s (%s)", reason, detail)

    # ------------------------------------------------------------------ worker messages
    def _reply(self, identity: bytes, msg: Any) -> None:
        try:
            self._router.send_multipart([identity] + encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _on_worker_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            self._drop("bad_framing", f"{len(frames)} frames")
            return
        identity, rest = frames[0], frames[1:]
        try:
            msg = decode_frames(rest, max_bytes=self.config.max_message_bytes,
                                expect=(Register, Heartbeat, TelemetryBatch))
        except DecodeError as exc:
            self._drop(exc.reason, exc.detail)
            return
        self.metrics.messages.labels(type=msg.type).inc()
        now = time.monotonic()
        if isinstance(msg, Register):
            self._on_register(identity, msg, now)
            return
        eng = self.engines.get(msg.engine_id)
        if eng is None or eng.client_nonce != msg.client_nonce:
            self._drop("unregistered", f"{msg.type} from unknown engine {msg.engine_id!r}")
            self._reply(identity, HeartbeatAck(controller_id=self.controller_id, engine_id=msg.engine_id,
                                               known=False))
            return
        eng.last_seen = now
        if isinstance(msg, Heartbeat):
            eng.identity = identity          # the control connection (telemetry uses its own)
            self.counters["heartbeats"] += 1
            self._reply(identity, HeartbeatAck(controller_id=self.controller_id, engine_id=eng.engine_id, known=True))
            if eng.last_decision is None or now - eng.last_decision_at > self.config.decision_valid_s / 2:
                eng.dirty = True
            return
        self.counters["telemetry_batches"] += 1
        if msg.dropped_since_last:
            self.drops.add("client_send_dropped", msg.dropped_since_last)
        for step in msg.steps:
            self._on_step(eng, step, now)

    def _on_register(self, identity: bytes, msg: Register, now: float) -> None:
        fp = msg.fingerprint
        prof = self._profile_for(fp)
        old = self.engines.get(msg.engine_id)
        if old is not None and old.client_nonce == msg.client_nonce and old.profile_key == prof.key:
            eng = old
            eng.identity = identity
            eng.last_seen = now
        else:
            if old is not None:
                logger.info("engine %s re-registered (new client instance)", msg.engine_id)
                self.profiles.get(old.profile_key, prof).engines.discard(old.engine_id)
            g = fp.gamma
            eng = _Engine(engine_id=msg.engine_id, worker_id=msg.worker_id, client_nonce=msg.client_nonce,
                          fingerprint=fp, profile_key=prof.key, identity=identity, last_seen=now,
                          registered_at=now, gamma=g, acc_trials=np.zeros(g), acc_succ=np.zeros(g))
            self.engines[msg.engine_id] = eng
            logger.info("engine %s (worker %s) registered, profile %s", msg.engine_id, msg.worker_id, prof.key)
        prof.engines.add(eng.engine_id)
        eng.dirty = True
        self.counters["registrations"] += 1
        self._reply(identity, RegisterAck(controller_id=self.controller_id, engine_id=eng.engine_id,
                                          profile_key=prof.key, pub_endpoint=self.endpoints.pub,
                                          heartbeat_s=self.config.heartbeat_s,
                                          policy=self._policy_for(eng.engine_id)))
        prof.dirty_publish = True

    def _on_step(self, eng: _Engine, step: StepTelemetry, now: float) -> None:
        if step.seq <= eng.last_seq:
            self._drop("stale_seq", f"engine {eng.engine_id} seq {step.seq} <= {eng.last_seq}")
            return
        eng.last_seq = step.seq
        eng.num_requests = step.num_running_requests
        if step.timestamp and time.time() - step.timestamp > self.config.stale_telemetry_s:
            # load shedding: the controller is behind; learning from old steps only adds latency
            self.counters["telemetry_shed"] = self.counters.get("telemetry_shed", 0) + 1
            self.drops.add("shed_stale")
            return
        eng.steps += 1
        self.counters["telemetry_steps"] += 1
        self._rate_window.append(now)
        self.metrics.steps.labels(engine=eng.engine_id).inc()
        if eng.last_decision is None or eng.last_decision.num_requests != eng.num_requests:
            eng.dirty = True
        else:
            eng.stale = True
        prof = self.profiles[eng.profile_key]
        if not prof.admit(now, self.config.max_learn_steps_per_s):
            # plenty of data: learning every step would only cost CPU (and freshness)
            self.counters["telemetry_subsampled"] = self.counters.get("telemetry_subsampled", 0) + 1
            return
        self.counters["telemetry_learned"] = self.counters.get("telemetry_learned", 0) + 1
        if step.num_running_requests >= 1 and profile_takes_step(prof.model, step.uniform):
            if prof.model.update(step.num_running_requests, step.verify_tokens, step.step_time_s):
                prof.samples_seen += 1
                prof.dirty_publish = prof.dirty_persist = True
        self._update_acceptance(eng, step)

    def _update_acceptance(self, eng: _Engine, step: StepTelemetry) -> None:
        g = eng.gamma
        decay = 0.5 ** (1.0 / self.config.acceptance_half_life_steps)
        if step.accepted_lens is not None and len(step.accepted_lens) > 0:
            acc = np.minimum(np.asarray(step.accepted_lens, dtype=np.int64), g)
            if step.verify_lens is not None:
                ver = np.minimum(np.asarray(step.verify_lens, dtype=np.int64), g)
            else:
                ver = np.full(acc.size, g, dtype=np.int64)
            acc = np.minimum(acc, ver)
            # position j (1-based) was tried by requests with ver >= j and acc >= j-1
            reach = np.bincount(np.minimum(acc + 1, ver), minlength=g + 1)[1:]   # last position tried
            tried = np.cumsum(reach[::-1])[::-1]
            succ_c = np.bincount(acc, minlength=g + 1)[1:]
            succ = np.cumsum(succ_c[::-1])[::-1]
            eng.acc_trials = eng.acc_trials * decay + tried[:g]
            eng.acc_succ = eng.acc_succ * decay + succ[:g]
        elif step.accept_summary is not None and step.accept_summary.num_requests > 0:
            s = step.accept_summary
            # approximate: every request that did not accept all its tokens rejected once
            c = s.accepted_tokens / max(1.0, s.accepted_tokens + min(s.num_requests,
                                                                      s.verified_draft_tokens - s.accepted_tokens))
            n = float(s.num_requests)
            eng.acc_trials = eng.acc_trials * decay + n
            eng.acc_succ = eng.acc_succ * decay + n * c

    # ------------------------------------------------------------------ decisions
    def _policy_for(self, engine_id: str) -> PolicySpec:
        return self.engine_policies.get(engine_id, self.policy)

    def decide(self, eng: _Engine) -> BudgetDecision:
        """Compute the engine's decision.

        The curve (``sps_table`` around the engine's batch size) is attached when R or the
        profile changed, else at most once per ``profile_publish_s``; the client carries
        the last one forward.
        """
        pol = self._policy_for(eng.engine_id)
        prof = self.profiles[eng.profile_key]
        model = prof.model
        R = max(0, eng.num_requests)
        g = eng.gamma
        full = R * g
        common = dict(engine_id=eng.engine_id, profile_key=prof.key, policy=pol, seq=eng.decision_seq + 1,
                      issued_at=time.time(), valid_for_s=self.config.decision_valid_s, num_requests=R,
                      explore_prob=pol.explore_prob)
        table = additive = None
        now = time.monotonic()
        send_table = (prof.publish_seq != eng.table_profile_seq or R != getattr(eng.last_decision, "num_requests", -1)
                      or now - eng.table_sent_at >= self.config.profile_publish_s)
        if model.ready and R >= 1 and send_table:
            table = SpsTable(**model.to_sglang_cost_table(num_requests=R, b_min=R, b_max=R * (g + 1)))
            # the whole curve, valid at every R: the worker's batch often differs from R by
            # the time it plans (requests join and finish between decisions)
            additive = SpsAdditiveTable(**model.to_sglang_additive_table())
            eng.table_sent_at = now
            eng.table_profile_seq = prof.publish_seq
        rule = PlanPolicy.from_spec(pol)    # the planner's one mode dispatcher (CLI plan uses it too)
        if rule.no_draft:
            # the worker reads policy.mode and skips the draft forward; the budget is only for
            # a worker that drafts anyway: verify all (stock DSpark), not drafts thrown away
            return BudgetDecision(**common, verify_all=True, budget_tokens=full, budget_frac=1.0, sps_table=table,
                                  sps_additive=additive,
                                  reason="policy no_draft: decode without drafting (plain decoding); "
                                         "a worker that drafts anyway verifies every draft token")
        if rule.verify_all:
            return BudgetDecision(**common, verify_all=True, budget_tokens=full, budget_frac=1.0, sps_table=table,
                                  sps_additive=additive, reason="policy off: verify every draft token")
        if rule.fixed_frac is not None:
            return BudgetDecision(**common, budget_tokens=fraction_budget(rule.fixed_frac, full),
                                  budget_frac=rule.fixed_frac, sps_table=table, sps_additive=additive,
                                  reason=f"fixed fraction {pol.frac:g} of {full} draft tokens")
        cap = rule.cap
        if not model.ready:
            return BudgetDecision(**common, verify_all=True, budget_tokens=None if cap is None else min(cap, full),
                                  max_budget_tokens=cap,
                                  reason=(f"profile {prof.key} warming up ({model.steps}/"
                                          f"{model.config.min_ready_samples} samples, no prior): verify all"))
        if R == 0:
            return BudgetDecision(**common, budget_tokens=0, max_budget_tokens=cap, sps_table=table,
                                  sps_additive=additive, reason="no running requests")
        acc = eng.acceptance()
        confidences = np.tile(acc, (R, 1))
        floor = rule.sla_floor
        try:
            lb = compute_lagged_budget(confidences, model.sps_function(R), max_tokens=cap, sla_floor=floor)
        except PlanError as exc:
            return BudgetDecision(**common, verify_all=True, reason=f"planner refused the curve ({exc}): verify all")
        reason = (f"{pol.describe()}: K={lb.budget_tokens} of {full} at R={R} from acceptance "
                  f"{', '.join(f'{x:.2f}' for x in acc[:8])}")
        if lb.sla_met is False:
            reason += "; SLA floor unreachable at this load"
        return BudgetDecision(**common, budget_tokens=lb.budget_tokens,
                              budget_frac=(lb.budget_tokens / full) if full else None,
                              max_budget_tokens=cap, sps_table=table, sps_additive=additive,
                              expected_tau=lb.expected_tau, predicted_throughput=lb.predicted_throughput,
                              reason=reason[:2048])

    def _publish_decision(self, eng: _Engine, now: float) -> None:
        t0 = time.perf_counter()
        d = self.decide(eng)
        try:
            self._pub.send_multipart(encode_pub(d), zmq.NOBLOCK)
        except zmq.ZMQError:
            self._drop("pub_would_block", "decision")
        dt = time.perf_counter() - t0
        self._latencies.append(dt)
        self.metrics.decision_latency.observe(dt)
        eng.decision_seq = d.seq
        eng.last_decision = d
        eng.last_decision_at = now
        eng.dirty = eng.stale = False
        self.counters["decisions_published"] += 1
        if d.budget_tokens is not None:     # no_draft: no draft token is verified (none is made)
            self.metrics.budget.labels(engine=eng.engine_id).set(0 if d.policy.mode == "no_draft"
                                                                 else d.budget_tokens)

    def _publish_profile(self, prof: _Profile, now: float) -> None:
        m = prof.model
        if not m.ready:
            return
        upd = ProfileUpdate(profile_key=prof.key, fingerprint=prof.fingerprint,
                            model=SpsModelState(**m.snapshot_for_prediction()),
                            heldout_error=ErrorMetrics.from_summary(m.heldout_error()),
                            samples_seen=prof.samples_seen, issued_at=time.time(), seq=prof.publish_seq + 1)
        try:
            self._pub.send_multipart(encode_pub(upd), zmq.NOBLOCK)
        except zmq.ZMQError:
            self._drop("pub_would_block", "profile")
        prof.publish_seq += 1
        prof.last_publish = now
        prof.dirty_publish = False
        self.counters["profiles_published"] += 1

    def _tick(self) -> float:
        """Publish the decisions and profiles that are due, persist, set the gauges; returns
        the seconds until the next of these is due, which the event loop sleeps unless a
        message arrives (an idle controller wakes ``1 / HOUSEKEEPING_S`` times a second).

        An engine's decision is due ``decision_interval_s`` after its last one when it is
        ``dirty`` (registered, its request count changed, its policy was set, a heartbeat
        found the decision half expired), ``ControllerConfig.stale_refresh_s`` after it
        when only ``stale`` (telemetry at the decided request count), never while it is
        silent past ``engine_timeout_s``."""
        cfg = self.config
        now = time.monotonic()
        refresh = min(NO_DRAFT_REFRESH_S, cfg.decision_valid_s / 4)
        wake = math.inf
        for eng in self.engines.values():
            if now - eng.last_seen > cfg.engine_timeout_s:
                continue
            # no_draft: a worker that runs no drafts sends no telemetry, only heartbeats, which
            # refresh a decision only after decision_valid_s / 2; its pin must not lapse at the
            # worker's decision max age (PolicyConfig.decision_max_age_s, 2 s), so re-publish
            if not eng.dirty and self._policy_for(eng.engine_id).mode == "no_draft":
                if now - eng.last_decision_at >= refresh:
                    eng.dirty = True
                else:
                    wake = min(wake, eng.last_decision_at + refresh)
            if eng.dirty:
                due = eng.last_decision_at + cfg.decision_interval_s
            elif eng.stale:
                due = eng.last_decision_at + cfg.stale_refresh_s
            else:
                continue
            if due > now:
                wake = min(wake, due)
                continue
            try:
                self._publish_decision(eng, now)
            except Exception as exc:
                eng.dirty = eng.stale = False
                eng.last_decision_at = now
                self._log.warning("decision", "could not decide for engine %s: %s: %s", eng.engine_id,
                                  exc.__class__.__name__, exc)
        if now - self._last_housekeeping < HOUSEKEEPING_S:
            return max(0.0, min(wake, self._last_housekeeping + HOUSEKEEPING_S) - now)
        self._last_housekeeping = now
        for prof in self.profiles.values():
            if prof.dirty_publish and now - prof.last_publish >= cfg.profile_publish_s:
                try:
                    self._publish_profile(prof, now)
                except Exception as exc:
                    prof.last_publish = now
                    self._log.warning("profile", "could not publish profile %s: %s: %s", prof.key,
                                      exc.__class__.__name__, exc)
        if now - self._last_persist >= cfg.persist_interval_s:
            self._last_persist = now
            self.persist()
        while self._rate_window and now - self._rate_window[0] > 5.0:
            self._rate_window.popleft()
        self.metrics.telemetry_rate.set(len(self._rate_window) / 5.0)
        self.metrics.engines.set(sum(1 for e in self.engines.values() if now - e.last_seen <= cfg.engine_timeout_s))
        gauges_due = now - self._last_gauges >= GAUGE_REFRESH_S
        for prof in self.profiles.values():
            if not gauges_due or prof.metrics_at_samples == prof.samples_seen:
                continue      # nothing new learned: the gauges are current (an idle fleet costs ~0 CPU)
            prof.metrics_at_samples = prof.samples_seen
            err = prof.model.heldout_error()
            if err.n:
                self.metrics.profile_error.labels(profile=prof.key).set(err.mape)
            self.metrics.profile_samples.labels(profile=prof.key).set(prof.samples_seen)
        if gauges_due:
            self._last_gauges = now
        # forget engines silent for a long time (they re-register if they come back)
        for eid in [e.engine_id for e in self.engines.values() if now - e.last_seen > 6 * cfg.engine_timeout_s]:
            eng = self.engines.pop(eid)
            self.profiles.get(eng.profile_key) and self.profiles[eng.profile_key].engines.discard(eid)
            logger.info("engine %s forgotten after %.0fs of silence", eid, now - eng.last_seen)
        return max(0.0, min(wake, now + HOUSEKEEPING_S) - now)

    # ------------------------------------------------------------------ CLI
    def _on_cli_frames(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            self._drop("bad_framing", "cli")
            return
        identity, rest = frames[0], frames[1:]
        try:
            msg = decode_frames(rest, max_bytes=self.config.max_message_bytes,
                                expect=(StatusRequest, SetPolicy, ProfileRequest))
        except DecodeError as exc:
            self._drop(exc.reason, "cli: " + exc.detail)
            reply: Any = ErrorReply(message=f"rejected: {exc}")
            self._cli_reply(identity, reply)
            return
        self.metrics.messages.labels(type=msg.type).inc()
        if isinstance(msg, StatusRequest):
            self._cli_reply(identity, self.status())
        elif isinstance(msg, ProfileRequest):
            prof = self.profiles.get(msg.profile_key)
            if prof is None or prof.samples_seen == 0:
                self._cli_reply(identity, ErrorReply(message=f"no learned profile {msg.profile_key!r}; known: "
                                                             f"{sorted(self.profiles)[:20]}"))
            else:
                self._cli_reply(identity, ProfileReply(profile=self.profile_file(prof)))
        else:
            self._cli_reply(identity, self.set_policy(msg))

    def _cli_reply(self, identity: bytes, msg: Any) -> None:
        try:
            self._cli.send_multipart([identity] + encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def set_policy(self, msg: SetPolicy) -> SetPolicyReply:
        if msg.engine_id is None:
            self.policy = msg.policy
            self.engine_policies.clear()
            target = "all engines"
        else:
            if msg.engine_id not in self.engines:
                return SetPolicyReply(ok=False, message=f"unknown engine {msg.engine_id!r}; "
                                                        f"known: {sorted(self.engines)[:20]}")
            self.engine_policies[msg.engine_id] = msg.policy
            target = f"engine {msg.engine_id}"
        for eng in self.engines.values():
            eng.dirty = True
            eng.last_decision_at = 0.0
        logger.info("policy for %s set to %s", target, msg.policy.describe())
        note = _MODE_NOTES.get(msg.policy.mode, "")
        return SetPolicyReply(ok=True, message=f"policy for {target} is now {msg.policy.describe()}{note}",
                              policy=msg.policy)

    def status(self) -> StatusReply:
        now = time.monotonic()
        lat = np.asarray(self._latencies, dtype=np.float64)
        counters = dict(self.counters)
        counters["telemetry_steps_per_s"] = len([t for t in self._rate_window if now - t <= 5.0]) / 5.0
        if lat.size:
            counters["decision_latency_p50_s"] = float(np.quantile(lat, 0.5))
            counters["decision_latency_p99_s"] = float(np.quantile(lat, 0.99))
        engines = []
        for e in self.engines.values():
            d = e.last_decision
            # no_draft: the decision's "verify all" is only for a worker that drafts anyway; the
            # status shows what the fleet does, no draft token verified
            nd = d is not None and d.policy.mode == "no_draft"
            engines.append(EngineStatus(
                engine_id=e.engine_id, worker_id=e.worker_id, profile_key=e.profile_key,
                state="connected" if now - e.last_seen <= self.config.engine_timeout_s else "lost",
                last_seen_s_ago=now - e.last_seen, steps=e.steps, last_seq=e.last_seq,
                num_requests=e.num_requests, budget_tokens=None if d is None else (0 if nd else d.budget_tokens),
                verify_all=bool(d and d.verify_all and not nd), policy=self._policy_for(e.engine_id).describe(),
                decision_seq=e.decision_seq, acceptance=[round(float(x), 4) for x in e.acceptance()]))
        profiles = []
        for p in self.profiles.values():
            profiles.append(ProfileStatus(
                profile_key=p.key, target_model=p.fingerprint.target_model,
                device_name=p.fingerprint.device_name, gamma=p.fingerprint.gamma, samples_seen=p.samples_seen,
                ready=p.model.ready, heldout_error=ErrorMetrics.from_summary(p.model.heldout_error()),
                drift_scale=p.model.scale, engines=sorted(p.engines),
                path=str(profile_path(self.config.profiles_dir, p.key)) if self.config.profiles_dir else ""))
        return StatusReply(controller_id=self.controller_id, started_at=self.started_at,
                           uptime_s=now - self._t0, policy=self.policy, engine_policies=dict(self.engine_policies),
                           engines=engines, profiles=profiles, counters=counters, dropped=self.drops.snapshot(),
                           endpoints={"workers": self.endpoints.router, "publisher": self.endpoints.pub,
                                      "cli": self.endpoints.cli})


# the two modes whose names are easy to mix up, spelled out in the CLI's "set" reply
_MODE_NOTES = {"off": " (verify every draft token: scheduling off, drafting on)",
               "no_draft": " (decode without drafting: no draft forward, plain decoding)"}


def serve(config: ControllerConfig) -> int:
    """Run a controller in the foreground until SIGINT/SIGTERM; persists profiles on exit."""
    ctl = Controller(config=config)

    def handler(signum: int, _frame: Any) -> None:
        logger.info("signal %d: shutting down", signum)
        ctl.request_stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    ctl.run()
    logger.info("controller stopped; profiles persisted to %s", config.profiles_dir)
    return 0
