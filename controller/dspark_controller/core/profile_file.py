"""Schema of persisted SPS profiles, and the engine fingerprint they are keyed by.

A profile file (``<profiles_dir>/<profile_key>.json``) holds one engine
configuration's learned step-time model: the fingerprint it was learned for, the
fitted parameters *and* the cell statistics (so learning resumes after a restart), a
bounded list of raw samples, the held-out error at save time, and provenance (the
command that wrote it, when, and the versions involved).

Files are written atomically (temp file in the same directory, fsync, ``os.replace``)
so a crash never leaves a half-written profile. ``export_json_schema()`` returns the
JSON Schema of the file for external tooling.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from dspark_controller import __version__

__all__ = [
    "PROFILE_SCHEMA_VERSION",
    "EngineFingerprint",
    "ErrorMetrics",
    "Measurement",
    "SpsModelState",
    "Provenance",
    "ProfileFile",
    "export_json_schema",
    "save_profile",
    "load_profile",
    "profile_path",
    "make_provenance",
    "default_profiles_dir",
    "looks_like_profile",
    "describe_validation_error",
]

PROFILE_SCHEMA_VERSION = 1
_RANK_FIELDS = ("tp_rank", "dp_rank")
_MAX_RAW = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineFingerprint(_Strict):
    """What determines an engine's step-time curve.

    Engines whose fingerprints agree on everything except ``tp_rank`` and ``dp_rank``
    share one profile (``profile_key()``).
    """

    target_model: str = Field(min_length=1, max_length=512)
    draft_model: str = Field(default="", max_length=512)
    gamma: int = Field(ge=1, le=256, description="draft tokens per block (DSpark gamma)")
    block_size: Optional[int] = Field(default=None, ge=1, le=257)
    device_name: str = Field(min_length=1, max_length=256)
    tp_rank: int = Field(default=0, ge=0, le=65535)
    tp_size: int = Field(default=1, ge=1, le=65536)
    dp_rank: int = Field(default=0, ge=0, le=65535)
    dp_size: int = Field(default=1, ge=1, le=65536)
    dtype: str = Field(default="", max_length=64)
    attention_backend: str = Field(default="", max_length=128)
    sglang_version: str = Field(default="", max_length=64)

    def shared_fields(self) -> dict[str, Any]:
        """The fields that identify the shared profile (everything except ranks)."""
        d = self.model_dump()
        for k in _RANK_FIELDS:
            d.pop(k, None)
        return d

    def profile_key(self) -> str:
        blob = json.dumps(self.shared_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class ErrorMetrics(_Strict):
    """Relative step-time prediction error on held-out samples.

    Every value is a **fraction** of the measured step time, not a percentage: ``mape``
    0.121 means the prediction misses a held-out step by 12.1% on average. ``mape`` is the
    mean of ``|pred - t| / t``, ``rmse_rel`` the root mean square of ``(pred - t) / t``,
    ``p90_abs_rel`` the 90th percentile of ``|pred - t| / t``, ``bias_rel`` the mean of
    ``(pred - t) / t`` (positive: the profile predicts slower steps than measured); ``n``
    the number of held-out steps (0: no held-out error, the other fields are None).
    """

    n: int = Field(ge=0)
    mape: Optional[float] = None
    rmse_rel: Optional[float] = None
    p90_abs_rel: Optional[float] = None
    bias_rel: Optional[float] = None

    @classmethod
    def from_summary(cls, summary: Any) -> "ErrorMetrics":
        d = summary.to_dict() if hasattr(summary, "to_dict") else dict(summary)

        def clean(v: Any) -> Optional[float]:
            try:
                f = float(v)
            except (TypeError, ValueError):
                return None
            return f if f == f and f not in (float("inf"), float("-inf")) else None

        return cls(n=int(d.get("n", 0)), mape=clean(d.get("mape")), rmse_rel=clean(d.get("rmse_rel")),
                   p90_abs_rel=clean(d.get("p90_abs_rel")), bias_rel=clean(d.get("bias_rel")))


class SpsModelState(BaseModel):
    """Serialised ``sps_model.SpsModel`` (see that module for the meaning of each field)."""

    model_config = ConfigDict(extra="forbid")

    format: int = Field(ge=1)
    config: dict[str, Any]
    b_edges: list[int] = Field(min_length=2, max_length=10_000)
    r_edges: list[int] = Field(min_length=2, max_length=10_000)
    theta: list[float] = Field(max_length=10_000)
    alpha: list[float] = Field(max_length=10_000)
    jumps: list[int] = Field(default_factory=list, max_length=10_000)
    # per R-bin correction of the additive fit: [r_bin, b1, seconds1, b2, seconds2, ...]
    row_lines: list[list[float]] = Field(default_factory=list, max_length=10_000)
    scale: float = Field(gt=0)
    rel_scale: float = Field(gt=0)
    steps: int = Field(ge=0)
    cells: list[list[float]] = Field(default_factory=list, max_length=1_000_000)
    prior_theta: Optional[list[float]] = None
    prior_alpha: Optional[list[float]] = None
    raw_samples: list[list[float]] = Field(default_factory=list, max_length=_MAX_RAW)

    @field_validator("b_edges", "r_edges")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(v, v[1:])) or v[0] < 1:
            raise ValueError("bin edges must be strictly increasing integers starting at >= 1")
        return v

    @field_validator("cells")
    @classmethod
    def _cells(cls, v: list[list[float]]) -> list[list[float]]:
        for c in v:
            if len(c) != 4:
                raise ValueError("each cell is [r_bin, b_bin, weight, mean_seconds]")
        return v

    @field_validator("row_lines")
    @classmethod
    def _row_lines(cls, v: list[list[float]]) -> list[list[float]]:
        for c in v:
            if len(c) < 3 or len(c) % 2 == 0:
                raise ValueError("each row correction is [r_bin, b1, seconds1, b2, seconds2, ...]")
        return v

    @field_validator("raw_samples")
    @classmethod
    def _raw(cls, v: list[list[float]]) -> list[list[float]]:
        for s in v:
            if len(s) != 3:
                raise ValueError("each raw sample is [num_requests, batch_tokens, step_time_s]")
        return v

    def to_model(self) -> Any:
        from dspark_controller.core.sps_model import SpsModel

        return SpsModel.from_state(self.model_dump())


class Provenance(_Strict):
    command: str = Field(default="", max_length=4096)
    created_at: str = ""
    updated_at: str = ""
    host: str = Field(default="", max_length=256)
    versions: dict[str, str] = Field(default_factory=dict)


class Measurement(_Strict):
    """How an active profile (``dspark-controller profile --url``) was measured: whether
    the sweep met its stopping rule (``converged``: every cell measured ``--min-passes``
    times, 90% of the cells' relative standard errors below ``precision``, and the fit
    moved less than ``precision / 2`` in the last pass) or stopped at ``--max-passes`` /
    ``--max-time`` first. ``precision`` is a fraction (0.05 = 5%). Absent from profiles the
    controller learned online and from imported tables, which have no stopping rule."""

    method: str = Field(default="active", max_length=32)
    converged: bool
    precision: float = Field(gt=0, lt=1)
    passes: int = Field(ge=0)
    rounds: int = Field(ge=0)
    wall_s: float = Field(default=0.0, ge=0)


class ProfileFile(BaseModel):
    """One persisted profile."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = PROFILE_SCHEMA_VERSION
    profile_key: str = Field(min_length=1, max_length=64, pattern=r"^[0-9a-zA-Z_.-]+$")
    fingerprint: EngineFingerprint
    model: SpsModelState
    heldout_error: ErrorMetrics
    samples_seen: int = Field(ge=0)
    provenance: Provenance
    measurement: Optional[Measurement] = None

    @model_serializer(mode="wrap")
    def _omit_unset_measurement(self, handler: Any) -> Any:
        # a file without a measurement stays byte-for-byte what readers before the field expect
        data = handler(self)
        if isinstance(data, dict) and data.get("measurement", 0) is None:
            data.pop("measurement")
        return data

    @field_validator("schema_version")
    @classmethod
    def _schema(cls, v: int) -> int:
        if v != PROFILE_SCHEMA_VERSION:
            raise ValueError(f"profile schema_version {v} is not supported (this build reads "
                             f"{PROFILE_SCHEMA_VERSION}); re-learn the profile or convert it.")
        return v


def export_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12, as pydantic emits it) of a profile file."""
    schema = ProfileFile.model_json_schema()
    schema["$id"] = f"https://dspark.invalid/profile-file/v{PROFILE_SCHEMA_VERSION}"
    return schema


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def make_provenance(*, command: Optional[str] = None, created_at: Optional[str] = None,
                    sglang_version: str = "") -> Provenance:
    import numpy

    versions = {"dspark_controller": __version__, "numpy": numpy.__version__,
                "python": platform.python_version()}
    if sglang_version:
        versions["sglang"] = sglang_version
    now = _now_iso()
    return Provenance(command=command if command is not None else " ".join(sys.argv)[:4096],
                      created_at=created_at or now, updated_at=now,
                      host=platform.node()[:256], versions=versions)


def default_profiles_dir() -> str:
    """Where ``dspark-controller serve`` keeps profiles unless ``--profiles-dir`` says otherwise.

    A per-user state folder, never the working directory (from a clone of this repository
    that would be its ``profiles/``, which holds other engines' profiles and SGLang tables):
    ``$XDG_STATE_HOME/sglang-dspark/profiles`` when ``XDG_STATE_HOME`` is an absolute path
    (the XDG base-directory rule), else ``~/.local/state/sglang-dspark/profiles``. Created on
    the first save, not before.
    """
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return str(base / "sglang-dspark" / "profiles")


_OUR_FILE_NAME = re.compile(r"^[0-9a-f]{16}\.json$")     # what the controller writes: <profile_key>.json


def looks_like_profile(path: str | os.PathLike, data: Any = None) -> bool:
    """True when a file claims to be one of our profiles: its JSON is an object with a
    ``profile_key`` (every ``ProfileFile`` has one; SGLang's SPS tables, provenance notes and
    other JSON do not), or, when it does not parse (``data`` None), its name is the
    ``<16 hex digits>.json`` the controller persists under. Files that do not claim to be
    profiles are not ours to complain about."""
    if isinstance(data, dict):
        return "profile_key" in data
    return data is None and bool(_OUR_FILE_NAME.match(Path(path).name))


def describe_validation_error(exc: BaseException) -> str:
    """One line: the first wrong field and what is wrong with it (pydantic's own first line is
    only ``1 validation error for ProfileFile``)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            errs = errors()
        except Exception:
            errs = []
        if errs:
            e = errs[0]
            where = ".".join(str(x) for x in e.get("loc", ())) or "the file"
            more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
            return f"{where}: {e.get('msg', 'invalid')}{more}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else exc.__class__.__name__


def profile_path(directory: str | os.PathLike, profile_key: str) -> Path:
    return Path(directory) / f"{profile_key}.json"


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Temp file in the same directory, fsync, ``os.replace`` (never a half-written file);
    the file gets the umask's mode (mkstemp makes 0600; profiles are not secrets)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def save_profile(path: str | os.PathLike, profile: ProfileFile) -> Path:
    """Write atomically (:func:`write_text_atomic`)."""
    return write_text_atomic(path, profile.model_dump_json(indent=None))


def load_profile(path: str | os.PathLike) -> ProfileFile:
    """Read and validate a profile file (raises ``ValueError`` with the reason)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read profile {path}: {exc}") from exc
    try:
        return ProfileFile.model_validate_json(text)
    except Exception as exc:  # pydantic.ValidationError or JSON errors
        raise ValueError(f"{path} is not a valid DSpark profile file ({describe_validation_error(exc)}); "
                         f"`dspark-controller validate {path}` says more") from exc
