"""Versioned wire protocol between DSpark workers, the controller and its CLI.

Framing
-------
Every message is a ZeroMQ multipart message of exactly two frames::

    [ type-or-topic , json-body ]

* worker -> controller (DEALER -> ROUTER) and CLI -> controller: frame 0 is the message
  ``type`` (``b"register"``, ``b"telemetry"``, ...). Replies come back the same way.
* controller -> workers (PUB -> SUB): frame 0 is a topic, ``D|<engine_id>|`` for a
  :class:`BudgetDecision` and ``P|<profile_key>|`` for a :class:`ProfileUpdate`. The
  trailing ``|`` makes ZeroMQ's prefix subscription exact (``D|e1|`` does not match
  ``D|e10|``).

The body is a JSON object validated by the pydantic v2 model of that type. Each body
carries ``"type"`` and ``"version"`` (:data:`PROTOCOL_VERSION`).

Limits and failure handling
---------------------------
A receiver calls :func:`decode_frames` which raises :class:`DecodeError` with a short
``reason`` (one of :data:`DROP_REASONS`) for anything it will not accept: wrong frame
count, a body over the size limit (default :data:`DEFAULT_MAX_MESSAGE_BYTES`), bad JSON,
an unknown ``version`` or ``type``, a type frame that disagrees with the body, or a body
that fails validation. Callers drop such messages, count them by reason, and log through
:class:`RateLimitedLog`; nothing in the controller raises on input.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from dspark_controller.core.profile_file import EngineFingerprint, ErrorMetrics, ProfileFile, SpsModelState

__all__ = [
    "PROTOCOL_VERSION", "DEFAULT_MAX_MESSAGE_BYTES", "DROP_REASONS", "DecodeError",
    "EngineFingerprint", "PolicySpec", "Register", "RegisterAck", "Heartbeat", "HeartbeatAck",
    "ContextLenSummary", "AcceptSummary", "StepTelemetry", "TelemetryBatch", "SpsTable",
    "SpsAdditiveTable", "ProfileUpdate", "BudgetDecision", "SetPolicy", "SetPolicyReply",
    "StatusRequest", "EngineStatus", "ProfileStatus", "StatusReply", "ErrorReply", "ProfileRequest",
    "ProfileReply", "Message",
    "encode", "encode_pub", "decode_body", "decode_frames", "decision_topic", "profile_topic",
    "RateLimitedLog", "DropCounter",
]

PROTOCOL_VERSION = 1
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
MAX_STEPS_PER_BATCH = 512
MAX_REQUESTS_PER_STEP = 8192
DROP_REASONS = ("bad_framing", "oversized", "bad_json", "unknown_version", "unknown_type",
                "type_mismatch", "invalid", "unexpected_type", "unregistered", "stale_seq")

_ID = r"^[A-Za-z0-9_.:@/+=-]{1,128}$"
IdStr = Annotated[str, Field(pattern=_ID)]
PosFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = PROTOCOL_VERSION


class PolicySpec(BaseModel):
    """How the controller turns a profile into verify budgets.

    * ``throughput``: maximise expected accepted tokens per second, ``tau * SPS(B)``.
    * ``sla``: the same subject to every request keeping ``E[tau_r] * SPS(B) >= floor_tok_s``.
    * ``fixed``: verify ``frac`` of all draft tokens (top-``frac`` by survival).
    * ``cap``: ``throughput`` with the draft-token budget capped at ``max_tokens``.
    * ``off``: verify every draft token (stock DSpark without scheduling; the name is
      historical: *scheduling* is off, drafting is not).
    * ``no_draft``: decode without drafting on every engine it applies to: plain decoding,
      no draft forward, one token per request per step. For when the operator knows
      speculation does not pay (a load test, an incident). Workers from before this mode
      reject such messages as ``invalid`` and so behave as if no controller were there
      (see docs/protocol.md).

    ``explore_prob`` lets the worker verify a uniformly random budget on that fraction of
    steps so the profile also learns batch sizes the policy would not pick. It is lossless
    (the budget never depends on the current tokens) but costs throughput; default 0. It
    must stay 0 under ``no_draft`` (no drafts, no budget to explore).

    The modes are ``core.method.PlanPolicy.MODES`` (the planner's mirror), in that order.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["throughput", "sla", "fixed", "cap", "off", "no_draft"] = "throughput"
    floor_tok_s: Optional[PosFinite] = None
    frac: Optional[Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] = None
    max_tokens: Optional[Annotated[int, Field(ge=0, le=1 << 24)]] = None
    explore_prob: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _check(self) -> "PolicySpec":
        if self.mode == "sla" and self.floor_tok_s is None:
            raise ValueError("policy 'sla' needs floor_tok_s (per-user tokens/s floor), e.g. 80")
        if self.mode == "fixed" and self.frac is None:
            raise ValueError("policy 'fixed' needs frac in [0, 1], e.g. 0.5")
        if self.mode == "cap" and self.max_tokens is None:
            raise ValueError("policy 'cap' needs max_tokens >= 0 (draft tokens per step)")
        if self.mode == "no_draft" and self.explore_prob > 0:
            raise ValueError("policy 'no_draft' makes no drafts, so there is no budget to explore; "
                             "drop explore_prob (--explore)")
        return self

    def describe(self) -> str:
        if self.mode == "sla":
            return f"sla(floor={self.floor_tok_s:g} tok/s/user)"
        if self.mode == "fixed":
            return f"fixed(frac={self.frac:g})"
        if self.mode == "cap":
            return f"cap(max={self.max_tokens})"
        return self.mode


# ---------------------------------------------------------------- worker -> controller
class Register(_Msg):
    type: Literal["register"] = "register"
    engine_id: IdStr
    worker_id: IdStr
    client_nonce: IdStr
    fingerprint: EngineFingerprint
    pid: int = Field(default=0, ge=0)
    started_at: NonNegFinite = 0.0
    heartbeat_s: PosFinite = 1.0


class Heartbeat(_Msg):
    type: Literal["heartbeat"] = "heartbeat"
    engine_id: IdStr
    client_nonce: IdStr
    seq: int = Field(ge=0)
    sent_at: NonNegFinite = 0.0
    stats: dict[str, int] = Field(default_factory=dict, max_length=64)


class ContextLenSummary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min: int = Field(ge=0)
    mean: NonNegFinite
    max: int = Field(ge=0)


class AcceptSummary(BaseModel):
    """Aggregate acceptance when per-request lists are too costly to send."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    num_requests: int = Field(ge=0)
    accepted_tokens: int = Field(ge=0, description="sum over requests of accepted draft tokens")
    verified_draft_tokens: int = Field(ge=0, description="sum over requests of verified draft tokens")


class StepTelemetry(BaseModel):
    """One decode/verify step as measured on the worker.

    ``verify_tokens`` is the total number of tokens in the target verify forward (one
    anchor per request plus the admitted draft tokens: ``B = R + K``). ``accepted_lens``
    counts accepted *draft* tokens per request (the bonus token excluded); ``verify_lens``
    the draft tokens each request had verified (omit when every request verified gamma).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["step"] = "step"
    engine_id: Optional[IdStr] = None
    seq: int = Field(ge=0)
    num_running_requests: int = Field(ge=0, le=MAX_REQUESTS_PER_STEP)
    verify_tokens: int = Field(ge=0, le=1 << 24)
    step_time_s: Annotated[float, Field(gt=0, le=3600.0, allow_inf_nan=False)]
    accepted_lens: Optional[list[Annotated[int, Field(ge=0, le=1024)]]] = Field(
        default=None, max_length=MAX_REQUESTS_PER_STEP)
    verify_lens: Optional[list[Annotated[int, Field(ge=0, le=1024)]]] = Field(
        default=None, max_length=MAX_REQUESTS_PER_STEP)
    accept_summary: Optional[AcceptSummary] = None
    context_len: Optional[ContextLenSummary] = None
    budget_tokens: Optional[int] = Field(default=None, ge=0)
    predicted_step_time_s: Optional[PosFinite] = None
    timestamp: NonNegFinite = 0.0
    # a full-budget step on SGLang's uniform verify path, which can cost less than a ragged
    # step one token short: once the profile is ready it is kept out of it (as the worker does)
    uniform: bool = False

    @model_validator(mode="after")
    def _check(self) -> "StepTelemetry":
        if self.verify_tokens < self.num_running_requests:
            raise ValueError("verify_tokens counts one anchor per request, so it must be >= "
                             "num_running_requests")
        if (self.accepted_lens is not None and self.verify_lens is not None
                and len(self.accepted_lens) != len(self.verify_lens)):
            raise ValueError("accepted_lens and verify_lens must have one entry per request")
        if self.accepted_lens is not None and self.verify_lens is not None:
            if any(a > v for a, v in zip(self.accepted_lens, self.verify_lens)):
                raise ValueError("a request cannot accept more draft tokens than it verified")
        return self


class TelemetryBatch(_Msg):
    type: Literal["telemetry"] = "telemetry"
    engine_id: IdStr
    client_nonce: IdStr
    steps: list[StepTelemetry] = Field(min_length=1, max_length=MAX_STEPS_PER_BATCH)
    dropped_since_last: int = Field(default=0, ge=0)


# ---------------------------------------------------------------- controller -> worker
class RegisterAck(_Msg):
    type: Literal["register_ack"] = "register_ack"
    controller_id: IdStr
    engine_id: IdStr
    profile_key: IdStr
    pub_endpoint: str = Field(max_length=512)
    heartbeat_s: PosFinite = 1.0
    policy: PolicySpec


class HeartbeatAck(_Msg):
    type: Literal["heartbeat_ack"] = "heartbeat_ack"
    controller_id: IdStr
    engine_id: IdStr
    known: bool


class SpsTable(BaseModel):
    """Same fields and floor-lookup semantics as SGLang 0.5.23 ``SpsCostTable``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    sample_batch_tokens: list[int] = Field(min_length=1, max_length=65536)
    sample_steps_per_sec: list[PosFinite] = Field(min_length=1, max_length=65536)
    max_batch_tokens: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> "SpsTable":
        b = self.sample_batch_tokens
        if len(b) != len(self.sample_steps_per_sec) or any(y <= x for x, y in zip(b, b[1:])):
            raise ValueError("sample_batch_tokens must be strictly increasing and match "
                             "sample_steps_per_sec in length")
        return self

    def lookup(self, batch_tokens: int) -> float:
        import bisect

        i = bisect.bisect_right(self.sample_batch_tokens, int(batch_tokens)) - 1
        return self.sample_steps_per_sec[max(0, min(i, len(self.sample_batch_tokens) - 1))]


class SpsAdditiveTable(BaseModel):
    """Same fields as SGLang 0.5.23 ``SpsAdditiveCostTable``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    bias_seconds: PosFinite
    bs_probes: list[int] = Field(min_length=1, max_length=65536)
    alpha_seconds: list[Finite] = Field(min_length=1, max_length=65536)
    m_probes: list[int] = Field(min_length=1, max_length=65536)
    theta_seconds: list[Finite] = Field(min_length=1, max_length=65536)


class ProfileUpdate(_Msg):
    type: Literal["profile"] = "profile"
    profile_key: IdStr
    fingerprint: EngineFingerprint
    model: SpsModelState
    heldout_error: ErrorMetrics
    samples_seen: int = Field(ge=0)
    issued_at: NonNegFinite
    seq: int = Field(ge=0)

    def to_sps_model(self) -> Any:
        """Rebuild a predicting ``SpsModel`` from the update."""
        return self.model.to_model()


class BudgetDecision(_Msg):
    """The controller's current verify-budget advice for one engine.

    ``budget_tokens`` is a draft-token budget K (beyond the one anchor per request)
    computed from *old* acceptance statistics, so a worker may apply it as a global top-K
    of its live survival products without breaking losslessness. ``sps_table`` (for
    ``num_requests``) and ``sps_additive`` (any R) are the learned curve for a worker
    that plans locally. ``verify_all`` means: verify every draft token.

    Under policy ``no_draft`` (``policy.mode``) the worker runs no draft forward at all;
    the budget fields then read "verify all" (``verify_all``, K = R * gamma, frac 1) only
    for a worker that drafts anyway (one without the no-draft switch): it runs stock DSpark
    instead of paying for drafts it would throw away.
    """

    type: Literal["decision"] = "decision"
    engine_id: IdStr
    profile_key: IdStr
    policy: PolicySpec
    seq: int = Field(ge=0)
    issued_at: NonNegFinite
    valid_for_s: PosFinite
    num_requests: int = Field(ge=0)
    verify_all: bool = False
    budget_tokens: Optional[int] = Field(default=None, ge=0)
    budget_frac: Optional[Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]] = None
    max_budget_tokens: Optional[int] = Field(default=None, ge=0)
    explore_prob: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    sps_table: Optional[SpsTable] = None
    sps_additive: Optional[SpsAdditiveTable] = None
    expected_tau: Optional[NonNegFinite] = None
    predicted_throughput: Optional[NonNegFinite] = None
    reason: str = Field(default="", max_length=2048)

    def sps_function(self, num_requests: Optional[int] = None) -> Any:
        """``B -> steps/s`` at ``num_requests`` from the shipped curve: the table when R is the
        decision's own, else the additive form (valid at every R); None when neither fits."""
        r = self.num_requests if num_requests is None else int(num_requests)
        if self.sps_additive is not None and (self.sps_table is None or r != self.num_requests):
            a = self.sps_additive

            def interp(xs: list[int], ys: list[float], x: float) -> float:
                import bisect

                if x <= xs[0]:
                    return ys[0]
                if x >= xs[-1]:
                    return ys[-1]
                hi = bisect.bisect_right(xs, x)
                lo = hi - 1
                return ys[lo] + (x - xs[lo]) / (xs[hi] - xs[lo]) * (ys[hi] - ys[lo])

            floor = a.bias_seconds + interp(a.bs_probes, a.alpha_seconds, float(r))
            return lambda b: 1.0 / max(floor + interp(a.m_probes, a.theta_seconds, float(b)), 1e-12)
        if self.sps_table is not None and r == self.num_requests:
            return self.sps_table.lookup
        # a table is the curve at the decision's own R: never apply it to another batch size
        return None


# ---------------------------------------------------------------- CLI <-> controller
class SetPolicy(_Msg):
    type: Literal["set_policy"] = "set_policy"
    policy: PolicySpec
    engine_id: Optional[IdStr] = None


class SetPolicyReply(_Msg):
    type: Literal["set_policy_reply"] = "set_policy_reply"
    ok: bool
    message: str = Field(default="", max_length=4096)
    policy: Optional[PolicySpec] = None


class StatusRequest(_Msg):
    type: Literal["status"] = "status"


class EngineStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    engine_id: str
    worker_id: str
    profile_key: str
    state: Literal["connected", "lost"]
    last_seen_s_ago: float
    steps: int
    last_seq: int
    num_requests: int
    budget_tokens: Optional[int] = None
    verify_all: bool = False
    policy: str = ""
    decision_seq: int = 0
    acceptance: list[float] = Field(default_factory=list)


class ProfileStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    profile_key: str
    target_model: str
    device_name: str
    gamma: int
    samples_seen: int
    ready: bool
    heldout_error: ErrorMetrics
    drift_scale: float
    engines: list[str]
    path: str = ""


class StatusReply(_Msg):
    type: Literal["status_reply"] = "status_reply"
    controller_id: str
    started_at: float
    uptime_s: float
    policy: PolicySpec
    engine_policies: dict[str, PolicySpec] = Field(default_factory=dict)
    engines: list[EngineStatus]
    profiles: list[ProfileStatus]
    counters: dict[str, float]
    dropped: dict[str, int]
    endpoints: dict[str, str] = Field(default_factory=dict)


class ErrorReply(_Msg):
    type: Literal["error"] = "error"
    message: str = Field(max_length=4096)


class ProfileRequest(_Msg):
    """CLI -> controller: the full learned profile (``dspark-controller profile --from-controller``)."""

    type: Literal["profile_request"] = "profile_request"
    profile_key: IdStr


class ProfileReply(_Msg):
    """The profile as it would be persisted (cells, raw samples, held-out error)."""

    type: Literal["profile_reply"] = "profile_reply"
    profile: ProfileFile


Message = Annotated[
    Union[Register, Heartbeat, TelemetryBatch, RegisterAck, HeartbeatAck, ProfileUpdate,
          BudgetDecision, SetPolicy, SetPolicyReply, StatusRequest, StatusReply, ErrorReply,
          ProfileRequest, ProfileReply],
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Message)
_TYPES = frozenset(("register", "heartbeat", "telemetry", "register_ack", "heartbeat_ack",
                    "profile", "decision", "set_policy", "set_policy_reply", "status",
                    "status_reply", "error", "profile_request", "profile_reply"))


class DecodeError(Exception):
    """A message that must be dropped; ``reason`` is one of :data:`DROP_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def encode(msg: _Msg) -> list[bytes]:
    """Frames for a request/reply socket: ``[type, body]``."""
    return [msg.type.encode("ascii"), msg.model_dump_json(exclude_none=True).encode("utf-8")]


def decision_topic(engine_id: str) -> bytes:
    return b"D|" + engine_id.encode("utf-8") + b"|"


def profile_topic(profile_key: str) -> bytes:
    return b"P|" + profile_key.encode("utf-8") + b"|"


def encode_pub(msg: Union[BudgetDecision, ProfileUpdate]) -> list[bytes]:
    """Frames for the PUB socket: ``[topic, body]``."""
    if isinstance(msg, BudgetDecision):
        topic = decision_topic(msg.engine_id)
    elif isinstance(msg, ProfileUpdate):
        topic = profile_topic(msg.profile_key)
    else:
        raise TypeError(f"only decisions and profile updates are published, not {type(msg).__name__}")
    return [topic, msg.model_dump_json(exclude_none=True).encode("utf-8")]


def decode_body(body: bytes, *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Any:
    """Validate one JSON body; raises :class:`DecodeError` (never anything else)."""
    try:
        if len(body) > max_bytes:
            raise DecodeError("oversized", f"{len(body)} bytes > limit {max_bytes}")
        try:
            return _ADAPTER.validate_json(body)
        except ValidationError as exc:
            raise _classify(body, exc) from None
    except DecodeError:
        raise
    except Exception as exc:  # defensive: the controller must never crash on input
        raise DecodeError("invalid", f"{exc.__class__.__name__}") from None


def _classify(body: bytes, exc: ValidationError) -> DecodeError:
    try:
        obj = json.loads(body)
    except Exception:
        return DecodeError("bad_json", "body is not JSON")
    if not isinstance(obj, dict):
        return DecodeError("invalid", "body is not a JSON object")
    version = obj.get("version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        return DecodeError("unknown_version", f"version {version!r} (this build speaks {PROTOCOL_VERSION})")
    if obj.get("type") not in _TYPES:
        return DecodeError("unknown_type", f"type {str(obj.get('type'))[:64]!r}")
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    return DecodeError("invalid", f"{loc}: {first.get('msg', '')}"[:300])


def decode_frames(frames: list[bytes], *, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                  expect: Optional[tuple[type, ...]] = None, topic_frame: bool = False) -> Any:
    """Decode ``[type-or-topic, body]``; raises :class:`DecodeError` for anything unusable.

    With ``topic_frame=False`` frame 0 must equal the body's ``type``. ``expect`` restricts
    the accepted message classes (others raise ``unexpected_type``).
    """
    if len(frames) != 2:
        raise DecodeError("bad_framing", f"{len(frames)} frames, expected 2")
    head, body = frames
    if len(head) > 256:
        raise DecodeError("bad_framing", "type/topic frame longer than 256 bytes")
    msg = decode_body(body, max_bytes=max_bytes)
    if msg.version != PROTOCOL_VERSION:
        raise DecodeError("unknown_version", f"version {msg.version} (this build speaks {PROTOCOL_VERSION})")
    if not topic_frame and head != msg.type.encode("ascii"):
        raise DecodeError("type_mismatch", f"frame says {head[:32]!r}, body says {msg.type!r}")
    if expect is not None and not isinstance(msg, expect):
        raise DecodeError("unexpected_type", f"{msg.type!r} not accepted on this socket")
    return msg


class DropCounter:
    """Counts dropped messages by reason (thread-compatible: one writer)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n

    def total(self) -> int:
        return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


class RateLimitedLog:
    """Logs at most once per ``interval_s`` per key, reporting how many were suppressed."""

    def __init__(self, logger: logging.Logger, *, interval_s: float = 5.0) -> None:
        self._logger = logger
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: Any) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        n = self._suppressed.pop(key, 0)
        self._last[key] = now
        suffix = f" ({n} similar suppressed in the last {self._interval:g}s)" if n else ""
        self._logger.warning(msg + suffix, *args)
        return True


def finite_or_none(x: Any) -> Optional[float]:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
