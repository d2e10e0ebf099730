"""Worker-side controller client: the only worker code that speaks the wire protocol.

Threading model
---------------
:meth:`ControllerClient.start` starts ONE daemon thread that creates and owns every
ZeroMQ socket of the client (a DEALER to the controller, a SUB for its broadcasts). The
decode loop never touches a socket: :meth:`publish_step` appends to a bounded deque
(the oldest step is dropped and counted when it is full; a plain dict is validated later,
in the background thread, off the decode step) and :meth:`latest_decision` /
:meth:`latest_profile` / :meth:`fleet_model` read the last received message (and the
profile model the background thread rebuilt from it), swapped in atomically by the
background thread. All are cheap and never raise.

Link life cycle
---------------
``connecting`` until the first RegisterAck; ``connected`` while acks/replies arrive;
``lost`` when nothing arrived for ``lost_after_s`` (default ``3 * heartbeat_s + 0.5``).
The client re-sends Register every heartbeat while not registered, and re-registers at
once when a HeartbeatAck says the controller does not know it or carries a new
controller id (the controller restarted). The controller may start after the client.
Telemetry is only sent while registered; ``ZMQ_IMMEDIATE`` keeps ZeroMQ from queueing
toward a dead peer, so nothing piles up behind a lost link.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
import uuid
from typing import Any, Optional, Union

import zmq

from dspark_controller.service.endpoints import check_endpoint, connectable, load_curve_keypair, load_curve_public_key
from dspark_controller.service.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES, MAX_STEPS_PER_BATCH, BudgetDecision, DecodeError, DropCounter,
    EngineFingerprint, Heartbeat, HeartbeatAck, ProfileUpdate, RateLimitedLog, Register,
    RegisterAck, StepTelemetry, TelemetryBatch, decision_topic, decode_frames, encode,
    profile_topic,
)

__all__ = ["ControllerClient"]

logger = logging.getLogger("dspark_controller.service.client")

CurveKeys = Union[tuple[bytes, bytes], str, os.PathLike]


def carry_curve(prev: Optional[BudgetDecision], msg: BudgetDecision) -> BudgetDecision:
    """The controller sends its curve only when it changed (or R did): carry the previous
    decision's curve forward into ``msg`` where it still applies: the additive form for the
    same profile, the per-R table only for the same profile and request count."""
    if prev is None or prev.profile_key != msg.profile_key:
        return msg
    upd: dict = {}
    if msg.sps_table is None and prev.sps_table is not None and prev.num_requests == msg.num_requests:
        upd["sps_table"] = prev.sps_table
    if msg.sps_additive is None and prev.sps_additive is not None:
        upd["sps_additive"] = prev.sps_additive
    return msg.model_copy(update=upd) if upd else msg


class ControllerClient:
    """Connects one engine (one scheduler rank) to the DSpark controller.

    Parameters (keyword-only)
    -------------------------
    address: the controller's worker endpoint, ``tcp://HOST:PORT`` or ``ipc://PATH`` (e.g.
        ``tcp://127.0.0.1:7150``); anything else raises ``endpoints.ConfigError`` here
        (:func:`~dspark_controller.service.endpoints.check_endpoint`).
    fingerprint: the engine's :class:`EngineFingerprint` (selects the shared profile).
    engine_id: unique id of this engine/rank (``[A-Za-z0-9_.:@/+=-]{1,128}``).
    worker_id: free-form worker id (defaults to ``host:pid``).
    curve_server_key: the controller's CurveZMQ public key (Z85 text or certificate file).
    curve_keys: this client's keypair, ``(public, secret)`` Z85 bytes or a ``.key_secret`` file.
    heartbeat_s: heartbeat / register-retry period.
    queue_max: bounded telemetry queue; the oldest step is dropped when full.
    pub_address: override for the controller's publisher endpoint (else from the ack).
    flush_interval_s: telemetry leaves in batches at most this often (or when ``batch_max``
        steps wait).
    poll_interval_s: the longest the client thread sleeps with no telemetry waiting (a
        step queued then leaves within it); with telemetry waiting it sleeps until the next
        flush, and never past the next heartbeat. Messages wake it at once.
    """

    def __init__(self, *, address: str, fingerprint: EngineFingerprint, engine_id: str,
                 worker_id: Optional[str] = None, curve_server_key: Any = None,
                 curve_keys: Optional[CurveKeys] = None, heartbeat_s: float = 1.0,
                 queue_max: int = 1024, pub_address: Optional[str] = None,
                 lost_after_s: Optional[float] = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 batch_max: int = 64, poll_interval_s: float = 0.05,
                 flush_interval_s: float = 0.25) -> None:
        if heartbeat_s <= 0:
            raise ValueError("heartbeat_s must be > 0")
        if queue_max < 1:
            raise ValueError("queue_max must be >= 1")
        if (curve_server_key is None) != (curve_keys is None):
            raise ValueError("CurveZMQ needs both curve_server_key (the controller's public key) and "
                             "curve_keys (this client's keypair), or neither")
        # a malformed address fails here (ConfigError, a ValueError), not later in the thread
        check_endpoint(address, option="controller address")
        if pub_address is not None:
            check_endpoint(pub_address, option="controller publisher address")
        self.address = address
        self.fingerprint = fingerprint
        self.engine_id = engine_id
        self.worker_id = worker_id or f"{_safe(os.uname().nodename)}:{os.getpid()}"
        self.heartbeat_s = float(heartbeat_s)
        self.lost_after_s = float(lost_after_s) if lost_after_s else 3.0 * self.heartbeat_s + 0.5
        self.queue_max = int(queue_max)
        self.pub_address = pub_address
        self.max_message_bytes = int(max_message_bytes)
        self.batch_max = max(1, min(int(batch_max), MAX_STEPS_PER_BATCH))
        self.poll_interval_s = float(poll_interval_s)
        # telemetry leaves in batches at most this often (or when batch_max steps wait): one
        # message per decode step cost the controller ~1 ms of CPU per step on a 2-core host
        self.flush_interval_s = max(0.0, float(flush_interval_s))
        self.client_nonce = uuid.uuid4().hex
        self.profile_key = fingerprint.profile_key()
        self._curve_server_key = load_curve_public_key(curve_server_key) if curve_server_key is not None else None
        if curve_keys is None:
            self._curve_keys = None
        elif isinstance(curve_keys, tuple):
            self._curve_keys = (bytes(curve_keys[0]), bytes(curve_keys[1]))
        else:
            self._curve_keys = load_curve_keypair(curve_keys)
        # validated once here so a bad id fails at construction, not in the thread
        Register(engine_id=engine_id, worker_id=self.worker_id, client_nonce=self.client_nonce,
                 fingerprint=fingerprint)
        self._queue: collections.deque = collections.deque(maxlen=self.queue_max)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._decision: Optional[tuple[BudgetDecision, float]] = None
        self._profile: Optional[tuple[ProfileUpdate, float]] = None
        self._fleet_model: Any = None   # SpsModel rebuilt from the last ProfileUpdate (client thread)
        self._state = "connecting"
        self._controller_id: Optional[str] = None
        self._registered = False
        self._rx_drops = DropCounter()
        self._log = RateLimitedLog(logger)
        self._counters = collections.Counter()
        self._dropped_unsent = 0

    # ------------------------------------------------------------------ public API
    def start(self) -> "ControllerClient":
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name=f"dspark-client-{self.engine_id}",
                                        daemon=True)
        self._thread.start()
        return self

    def publish_step(self, telemetry: Union[StepTelemetry, dict]) -> bool:
        """Queue one step for the controller. Non-blocking, never raises; False if it could
        not be queued. A dict is validated in the background thread when it is sent (an
        invalid one is dropped there and counted as ``dropped_invalid``)."""
        try:
            if not isinstance(telemetry, (StepTelemetry, dict)):
                raise TypeError("telemetry must be a StepTelemetry or a dict")
            q = self._queue
            if len(q) >= self.queue_max:
                self._counters["dropped_queue_full"] += 1
            q.append(telemetry)
            self._counters["steps_published"] += 1
            return True
        except Exception:
            try:
                self._counters["dropped_invalid"] += 1
            except Exception:
                pass
            return False

    def latest_decision(self, max_age_s: float = 5.0) -> Optional[BudgetDecision]:
        """The newest decision if received within ``max_age_s`` and still valid, else None."""
        cur = self._decision
        if cur is None:
            return None
        decision, received = cur
        age = time.monotonic() - received
        if age > max_age_s or age > decision.valid_for_s:
            return None
        return decision

    def latest_profile(self) -> Optional[ProfileUpdate]:
        cur = self._profile
        return None if cur is None else cur[0]

    def fleet_model(self) -> Any:
        """The controller's profile for this engine as a predicting ``SpsModel`` (rebuilt in
        the client thread from the last ProfileUpdate; None before one arrived). Unlike the
        decision's SGLang tables it keeps the whole fit, per-row corrections included."""
        return self._fleet_model

    @property
    def link_state(self) -> str:
        """``connecting`` | ``connected`` | ``lost``."""
        return self._state

    @property
    def controller_id(self) -> Optional[str]:
        return self._controller_id

    @property
    def counters(self) -> dict[str, int]:
        c = dict(self._counters)
        c["queue_len"] = len(self._queue)
        for reason, n in self._rx_drops.snapshot().items():
            c[f"rx_dropped_{reason}"] = n
        return c

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    def __enter__(self) -> "ControllerClient":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ thread
    def _secure(self, sock: zmq.Socket) -> None:
        if self._curve_keys is not None:
            sock.curve_publickey = self._curve_keys[0]
            sock.curve_secretkey = self._curve_keys[1]
            sock.curve_serverkey = self._curve_server_key

    def _run(self) -> None:
        ctx = zmq.Context()
        dealer = tele = sub = None
        try:
            # two connections to the controller's ROUTER: control (register/heartbeat) and
            # telemetry. ROUTER fair-queues between connections, so a telemetry backlog never
            # delays a heartbeat (and so never makes a busy controller look dead).
            dealer = ctx.socket(zmq.DEALER)
            tele = ctx.socket(zmq.DEALER)
            for sock, hwm in ((dealer, 64), (tele, 16)):
                for opt, val in ((zmq.LINGER, 0), (zmq.IMMEDIATE, 1), (zmq.SNDHWM, hwm),
                                 (zmq.RCVHWM, 256), (zmq.RECONNECT_IVL, 100), (zmq.RECONNECT_IVL_MAX, 1000),
                                 (zmq.MAXMSGSIZE, 4 * self.max_message_bytes)):
                    sock.setsockopt(opt, val)
                self._secure(sock)
                sock.connect(self.address)
            poller = zmq.Poller()
            poller.register(dealer, zmq.POLLIN)
            poller.register(tele, zmq.POLLIN)
            sub_endpoint: Optional[str] = None
            last_rx: Optional[float] = None
            next_hb = 0.0
            next_flush = 0.0
            hb_seq = 0
            while not self._stop.is_set():
                now = time.monotonic()
                if last_rx is not None and now - last_rx > self.lost_after_s and self._state != "lost":
                    self._state = "lost"
                    self._registered = False
                    self._counters["link_losses"] += 1
                    self._log.warning("lost", "controller at %s silent for %.1fs; link lost, re-registering",
                                      self.address, now - last_rx)
                if now >= next_hb:
                    next_hb = now + self.heartbeat_s
                    if not self._registered:
                        self._send(dealer, self._register_msg())
                        self._counters["register_sent"] += 1
                    else:
                        hb_seq += 1
                        self._send(dealer, Heartbeat(engine_id=self.engine_id, client_nonce=self.client_nonce,
                                                     seq=hb_seq, sent_at=time.time()))
                        self._counters["heartbeats_sent"] += 1
                if self._registered and self._queue and (now >= next_flush
                                                         or len(self._queue) >= self.batch_max):
                    next_flush = now + self.flush_interval_s
                    self._flush(tele)
                now = time.monotonic()
                due = next_flush if self._registered and self._queue else now + self.poll_interval_s
                wait_s = max(0.0, min(due, next_hb) - now)
                events = dict(poller.poll(max(1, math.ceil(1000 * wait_s))))
                for sock in (dealer, tele):
                    if sock not in events:
                        continue
                    for _ in range(256):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        msg = self._decode(frames, (RegisterAck, HeartbeatAck), topic=False)
                        if msg is None:
                            continue
                        last_rx = time.monotonic()
                        if isinstance(msg, RegisterAck):
                            new_controller = self._controller_id is not None and msg.controller_id != self._controller_id
                            if new_controller:
                                self._counters["controller_restarts_seen"] += 1
                            self._controller_id = msg.controller_id
                            self._registered = True
                            self._state = "connected"
                            self._counters["registrations"] += 1
                            ep = self.pub_address or connectable(msg.pub_endpoint, like=self.address)
                            if ep != sub_endpoint:
                                if sub is not None:
                                    poller.unregister(sub)
                                    sub.close(0)
                                sub = self._make_sub(ctx, ep)
                                poller.register(sub, zmq.POLLIN)
                                sub_endpoint = ep
                        elif isinstance(msg, HeartbeatAck):
                            if not msg.known or (self._controller_id is not None
                                                 and msg.controller_id != self._controller_id):
                                # the controller restarted (or forgot us): register again now
                                if self._registered:
                                    self._registered = False
                                    self._counters["reregistrations"] += 1
                                    self._send(dealer, self._register_msg())
                                    self._counters["register_sent"] += 1
                                    next_hb = time.monotonic() + self.heartbeat_s
                            elif self._registered:
                                self._state = "connected"
                if sub is not None and sub in events:
                    for _ in range(256):
                        try:
                            frames = sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        msg = self._decode(frames, (BudgetDecision, ProfileUpdate), topic=True)
                        if isinstance(msg, BudgetDecision) and msg.engine_id == self.engine_id:
                            prev = self._decision
                            msg = carry_curve(None if prev is None else prev[0], msg)
                            self._decision = (msg, time.monotonic())
                            self._counters["decisions_received"] += 1
                        elif isinstance(msg, ProfileUpdate) and msg.profile_key == self.profile_key:
                            self._profile = (msg, time.monotonic())
                            self._counters["profiles_received"] += 1
                            try:
                                self._fleet_model = msg.to_sps_model()
                            except Exception:  # a bad snapshot: keep planning on the decision's tables
                                self._counters["profiles_unusable"] += 1
                                self._log.warning("bad-profile", "controller profile update %s unusable; "
                                                  "planning with the decision's tables", msg.profile_key)
        except Exception:  # the worker must survive anything in here
            logger.exception("controller client thread crashed; telemetry is no longer sent")
            self._state = "lost"
            self._counters["thread_crashes"] += 1
        finally:
            for s in (dealer, tele, sub):
                if s is not None:
                    try:
                        s.close(0)
                    except Exception:
                        pass
            ctx.term()

    def _make_sub(self, ctx: zmq.Context, endpoint: str) -> zmq.Socket:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 64)
        sub.setsockopt(zmq.MAXMSGSIZE, 4 * self.max_message_bytes)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self._secure(sub)
        sub.setsockopt(zmq.SUBSCRIBE, decision_topic(self.engine_id))
        sub.setsockopt(zmq.SUBSCRIBE, profile_topic(self.profile_key))
        sub.connect(endpoint)
        return sub

    def _register_msg(self) -> Register:
        return Register(engine_id=self.engine_id, worker_id=self.worker_id, client_nonce=self.client_nonce,
                        fingerprint=self.fingerprint, pid=os.getpid(), started_at=time.time(),
                        heartbeat_s=self.heartbeat_s)

    def _send(self, sock: zmq.Socket, msg: Any) -> bool:
        try:
            sock.send_multipart(encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            self._counters["send_would_block"] += 1
            return False

    def _flush(self, dealer: zmq.Socket) -> None:
        q = self._queue
        while q:
            steps = []
            while q and len(steps) < self.batch_max:
                try:
                    item = q.popleft()
                except IndexError:
                    break
                if not isinstance(item, StepTelemetry):
                    try:
                        item = StepTelemetry.model_validate(item)
                    except Exception:
                        self._counters["dropped_invalid"] += 1
                        continue
                steps.append(item)
            if not steps:
                return
            batch = TelemetryBatch(engine_id=self.engine_id, client_nonce=self.client_nonce, steps=steps,
                                   dropped_since_last=self._dropped_unsent)
            frames = encode(batch)
            if len(frames[1]) > self.max_message_bytes and len(steps) > 1:
                # split: put the second half back in front and retry smaller
                half = len(steps) // 2
                for s in reversed(steps[half:]):
                    q.appendleft(s)
                self.batch_max = max(1, half)
                continue
            try:
                dealer.send_multipart(frames, zmq.NOBLOCK)
                self._counters["steps_sent"] += len(steps)
                self._counters["batches_sent"] += 1
                self._dropped_unsent = 0
            except zmq.Again:
                self._counters["dropped_send"] += len(steps)
                self._dropped_unsent += len(steps)
                return

    def _decode(self, frames: list[bytes], expect: tuple[type, ...], *, topic: bool) -> Any:
        try:
            return decode_frames(frames, max_bytes=self.max_message_bytes, expect=expect, topic_frame=topic)
        except DecodeError as exc:
            self._rx_drops.add(exc.reason)
            self._log.warning(exc.reason, "dropped a message from the controller (%s)", exc)
            return None


def _safe(s: str) -> str:
    out = "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in s)
    return out[:64] or "host"
