"""The profiles library: build, check, convert, summarise and compare profile files.

Everything here works on files and in-memory objects only (no server, no controller):

* :func:`build_profile` turns measured ``(R, B, step_time_s)`` samples into a
  :class:`~dspark_controller.core.profile_file.ProfileFile` (fit on a training split, error
  reported on a held-out split);
* :func:`load_any` reads a DSpark profile or an SGLang ``SpsCostTable`` /
  ``SpsAdditiveCostTable`` JSON; :func:`validate_file` checks one;
* :func:`export_table` / :func:`import_table` convert to and from SGLang's tables;
* :func:`summary_table`, :func:`budget_table` and :func:`diff_profiles` produce the
  rows behind ``dspark-controller show`` and ``dspark-controller diff``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from dspark_controller.core.profile_file import (EngineFingerprint, ErrorMetrics, Measurement, ProfileFile, SpsModelState,
                           export_json_schema, make_provenance)
from dspark_controller.core.sps_model import ErrorSummary, PriorCurve, SpsModel, SpsModelConfig

__all__ = [
    "ProfileToolError", "LoadedProfile", "build_profile", "load_any", "validate_file", "FileCheck",
    "STRICT_MAX_HELDOUT_ERROR", "measured_range", "extrapolation_warnings", "export_table",
    "import_table", "sglang_table_loader", "write_json_atomic", "write_text_atomic", "schema_text", "sample_cells", "summary_table", "budget_table",
    "diff_profiles", "DiffResult", "format_table",
]


class ProfileToolError(ValueError):
    """A file or argument the profile tools cannot use (the message says why and what to do)."""


# ------------------------------------------------------------------ building
def build_profile(samples: Sequence[Sequence[float]], *, fingerprint: EngineFingerprint, command: str,
                  heldout_frac: float = 0.1, seed: int = 0, config: Optional[SpsModelConfig] = None,
                  created_at: Optional[str] = None,
                  measurement: Optional[Measurement] = None) -> tuple[ProfileFile, SpsModel, ErrorSummary]:
    """Fit an :class:`SpsModel` to ``[R, B, step_time_s]`` samples and wrap it as a profile file.

    A seeded ``heldout_frac`` of the samples is kept out of the fit; the profile's
    ``heldout_error`` is the model's error on exactly those (fractions, not percent).
    ``measurement`` (how the sweep ended, e.g. whether it converged) is stored as given;
    ``validate`` reports it. The training samples are fed
    in a seeded random order so the model's drift factor (which follows recent residuals)
    sees no trend from the order of the measurement rounds.
    """
    arr = np.asarray(samples, dtype=np.float64).reshape(-1, 3) if len(samples) else np.zeros((0, 3))
    ok = np.isfinite(arr).all(axis=1) & (arr[:, 2] > 0) & (arr[:, 0] >= 1) & (arr[:, 1] >= arr[:, 0])
    arr = arr[ok]
    if arr.shape[0] == 0:
        raise ProfileToolError("no usable samples (need [R, B, step_time_s] with B >= R >= 1 and t > 0)")
    cfg = config or SpsModelConfig()
    need_b = int(arr[:, 1].max()) + 1
    if need_b > cfg.max_batch_tokens:
        from dataclasses import replace

        cfg = replace(cfg, max_batch_tokens=int(2 ** math.ceil(math.log2(need_b))))
    rng = np.random.default_rng(seed)
    held = rng.random(arr.shape[0]) < heldout_frac if heldout_frac > 0 else np.zeros(arr.shape[0], dtype=bool)
    if held.all():
        held[:] = False
    train = arr[~held][rng.permutation(int((~held).sum()))]
    model = SpsModel(config=cfg)
    for r, b, t in train.tolist():
        model.update(int(r), int(b), float(t))
    if not model.ready:
        raise ProfileToolError(f"only {train.shape[0]} training samples; the model needs at least "
                               f"{cfg.min_ready_samples} to be usable. Profile longer.")
    if held.any():
        err = model.evaluate(arr[held, 0].astype(int), arr[held, 1].astype(int), arr[held, 2])
    else:
        err = model.heldout_error()
    pf = ProfileFile(profile_key=fingerprint.profile_key(), fingerprint=fingerprint,
                     model=SpsModelState(**model.to_state()), heldout_error=ErrorMetrics.from_summary(err),
                     samples_seen=int(train.shape[0]),
                     provenance=make_provenance(command=command[:4096], created_at=created_at,
                                                sglang_version=fingerprint.sglang_version),
                     measurement=measurement)
    return pf, model, err


# ------------------------------------------------------------------ loading
@dataclass
class LoadedProfile:
    """A profile or an SGLang table, with a model that predicts its step times."""

    path: str
    kind: str                                   # "profile" | "cost" | "additive"
    model: SpsModel
    profile: Optional[ProfileFile] = None
    table: Optional[dict] = None
    samples: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))

    @property
    def gamma(self) -> Optional[int]:
        return self.profile.fingerprint.gamma if self.profile is not None else None

    def describe(self) -> str:
        if self.profile is None:
            return f"SGLang {'SpsCostTable' if self.kind == 'cost' else 'SpsAdditiveCostTable'} {self.path}"
        fp = self.profile.fingerprint
        return (f"profile {self.profile.profile_key} ({self.path}): {Path(fp.target_model).name or fp.target_model}"
                f" + {Path(fp.draft_model).name or fp.draft_model or '-'} on {fp.device_name}, gamma={fp.gamma}, "
                f"tp={fp.tp_size}, sglang {fp.sglang_version or '?'}")


def _read_json(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileToolError(f"cannot read {path}: {exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ProfileToolError(f"{path} is not JSON ({exc})") from None


def _table_kind(data: Any) -> Optional[str]:
    if not isinstance(data, dict):
        return None
    if "bias_seconds" in data:
        return "additive"
    if "sample_batch_tokens" in data:
        return "cost"
    return None


def load_any(path: str) -> LoadedProfile:
    """A DSpark profile file or an SGLang SPS table (raises :class:`ProfileToolError`)."""
    data = _read_json(path)
    if isinstance(data, dict) and "profile_key" in data:
        try:
            pf = ProfileFile.model_validate(data)
        except Exception as exc:
            raise ProfileToolError(f"{path} is not a valid DSpark profile: {_first_line(exc)}") from None
        try:
            model = SpsModel.from_state(pf.model.model_dump())
        except ValueError as exc:
            raise ProfileToolError(f"{path}: the model state does not load ({exc})") from None
        raw = np.asarray(pf.model.raw_samples, dtype=np.float64).reshape(-1, 3)
        return LoadedProfile(path=path, kind="profile", model=model, profile=pf, samples=raw)
    kind = _table_kind(data)
    if kind is None:
        raise ProfileToolError(f"{path}: not a DSpark profile (no 'profile_key'), SGLang SpsCostTable "
                               "('sample_batch_tokens') or SpsAdditiveCostTable ('bias_seconds')")
    try:
        prior = PriorCurve.from_sglang_table(data)
        model = SpsModel(prior=prior)
    except (ValueError, TypeError, KeyError) as exc:
        raise ProfileToolError(f"{path}: {exc}") from None
    return LoadedProfile(path=path, kind=kind, model=model, table=data)


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip().splitlines()
    if len(s) >= 3 and "validation error" in s[0]:
        return f"{s[1].strip()}: {s[2].strip()}"
    return s[0] if s else exc.__class__.__name__


def sglang_table_loader() -> Any:
    """SGLang's own ``load_sps_table_from_path``, or None when SGLang is not installed.

    Loaded from SGLang's ``dspark_sps.py`` file directly (it only needs msgspec), so a
    check does not pay for importing the whole of SGLang (torch, kernels); the code that
    runs is exactly SGLang's.
    """
    import importlib.util
    import sys

    mod = sys.modules.get("sglang.srt.speculative.dspark_components.dspark_sps")
    if mod is not None:
        return mod.load_sps_table_from_path
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "srt" / "speculative" / "dspark_components" / "dspark_sps.py"
    if not path.is_file():
        return None
    try:
        fspec = importlib.util.spec_from_file_location("_sglang_dspark_sps_standalone", path)
        module = importlib.util.module_from_spec(fspec)
        fspec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception:
        return None
    return module.load_sps_table_from_path


#: ``validate`` warns (and ``validate --strict`` fails) above this held-out step-time error
#: (a fraction: 0.25 = 25%). Profiles measured on the 2-core development machine reach
#: 8-12% (noise floor ~7%: each held-out step predicted by its own cell's median), and the
#: profiler itself warns "very noisy" above 25%: a curve whose predictions miss a step by
#: more than a quarter on average cannot rank budgets whose step times differ by less.
STRICT_MAX_HELDOUT_ERROR = 0.25


@dataclass
class FileCheck:
    """What ``validate`` found in one file.

    ``problems`` make the file unusable (``ok`` False: exit 1). ``warnings`` are about how
    much its numbers can be trusted (held-out error above ``max_error``, a measurement that
    did not converge, no held-out error, no provenance): reported always, fatal only with
    ``--strict``. ``notes`` describe the file.
    """

    ok: bool
    problems: list[str]
    warnings: list[str]
    notes: list[str]


def measured_range(lp: LoadedProfile) -> Optional[dict]:
    """``{"r_min", "r_max", "b_min", "b_max"}`` over the raw samples the file keeps, or None
    (an SGLang table, or an imported profile: nothing was measured)."""
    if not lp.samples.size:
        return None
    r, b = lp.samples[:, 0], lp.samples[:, 1]
    return {"r_min": int(r.min()), "r_max": int(r.max()), "b_min": int(b.min()), "b_max": int(b.max())}


def validate_file(path: str, *, max_error: float = STRICT_MAX_HELDOUT_ERROR) -> FileCheck:
    """Check a profile file or an SGLang table (see :class:`FileCheck`)."""
    problems: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    try:
        lp = load_any(path)
    except ProfileToolError as exc:
        return FileCheck(False, [str(exc)], warnings, notes)
    if lp.profile is None:
        notes.append(lp.describe())
        load_sps_table_from_path = sglang_table_loader()
        if load_sps_table_from_path is None:
            notes.append("SGLang is not installed here; checked the table with DSpark's own reader only")
        else:
            try:
                load_sps_table_from_path(str(path))
                notes.append("SGLang's load_sps_table_from_path accepts it")
            except Exception as exc:
                problems.append(f"SGLang's loader rejects it: {_first_line(exc)}")
        return FileCheck(not problems, problems, warnings, notes)
    pf = lp.profile
    model = lp.model
    notes.append(lp.describe())
    if pf.profile_key != pf.fingerprint.profile_key():
        problems.append(f"profile_key {pf.profile_key} does not match its fingerprint "
                        f"({pf.fingerprint.profile_key()}); the controller would skip this file")
    if not model.ready:
        problems.append("the model has no data and no prior (it predicts nothing; the controller would verify all)")
    else:
        b = np.arange(1, min(model.max_batch_tokens, 4096) + 1)
        for r in sorted({1, 4, 16, 64} | {int(x) for x in np.unique(lp.samples[:, 0])[:64]}):
            t = np.asarray(model.predict_step_time(np.full(b.shape, r), b))
            if not np.all(np.isfinite(t)) or np.any(t <= 0):
                problems.append(f"non-finite or non-positive predicted step time at R={r}")
                break
            if np.any(np.diff(t) < -1e-12 * np.abs(t[:-1])):
                problems.append(f"predicted step time decreases with B at R={r}")
                break
    raw = lp.samples
    if raw.size:
        bad = ~(np.isfinite(raw).all(axis=1) & (raw[:, 2] > 0) & (raw[:, 1] >= raw[:, 0]) & (raw[:, 0] >= 1))
        if bad.any():
            problems.append(f"{int(bad.sum())} raw samples are invalid (need B >= R >= 1, t > 0)")
    rng = measured_range(lp)
    span = "" if rng is None else f" (R = {rng['r_min']}..{rng['r_max']}, B = {rng['b_min']}..{rng['b_max']})"
    notes.append(f"{pf.samples_seen} samples learned, {raw.shape[0]} raw samples kept{span}")
    err = pf.heldout_error
    if err.mape is None:
        if pf.samples_seen > 0:
            warnings.append("no held-out step-time error was measured (n=0): how well the curve predicts steps "
                            "is unknown")
        else:
            notes.append("held-out error: none (no measured samples: the curve is a table or prior)")
    else:
        notes.append(f"held-out step-time error {100 * err.mape:.1f}% (n={err.n}"
                     + ("" if err.p90_abs_rel is None else f", p90 {100 * err.p90_abs_rel:.1f}%") + ")")
        if err.mape > max_error:
            warnings.append(f"held-out step-time error {100 * err.mape:.1f}% (n={err.n}) is above the "
                            f"{100 * max_error:g}% limit (--max-error {max_error:g}): predictions miss a step by "
                            "more than that on average; re-profile on an otherwise idle server")
    m = pf.measurement
    if m is None:
        notes.append("convergence: not recorded (learned online by a controller, imported, or written before "
                     "profiles recorded it)")
    elif m.converged:
        notes.append(f"convergence: converged at {100 * m.precision:g}% precision ({m.passes} passes, "
                     f"{m.rounds} rounds)")
    else:
        warnings.append(f"the measurement did not converge: it stopped after {m.passes} passes ({m.rounds} rounds, "
                        f"{m.wall_s:.0f}s) before its estimates reached {100 * m.precision:g}% precision "
                        "(--max-passes / --max-time); profile again, longer or on a quieter machine")
    if not pf.provenance.command:
        warnings.append("provenance.command is empty (how was this made?)")
    else:
        notes.append(f"made by: {pf.provenance.command}")
    return FileCheck(not problems, problems, warnings, notes)


def extrapolation_warnings(lp: LoadedProfile, *, num_requests: Optional[int] = None,
                           b_max: Optional[int] = None) -> list[str]:
    """Why an export at an explicitly requested ``num_requests`` / ``b_max`` would be
    extrapolated: outside the R (or beyond the B) the file's raw samples measured. Empty
    for tables and imported profiles (nothing measured to compare with)."""
    rng = measured_range(lp)
    out: list[str] = []
    if rng is None:
        return out
    if num_requests is not None and not rng["r_min"] <= num_requests <= rng["r_max"]:
        out.append(f"--num-requests {num_requests} is outside the range this profile measured "
                   f"(R = {rng['r_min']}..{rng['r_max']}): the curve at R = {num_requests} is extrapolated, "
                   "not measured; profile at that load (e.g. --concurrency) to export a measured curve")
    if b_max is not None and b_max > rng["b_max"]:
        out.append(f"--b-max {b_max} is beyond the largest batch this profile measured (B = {rng['b_max']}): "
                   f"step times above B = {rng['b_max']} are extrapolated")
    return out


# ------------------------------------------------------------------ conversions
from dspark_controller.core.profile_file import write_text_atomic  # noqa: E402  (one atomic writer)


def write_json_atomic(path: str | Path, obj: Any, *, indent: Optional[int] = None) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


def default_num_requests(lp: LoadedProfile) -> int:
    """The largest R with data (where the budget matters most), else 1."""
    if lp.samples.size:
        return int(lp.samples[:, 0].max())
    return 1


def export_table(lp: LoadedProfile, fmt: str, *, num_requests: Optional[int] = None,
                 b_min: Optional[int] = None, b_max: Optional[int] = None) -> dict:
    """SGLang ``SpsCostTable`` (``fmt='cost'``, at ``num_requests``) or ``SpsAdditiveCostTable``."""
    if not lp.model.ready:
        raise ProfileToolError(f"{lp.path}: the profile has no data; nothing to export")
    if fmt == "additive":
        if num_requests is not None or b_min is not None or b_max is not None:
            raise ProfileToolError("--num-requests/--b-min/--b-max only apply to --format cost "
                                   "(the additive table covers every R and B)")
        return lp.model.to_sglang_additive_table()
    if fmt != "cost":
        raise ProfileToolError(f"unknown format {fmt!r}; use cost or additive")
    r = default_num_requests(lp) if num_requests is None else int(num_requests)
    if r < 1:
        raise ProfileToolError("--num-requests must be >= 1")
    if b_max is None and lp.gamma is not None:
        b_max = r * (lp.gamma + 1)
    table = lp.model.to_sglang_cost_table(num_requests=r, b_min=b_min, b_max=b_max)
    return table


def import_table(path: str, *, fingerprint: EngineFingerprint, command: str,
                 config: Optional[SpsModelConfig] = None) -> ProfileFile:
    """A profile whose curve is an SGLang table (as a prior: no samples, held-out n=0)."""
    data = _read_json(path)
    if _table_kind(data) is None:
        raise ProfileToolError(f"{path} is not an SGLang SpsCostTable or SpsAdditiveCostTable")
    try:
        model = SpsModel(config=config or SpsModelConfig(), prior=PriorCurve.from_sglang_table(data))
    except (ValueError, TypeError, KeyError) as exc:
        raise ProfileToolError(f"{path}: {exc}") from None
    return ProfileFile(profile_key=fingerprint.profile_key(), fingerprint=fingerprint,
                       model=SpsModelState(**model.to_state()), heldout_error=ErrorMetrics(n=0),
                       samples_seen=0, provenance=make_provenance(command=command[:4096],
                                                                  sglang_version=fingerprint.sglang_version))


def schema_text() -> str:
    return json.dumps(export_json_schema(), indent=2, sort_keys=True) + "\n"


# ------------------------------------------------------------------ summaries
def sample_cells(samples: np.ndarray) -> list[dict]:
    """Per (R, B): count, median and quartiles of the measured step time (seconds)."""
    out: list[dict] = []
    if samples.size == 0:
        return out
    rb = samples[:, :2].astype(np.int64)
    keys, inv = np.unique(rb, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    for i, (r, b) in enumerate(keys.tolist()):
        t = samples[inv == i, 2]
        out.append({"R": int(r), "B": int(b), "n": int(t.size), "median_s": float(np.median(t)),
                    "q25_s": float(np.quantile(t, 0.25)), "q75_s": float(np.quantile(t, 0.75))})
    return out


def summary_table(lp: LoadedProfile, *, max_rows: int = 60) -> tuple[list[str], list[list[str]]]:
    """Rows of the ``show`` table: per measured (R, B) cell, samples vs fit."""
    header = ["R", "B", "n", "measured ms", "IQR ms", "fit ms", "fit err", "steps/s", "B tokens/s"]
    rows: list[list[str]] = []
    cells = sample_cells(lp.samples)
    if cells:
        if len(cells) > max_rows:
            idx = np.unique(np.linspace(0, len(cells) - 1, max_rows).round().astype(int))
            cells = [cells[i] for i in idx]
        for c in cells:
            fit = float(lp.model.predict_step_time(c["R"], c["B"]))
            rows.append([str(c["R"]), str(c["B"]), str(c["n"]), f"{1e3 * c['median_s']:.2f}",
                         f"{1e3 * c['q25_s']:.1f}-{1e3 * c['q75_s']:.1f}", f"{1e3 * fit:.2f}",
                         f"{100 * (fit - c['median_s']) / c['median_s']:+.1f}%", f"{1.0 / fit:.1f}",
                         f"{c['B'] / fit:.0f}"])
        return header, rows
    # a table or a profile without raw samples: the fit on a grid
    g = lp.gamma or 7
    for r in (1, 2, 4, 8, 16, 32, 64):
        for b in sorted({r, r + (r * g) // 2, r * (g + 1)}):
            fit = float(lp.model.predict_step_time(r, b))
            rows.append([str(r), str(b), "0", "-", "-", f"{1e3 * fit:.2f}", "-", f"{1.0 / fit:.1f}",
                         f"{b / fit:.0f}"])
    return header, rows


def load_levels(lp: LoadedProfile, *, max_levels: int = 8) -> list[int]:
    """Representative request counts: those with data (log-spaced subset), else powers of two."""
    if lp.samples.size:
        rs, counts = np.unique(lp.samples[:, 0].astype(int), return_counts=True)
        rs = rs[counts >= 0.05 * counts.max()]          # the swept loads, not a few stray steps
        if rs.size > max_levels:
            pick = np.unique(np.geomspace(rs[0], rs[-1], max_levels).round().astype(int))
            rs = np.unique([int(rs[np.argmin(np.abs(rs - p))]) for p in pick])
        return [int(r) for r in rs]
    return [1, 2, 4, 8, 16, 32, 64]


def budget_rows(lp: LoadedProfile, confidences: Sequence[float], *,
                levels: Optional[Sequence[int]] = None, gamma: Optional[int] = None) -> list[dict]:
    """What the scheduler would pick per load: ``compute_lagged_budget`` over this profile.

    Every running request is given the same per-position conditional confidence c (so the
    survival of draft position j is c^j); K is the draft-token budget, B = R + K.
    """
    from dspark_controller.core.method import compute_lagged_budget

    g = gamma or lp.gamma or 7
    out = []
    for c in confidences:
        for r in (levels or load_levels(lp)):
            sps = lp.model.sps_function(int(r))
            lb = compute_lagged_budget(np.full((int(r), g), float(c)), sps)
            tau_all = r * (1.0 + sum(float(c) ** j for j in range(1, g + 1)))
            t_all = float(lp.model.predict_step_time(int(r), int(r * (g + 1))))
            out.append({"confidence": float(c), "R": int(r), "K": int(lb.budget_tokens), "B": int(lb.batch_tokens),
                        "frac": lb.budget_tokens / (r * g), "step_ms": 1e3 / float(sps(int(lb.batch_tokens))),
                        "expected_tokens_per_step": float(lb.expected_tau),
                        "throughput_tok_s": float(lb.predicted_throughput),
                        "verify_all_tok_s": tau_all / t_all})
    return out


def _pct(x: float) -> str:
    v = round(100 * x, 1)
    return f"{v + 0.0:+.1f}%" if v != 0 else "0.0%"


def budget_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = ["conf", "R", "K", "B", "K/(R*gamma)", "step ms", "tokens/step", "tok/s", "verify-all tok/s", "gain"]
    body = [[f"{d['confidence']:g}", str(d["R"]), str(d["K"]), str(d["B"]), f"{d['frac']:.2f}",
             f"{d['step_ms']:.2f}", f"{d['expected_tokens_per_step']:.2f}", f"{d['throughput_tok_s']:.1f}",
             f"{d['verify_all_tok_s']:.1f}", _pct(d['throughput_tok_s'] / d['verify_all_tok_s'] - 1)]
            for d in rows]
    return header, body


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ diff
@dataclass
class DiffResult:
    a: str
    b: str
    rows: list[dict]
    summary: dict
    fingerprint_changes: dict

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "rows": self.rows, "summary": self.summary,
                "fingerprint_changes": self.fingerprint_changes}


def _known_rb(lp: LoadedProfile) -> set[tuple[int, int]]:
    if not lp.samples.size:
        return set()
    return {(int(r), int(b)) for r, b in lp.samples[:, :2].astype(int).tolist()}


def diff_profiles(a: LoadedProfile, b: LoadedProfile, *, levels: Optional[Sequence[int]] = None,
                  points_per_level: int = 6) -> DiffResult:
    """Per-bin relative difference (B - A) / A of the predicted step time on a shared grid.

    Grid: the request counts either profile has data for (or powers of two), and for each
    R a few batch sizes between R and R(gamma+1). A row is ``measured`` in a profile when
    that profile has raw samples in the same B-bin at that R.
    """
    if not (a.model.ready and b.model.ready):
        raise ProfileToolError("both profiles need data (or a table) to be compared")
    g = max(a.gamma or 0, b.gamma or 0) or 7
    if levels is None:
        la = set(load_levels(a)) if a.samples.size else set()
        lb = set(load_levels(b)) if b.samples.size else set()
        levels = sorted(la | lb) or [1, 2, 4, 8, 16, 32, 64]
    ka, kb = _known_rb(a), _known_rb(b)
    bins = a.model.b_edges

    def measured(known: set, r: int, bb: int) -> bool:
        i = int(np.searchsorted(bins, bb, side="right") - 1)
        lo, hi = int(bins[max(i, 0)]), int(bins[min(i + 1, bins.size - 1)])
        return any(rr == r and lo <= x < hi for rr, x in known)

    rows = []
    for r in levels:
        bs = np.unique(np.linspace(r, r * (g + 1), points_per_level).round().astype(int))
        for bb in bs.tolist():
            ta = float(a.model.predict_step_time(int(r), int(bb)))
            tb = float(b.model.predict_step_time(int(r), int(bb)))
            rows.append({"R": int(r), "B": int(bb), "a_ms": 1e3 * ta, "b_ms": 1e3 * tb, "rel_diff": (tb - ta) / ta,
                         "measured_a": measured(ka, int(r), bb), "measured_b": measured(kb, int(r), bb)})
    rel = np.asarray([x["rel_diff"] for x in rows])
    both = np.asarray([x["measured_a"] and x["measured_b"] for x in rows])
    i = int(np.argmax(np.abs(rel)))
    summary = {"points": len(rows), "mean_abs_rel_diff": float(np.mean(np.abs(rel))),
               "median_rel_diff": float(np.median(rel)), "max_abs_rel_diff": float(np.abs(rel[i])),
               "max_at": {"R": rows[i]["R"], "B": rows[i]["B"]},
               "points_measured_in_both": int(both.sum()),
               "mean_abs_rel_diff_measured_in_both": float(np.mean(np.abs(rel[both]))) if both.any() else None,
               "heldout_error_a": None if a.profile is None else a.profile.heldout_error.mape,
               "heldout_error_b": None if b.profile is None else b.profile.heldout_error.mape}
    changes = {}
    if a.profile is not None and b.profile is not None:
        fa, fb = a.profile.fingerprint.model_dump(), b.profile.fingerprint.model_dump()
        changes = {k: [fa[k], fb[k]] for k in fa if fa[k] != fb.get(k)}
    return DiffResult(a=a.path, b=b.path, rows=rows, summary=summary, fingerprint_changes=changes)
