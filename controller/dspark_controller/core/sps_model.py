"""Online model of the target verify step time t(R, B).

R is the number of running requests in a decode step and B the number of tokens the
target verifies in that step (one anchor per request plus the admitted draft tokens,
so ``B = R + K`` where K is the draft-token budget). SPS(B) = 1 / t(R, B) is the
"verify steps per second" curve that DSpark's scheduler maximises ``tau * SPS(B)``
against.

Model
-----
``t(R, B) = s * (theta(B) + alpha[bin_R(R)])``

* ``theta(B)``: estimated per B-bin (bins one token wide up to
  ``exact_batch_tokens_upto``, then ``batch_bins_per_octave`` power-of-two aligned bins per
  octave), evaluated between bins by linear interpolation through one knot per bin,
  *except* across a detected jump, where it steps at the bin edge. So a smooth curve is
  smooth (Algorithm 1's early stop needs that: a staircase made of estimation noise
  would stop it at the first stair) and a jagged, step-wise GPU curve (tile or graph-tier
  boundaries) keeps its steps. A jump is an increase between neighbouring bins larger
  than the local trend predicts by ``jump_z`` standard errors (and ``min_jump_rel``).
  Between jumps the bin estimates are smoothed by a weighted local-linear fit over
  ``smooth_half_window`` bins on each side (unbiased on linear trends).
* ``alpha``: an additive per-request term per R-bin (per-request overheads, sampling, KV
  bookkeeping). A small ridge (``alpha_ridge`` pseudo-samples) pulls it toward the prior
  (or zero) where the data cannot separate it from ``theta``.
* ``s``: a global multiplicative drift factor that adapts fast (``scale_half_life_steps``)
  so a uniform slowdown or speed-up (clocks, co-tenancy, longer contexts) is followed in
  a few dozen steps while the shape keeps a long memory (``half_life_steps``).
* a per-row correction: the additive split is only an approximation (a step's cost per
  verified token need not be the same at 4 requests as at 32), and where it is off, every
  row's slope in B is off, which is exactly what the planner trades against. So each
  R-bin row with data smooths its own cells' residuals against the additive fit: a
  weighted local-linear fit over ``row_window`` measured bins on each side of each
  measured bin (a straight line when the row has few; its curvature when it has many),
  applied over the B range the row has measured, interpolated between its bins and
  held flat outside, and the row's curve is kept non-decreasing in B. Each value is
  shrunk towards zero by ``row_shrink_samples`` pseudo-samples, and each local slope is
  a posterior mean under a prior of zero with a spread of ``row_slope_rel`` times the
  fit's own slope there, given the noise of the steps (``rel_scale``): a row measured
  at one budget and a couple of others stays close to the additive fit. On a 2-core CPU engine the additive fit alone made
  verifying 8 more tokens at 4 requests look 19% dearer than the row's own data said (9%
  at 32 requests), and the worker cut budgets too far (``row_correction=False`` turns the
  correction off).

Fitting
-------
Every sample lands in one (R-bin, B-bin) cell holding an exponentially forgotten
effective count ``w`` and mean ``y`` of the drift-normalised step time ``t / s`` (O(1)
Python-scalar update). Where its B-bin is backed by data and the fit saw its R-bin row
(``young_row_refit`` forgotten samples or more), a sample is Huber-clipped in log space
against the current prediction at ``huber_k`` times a running robust scale, so a GC
pause or a preempted step moves little; a *young* row's prediction is extrapolated from
other loads, weak evidence against a sample: it is clipped only beyond a factor of 2 (a
warm-up step), and moves neither the clip scale nor the drift factor. Every
``refit_every`` updates, on demand, and before a prediction at a young row that has
steps the fit has not seen (so a load jump is priced from its own first steps, not for
``refit_every`` steps from the extrapolation), the cells are solved exactly for the
weighted ridge least-squares additive fit (a Schur complement on the R-bins), thin bins
are filled (below), jumps detected, segments smoothed, and the knots made non-decreasing
by weighted pool-adjacent-violators: the predicted step time never falls when more
tokens are verified. The result is a dense table of ``theta`` per integer B, so
predictions are table lookups.

Thin data
---------
A B-bin is *known* once its effective weight reaches ``min_bin_weight``.

* With a prior (a profile loaded from file, or an SGLang table): every bin is a weighted
  blend of its data and the prior, the prior counting ``prior_weight`` pseudo-samples;
  bins without data follow the prior (times the drift factor).
* Without a prior: unknown bins between known ones get the cheapest step time a
  non-decreasing, convex curve allows there (the left bin's time, or the right bin's
  less the slope of the known bins to its right, whichever is more; at most the chord:
  :meth:`SpsModel._fill_gaps_optimistically`), so a gap that may hide a roofline's knee
  is priced as if it did, and the planner visits it and measures it (a gap priced at
  the chord, an upper bound of any convex truth, is never visited); below the smallest
  known bin the step time is held flat (no speed-up is predicted for verifying fewer
  tokens than ever seen); above the largest known bin it grows linearly with the slope
  of the last few known bins, at least ``extrapolate_min_slope`` of and at most the
  proportional slope ``t(B_hi) / B_hi`` (no free tokens are predicted beyond what was
  seen). With no data at all the model is *not ready*: ``predict_step_time`` returns NaN
  and ``sps_function`` returns a flat curve, which makes every planner verify all tokens,
  exactly SGLang's behaviour with an uninitialised SPS table.

Beyond ``max_batch_tokens`` step time grows in proportion to B. Nothing here imports
pydantic or SGLang; the worker can run this in its decode loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

__all__ = [
    "SpsModelConfig",
    "SpsModel",
    "PriorCurve",
    "ErrorSummary",
    "make_bin_edges",
    "replay",
]

_STATE_FORMAT = 1
_MIN_STEP_SECONDS = 1e-9
_BELOW_FLOOR = 0.5              # a row's curve below its measured range: at least this share of the scaled fit
_MAD_TO_SIGMA = 1.4826          # median |x| of a normal = 0.6745 sigma
_YOUNG_ROW_CLIP = math.log(2.0)  # a young row's samples are clipped beyond 2x its extrapolated prediction


@dataclass(frozen=True)
class SpsModelConfig:
    """Static configuration of an :class:`SpsModel` (part of the persisted state)."""

    max_batch_tokens: int = 8192
    max_requests: int = 1024
    exact_batch_tokens_upto: int = 64
    batch_bins_per_octave: int = 32
    exact_requests_upto: int = 16
    request_bins_per_octave: int = 8
    half_life_steps: float = 2000.0
    scale_half_life_steps: float = 48.0
    scale_warmup_steps: int = 500
    huber_k: float = 3.0
    min_bin_weight: float = 2.0
    prior_weight: float = 4.0
    alpha_ridge: float = 1.0
    alpha_smooth: float = 50.0
    smooth_half_window: int = 3
    jump_z: float = 6.0
    min_jump_rel: float = 0.01
    refit_every: int = 32
    young_row_refit: float = 8.0
    row_correction: bool = True
    row_shrink_samples: float = 8.0
    row_slope_rel: float = 0.5
    row_window: int = 3
    extrapolate_min_slope: float = 0.25
    min_ready_samples: int = 16
    max_raw_samples: int = 4096
    error_window: int = 512

    def validate(self) -> None:
        def pow2(x: int) -> bool:
            return x >= 1 and (x & (x - 1)) == 0

        if not pow2(self.exact_batch_tokens_upto) or not pow2(self.batch_bins_per_octave):
            raise ValueError(
                "exact_batch_tokens_upto and batch_bins_per_octave must be powers of two, got "
                f"{self.exact_batch_tokens_upto} and {self.batch_bins_per_octave}.")
        if self.batch_bins_per_octave > self.exact_batch_tokens_upto:
            raise ValueError("batch_bins_per_octave must be <= exact_batch_tokens_upto so bins stay at "
                             "least one token wide.")
        if not pow2(self.exact_requests_upto) or not pow2(self.request_bins_per_octave):
            raise ValueError("exact_requests_upto and request_bins_per_octave must be powers of two.")
        if self.request_bins_per_octave > self.exact_requests_upto:
            raise ValueError("request_bins_per_octave must be <= exact_requests_upto.")
        if self.max_batch_tokens < 2 or self.max_requests < 1:
            raise ValueError("max_batch_tokens must be >= 2 and max_requests >= 1.")
        if not self.half_life_steps > 0:
            raise ValueError(f"half_life_steps must be > 0 (in steps), got {self.half_life_steps}.")
        if self.scale_half_life_steps < 0:
            raise ValueError("scale_half_life_steps must be >= 0 (0 disables the drift factor).")
        if not (self.huber_k > 0 and self.min_bin_weight > 0 and self.prior_weight >= 0):
            raise ValueError("huber_k and min_bin_weight must be > 0 and prior_weight >= 0.")
        if not 0.0 <= self.extrapolate_min_slope <= 1.0:
            raise ValueError("extrapolate_min_slope must be in [0, 1] (a fraction of the proportional slope).")
        if not (self.row_shrink_samples >= 0 and self.row_slope_rel > 0 and self.row_window >= 1):
            raise ValueError("row_shrink_samples must be >= 0, row_slope_rel > 0 and row_window >= 1 (how "
                             "far and how locally each row's correction may move from the additive fit).")
        if not self.alpha_ridge > 0 or self.alpha_smooth < 0:
            raise ValueError("alpha_ridge must be > 0 (it keeps the additive fit identifiable).")
        if self.smooth_half_window < 0 or not self.jump_z > 0 or self.min_jump_rel < 0:
            raise ValueError("smooth_half_window must be >= 0, jump_z > 0 and min_jump_rel >= 0.")
        if not self.young_row_refit >= 0:
            raise ValueError(f"young_row_refit must be >= 0 (forgotten samples; 0 turns it off), got "
                             f"{self.young_row_refit!r}.")
        if self.refit_every < 1 or self.max_raw_samples < 0 or self.error_window < 1 or self.min_ready_samples < 1:
            raise ValueError("refit_every, error_window and min_ready_samples must be >= 1, "
                             "max_raw_samples >= 0.")


def make_bin_edges(*, exact_upto: int, per_octave: int, max_value: int) -> np.ndarray:
    """Left edges of the bins plus one final exclusive upper edge.

    Bins are ``[edges[i], edges[i+1])``: one wide up to ``exact_upto``, then ``per_octave``
    equal power-of-two-aligned bins per octave, until ``max_value`` is covered (the last
    edge is the first one greater than ``max_value``).
    """
    edges = list(range(1, exact_upto + 1))
    lo = exact_upto
    while edges[-1] <= max_value:
        width = max(1, lo // per_octave)
        edges.extend(lo + k * width for k in range(1, per_octave + 1))
        lo *= 2
    arr = np.asarray(edges, dtype=np.int64)
    last = int(np.searchsorted(arr, max_value, side="right"))
    return arr[: last + 1]


@dataclass(frozen=True)
class ErrorSummary:
    """Relative prediction error ``(pred - t) / t`` over a set of samples."""

    n: int
    mape: float
    rmse_rel: float
    p90_abs_rel: float
    bias_rel: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @staticmethod
    def from_relative_errors(rel: Any) -> "ErrorSummary":
        rel = np.asarray(rel, dtype=np.float64)
        rel = rel[np.isfinite(rel)]
        if rel.size == 0:
            nan = float("nan")
            return ErrorSummary(n=0, mape=nan, rmse_rel=nan, p90_abs_rel=nan, bias_rel=nan)
        a = np.abs(rel)
        return ErrorSummary(n=int(rel.size), mape=float(a.mean()), rmse_rel=float(math.sqrt(float((rel * rel).mean()))),
                            p90_abs_rel=float(np.quantile(a, 0.9)), bias_rel=float(rel.mean()))


def _floor_lookup(xs: np.ndarray, ys: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def fn(x: np.ndarray) -> np.ndarray:
        return ys[np.clip(np.searchsorted(xs, x, side="right") - 1, 0, xs.size - 1)]
    return fn


class PriorCurve:
    """A step-time curve used where the data is thin: ``theta(B) + alpha(R)`` seconds.

    Build it from an SGLang table (:meth:`from_sglang_table`), from a fitted model
    (:meth:`from_model`), or from explicit vectorised callables.
    """

    def __init__(self, *, theta: Callable[[np.ndarray], np.ndarray],
                 alpha: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                 description: str = "prior") -> None:
        self._theta = theta
        self._alpha = alpha
        self.description = description

    def theta_at(self, batch_tokens: Any) -> np.ndarray:
        return np.asarray(self._theta(np.asarray(batch_tokens, dtype=np.float64)), dtype=np.float64)

    def alpha_at(self, num_requests: Any) -> np.ndarray:
        r = np.asarray(num_requests, dtype=np.float64)
        if self._alpha is None:
            return np.zeros_like(r)
        return np.asarray(self._alpha(r), dtype=np.float64)

    def step_time(self, num_requests: Any, batch_tokens: Any) -> np.ndarray:
        return self.theta_at(batch_tokens) + self.alpha_at(num_requests)

    @staticmethod
    def from_sglang_table(table: Mapping[str, Any]) -> "PriorCurve":
        """Prior from SGLang's ``SpsCostTable`` or ``SpsAdditiveCostTable`` JSON dict."""
        if not isinstance(table, Mapping):
            raise ValueError("an SGLang SPS table must be a JSON object")
        if "bias_seconds" in table:
            bias = float(table["bias_seconds"])
            bs = np.asarray(table["bs_probes"], dtype=np.float64)
            al = np.asarray(table["alpha_seconds"], dtype=np.float64)
            mp = np.asarray(table["m_probes"], dtype=np.float64)
            th = np.asarray(table["theta_seconds"], dtype=np.float64)
            if not bias > 0 or bs.size == 0 or mp.size == 0 or bs.size != al.size or mp.size != th.size:
                raise ValueError("invalid SpsAdditiveCostTable: need bias_seconds > 0 and matching non-empty "
                                 "probe/value lists.")
            return PriorCurve(theta=lambda b: bias + np.interp(b, mp, th), alpha=lambda r: np.interp(r, bs, al),
                              description="SGLang SpsAdditiveCostTable")
        if "sample_batch_tokens" in table:
            probes = np.asarray(table["sample_batch_tokens"], dtype=np.float64)
            sps = np.asarray(table["sample_steps_per_sec"], dtype=np.float64)
            if probes.size == 0 or probes.size != sps.size or np.any(~(sps > 0)):
                raise ValueError("invalid SpsCostTable: need equal-length non-empty probes and positive "
                                 "steps_per_sec.")
            return PriorCurve(theta=_floor_lookup(probes, 1.0 / sps), description="SGLang SpsCostTable")
        raise ValueError("not an SGLang SPS table: expected keys 'sample_batch_tokens' (SpsCostTable) or "
                         "'bias_seconds' (SpsAdditiveCostTable).")

    @staticmethod
    def from_model(model: "SpsModel") -> "PriorCurve":
        """Freeze a fitted model (drift factor baked in) into a prior."""
        if not model.ready:
            raise ValueError("cannot use an SPS model with no data as a prior; feed it samples first.")
        model._ensure_fit()
        s = model.scale
        table = model._table.copy() * s
        alpha = model._alpha.copy() * s
        top = table.size - 1
        r_left = model.r_edges[:-1].astype(np.float64)

        def th(b: np.ndarray) -> np.ndarray:
            bi = np.clip(np.asarray(b, dtype=np.float64), 1, None)
            idx = np.clip(bi.astype(np.int64), 1, top)
            return np.where(bi > top, table[top] * bi / top, table[idx])

        return PriorCurve(theta=th, alpha=_floor_lookup(r_left, alpha), description="fitted profile")


def _pav_nondecreasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators: the closest non-decreasing sequence.

    A sequence that is already non-decreasing comes back as a copy; otherwise the pools
    are built on Python floats (a refit's hot loop: numpy scalar indexing costs several
    times as much per element)."""
    n = y.size
    if n <= 1 or not (y[1:] < y[:-1]).any():
        return y.astype(np.float64, copy=True)
    vals: list[float] = []
    wts: list[float] = []
    cnt: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist()):
        v, wt, c = yi, wi, 1
        while vals and vals[-1] > v:
            pw = wts.pop()
            tw = pw + wt
            v = (vals.pop() * pw + v * wt) / tw
            wt = tw
            c += cnt.pop()
        vals.append(v)
        wts.append(wt)
        cnt.append(c)
    return np.repeat(np.asarray(vals, dtype=np.float64), cnt)


def _window_sums(xc: np.ndarray, y: np.ndarray, w: np.ndarray, half: int) -> tuple[np.ndarray, ...]:
    """Per point, the weighted sums over a window of +-half points that a local-linear fit
    needs: ``S0 = sum w``, ``S1 = sum w xc``, ``S2 = sum w xc^2``, ``T0 = sum w y``, ``T1 =
    sum w xc y`` (vectorised with cumulative sums; ``xc``: centred positions)."""
    n = xc.size
    z = np.zeros(1)
    c = [np.concatenate([z, np.cumsum(v)]) for v in (w, w * xc, w * xc * xc, w * y, w * xc * y)]
    idx = np.arange(n)
    lo = np.clip(idx - half, 0, n)
    hi = np.clip(idx + half + 1, 0, n)
    return tuple(ci[hi] - ci[lo] for ci in c)


def _local_linear(x: np.ndarray, y: np.ndarray, w: np.ndarray, half: int) -> np.ndarray:
    """Weighted local-linear fit at each x over a window of +-half points (vectorised)."""
    if x.size <= 2 or half <= 0:
        return y.copy()
    xc = x - x.mean()
    S0, S1, S2, T0, T1 = _window_sums(xc, y, w, half)
    den = S0 * S2 - S1 * S1
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(np.abs(den) > 1e-12 * np.maximum(S0 * S2, 1e-300), (S0 * T1 - S1 * T0) / den, 0.0)
        icpt = np.where(S0 > 0, (T0 - slope * S1) / S0, y)
    out = icpt + slope * xc
    return np.where(np.isfinite(out), out, y)


def _local_linear_shrunk_segments(x: np.ndarray, y: np.ndarray, w: np.ndarray, seg: np.ndarray, starts: np.ndarray,
                                  ends: np.ndarray, half: int, lam: np.ndarray, n0: float) -> np.ndarray:
    """At each point, a weighted linear fit over +-half points of its own segment (points
    ``starts[k]:ends[k]``; ``seg``: each point's segment) with its slope shrunk by the
    segment's ridge ``lam[k]`` (in weight x units^2) and its value by ``S0 / (S0 + n0)``
    (S0: the window's weight), evaluated there; every segment at once (vectorised)."""
    sw = np.bincount(seg, weights=w, minlength=starts.size)
    xc = x - (np.bincount(seg, weights=w * x, minlength=starts.size) / sw)[seg]
    v = np.stack([w, w * xc, w * xc * xc, w * y, w * xc * y])
    idx = np.arange(x.size)
    lo, hi = starts[seg], ends[seg]
    sums = v.copy()
    for off in range(1, half + 1):          # direct window sums (a running sum over all rows
        for j in (idx - off, idx + off):    # would lose precision to cancellation)
            ok = (j >= lo) & (j < hi)
            sums += np.where(ok, v[:, np.where(ok, j, 0)], 0.0)
    S0, S1, S2, T0, T1 = sums
    den = np.maximum(S0 * S2 - S1 * S1, 0.0) + lam[seg] * S0
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(den > 0, (S0 * T1 - S1 * T0) / den, 0.0)
        out = (T0 - slope * S1) / S0 + slope * xc
    return out * S0 / (S0 + n0)


class SpsModel:
    """Online, robust, drift-following model of verify step time t(R, B).

    Hot-path API (cheap): :meth:`update`, :meth:`predict_step_time`, :meth:`sps`,
    :meth:`sps_function`. Exports and state are for the controller and tools.
    """

    def __init__(self, *, config: SpsModelConfig = SpsModelConfig(),
                 prior: Optional[PriorCurve] = None) -> None:
        config.validate()
        self.config = config
        self.b_edges = make_bin_edges(exact_upto=config.exact_batch_tokens_upto,
                                      per_octave=config.batch_bins_per_octave, max_value=config.max_batch_tokens)
        self.r_edges = make_bin_edges(exact_upto=config.exact_requests_upto,
                                      per_octave=config.request_bins_per_octave, max_value=config.max_requests)
        self.n_b = self.b_edges.size - 1
        self.n_r = self.r_edges.size - 1
        widths = np.diff(self.b_edges)
        self.knots = self.b_edges[:-1] + (widths - 1) // 2          # one integer knot per B-bin
        self._b_top = int(self.b_edges[-1])                           # table covers B in [0, b_top - 1]
        self._r_top = int(self.r_edges[-1])
        self._b_bin_np = np.clip(np.searchsorted(self.b_edges, np.arange(self._b_top), side="right") - 1,
                                 0, self.n_b - 1)
        self._r_bin_np = np.clip(np.searchsorted(self.r_edges, np.arange(self._r_top + 1), side="right") - 1,
                                 0, self.n_r - 1)
        self._b_bin = self._b_bin_np.tolist()
        self._r_bin = self._r_bin_np.tolist()
        self._lam = 0.5 ** (1.0 / config.half_life_steps)
        self._eta_scale = (1.0 - 0.5 ** (1.0 / config.scale_half_life_steps)
                           if config.scale_half_life_steps > 0 else 0.0)
        # cell statistics
        self._w = np.zeros((self.n_r, self.n_b))
        self._y = np.zeros((self.n_r, self.n_b))
        self._last = np.zeros((self.n_r, self.n_b), dtype=np.int64)
        self._row_seen = np.zeros(self.n_r, dtype=bool)
        self.steps = 0                  # samples accepted (the forgetting clock)
        self.rejected = 0               # non-finite / out-of-range samples ignored
        self.clipped = 0                # samples Huber-clipped
        self.refits = 0
        self.log_scale = 0.0
        self._drift_ewm = 0.0           # running mean log residual (drives the drift factor)
        self.rel_scale = 0.05           # running median |log residual| (robust noise scale)
        self._dirty = 0
        self._fit_valid = False
        # per R-bin: the forgotten samples the last fit saw there, and whether steps came since
        self._row_fit_w: list[float] = [0.0] * self.n_r
        self._row_unfitted: list[bool] = [False] * self.n_r
        # fitted curve
        self._theta = np.ones(self.n_b)                 # knot values (shape units)
        self._theta_raw_list: list[float] = [1.0] * self.n_b   # unsmoothed bin estimates (Huber reference)
        self._jumps = np.zeros(max(self.n_b - 1, 0), dtype=bool)   # step between bin b and b+1
        self._alpha = np.zeros(self.n_r)
        self._table = np.ones(self._b_top)              # theta(B) for integer B (index B)
        self._table_list: list[float] = []
        self._alpha_list: list[float] = []
        self._known_b = np.zeros(self.n_b, dtype=bool)
        # per-row corrections: R-bin -> (knots, corrections) as fitted (persisted), and the
        # monotone curve they give over the row's measured range: R-bin -> (lo, hi, shape
        # values for B = lo..hi); a row's dense table (the one definition of its predicted
        # curve, :meth:`_row_table`) is built on demand
        self._row_lines: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._row_fix: dict[int, tuple[int, int, np.ndarray]] = {}
        self._row_tables: dict[int, np.ndarray] = {}
        self._raw: deque = deque(maxlen=config.max_raw_samples)
        self._rel_err: deque = deque(maxlen=config.error_window)
        self._prior: Optional[PriorCurve] = None
        self._prior_theta = np.zeros(self.n_b)
        self._prior_alpha = np.zeros(self.n_r)
        self.set_prior(prior)

    # ------------------------------------------------------------------ prior
    def set_prior(self, prior: Optional[PriorCurve]) -> None:
        self._prior = prior
        if prior is not None:
            th = prior.theta_at(self.knots.astype(np.float64))
            al = prior.alpha_at(self.r_edges[:-1].astype(np.float64))
            if not (np.all(np.isfinite(th)) and np.all(np.isfinite(al))):
                raise ValueError("prior curve produced non-finite values on the model's bins.")
            self._prior_theta = th
            self._prior_alpha = al
        else:
            self._prior_theta = np.zeros(self.n_b)
            self._prior_alpha = np.zeros(self.n_r)
        self._fit_valid = False

    @property
    def has_prior(self) -> bool:
        return self._prior is not None

    @property
    def prior_description(self) -> Optional[str]:
        return None if self._prior is None else self._prior.description

    # ------------------------------------------------------------------ properties
    @property
    def scale(self) -> float:
        """The drift factor s."""
        return math.exp(self.log_scale)

    @property
    def ready(self) -> bool:
        """True once predictions are data- or prior-backed (see the module doc)."""
        return self._prior is not None or self.steps >= self.config.min_ready_samples

    @property
    def max_batch_tokens(self) -> int:
        return self._b_top - 1

    def jump_edges(self) -> list[int]:
        """Batch sizes B where the fitted curve steps up (detected jumps)."""
        self._ensure_fit()
        return [int(self.b_edges[i + 1]) for i in np.flatnonzero(self._jumps)]

    # ------------------------------------------------------------------ update
    def update(self, num_requests: int, batch_tokens: int, step_time_s: float) -> bool:
        """Ingest one measured step. O(1) (plus an occasional refit); False if rejected."""
        try:
            t = float(step_time_s)
            r = int(num_requests)
            b = int(batch_tokens)
        except (TypeError, ValueError, OverflowError):
            self.rejected += 1
            return False
        if not (t > 0.0 and math.isfinite(t)) or r < 1 or b < r or b >= self._b_top:
            self.rejected += 1
            return False
        cfg = self.config
        rb = self._r_bin[r] if r <= self._r_top else self.n_r - 1
        bb = self._b_bin[b]
        scale_old = math.exp(self.log_scale)
        y = t / scale_old
        if self.ready:
            if self._dirty >= cfg.refit_every or not self._fit_valid:
                self.refit()
            shape_pred = self._shape_at(rb, b)
            if shape_pred > 0.0:
                self._rel_err.append((scale_old * shape_pred - t) / t)
                kb = int(self.knots[bb])
                if self._known_b[bb]:
                    # Huber in log space against the fitted curve, only where this bin is backed by
                    # data (an extrapolated prediction is no evidence against a sample); the fit is
                    # robust to single-bin spikes by construction (median of three).  A young row's
                    # prediction is extrapolated from other loads: its samples are clipped only
                    # beyond a factor of _YOUNG_ROW_CLIP (a warm-up or preempted step), and move
                    # neither the noise scale nor the drift factor
                    young = self._row_fit_w[rb] < cfg.young_row_refit
                    log_r = math.log(y / shape_pred)
                    k = cfg.huber_k * max(_MAD_TO_SIGMA * self.rel_scale, 0.005)
                    if young:
                        k = max(k, _YOUNG_ROW_CLIP)
                    if log_r > k:
                        log_rc = k
                        self.clipped += 1
                    elif log_r < -k:
                        log_rc = -k
                        self.clipped += 1
                    else:
                        log_rc = log_r
                    if not young:
                        # running median of |log residual| (quantile tracking: outliers cannot inflate it)
                        self.rel_scale *= 1.02 if abs(log_r) > self.rel_scale else 0.98
                    if not young and self._eta_scale > 0.0 and self.steps >= cfg.scale_warmup_steps:
                        # the drift factor follows only a residual mean that is clearly non-zero, so
                        # without drift it stays put and the learned shape keeps consistent units
                        eta = self._eta_scale
                        self._drift_ewm += eta * (log_rc - self._drift_ewm)
                        dz = max(4.0 * _MAD_TO_SIGMA * self.rel_scale * math.sqrt(eta / (2.0 - eta)), 0.02)
                        if abs(self._drift_ewm) > dz:
                            delta = eta * log_rc
                            self.log_scale += delta
                            self._drift_ewm -= delta
                    y = shape_pred * math.exp(log_rc + math.log(scale_old) - self.log_scale)
                # store at the bin's knot (within-bin trend removed)
                y += self._table_list[kb] - self._table_list[b]
        self.steps += 1
        n = self.steps
        w_old = self._w[rb, bb]
        if w_old > 0.0:
            w_old *= self._lam ** (n - int(self._last[rb, bb]))
        w_new = w_old + 1.0
        if w_old > 1e-9:
            m = self._y[rb, bb]
            self._y[rb, bb] = m + (y - m) / w_new
        else:
            self._y[rb, bb] = y
        self._w[rb, bb] = w_new
        self._last[rb, bb] = n
        self._row_seen[rb] = True
        self._row_unfitted[rb] = True
        if cfg.max_raw_samples:
            self._raw.append((r, b, t))
        self._dirty += 1
        return True

    # ------------------------------------------------------------------ fit
    def _decayed_weights(self, where: Any = Ellipsis) -> np.ndarray:
        """Forgotten sample counts of the cells ``where`` selects (an index into ``_w``;
        every cell by default)."""
        age = (self.steps - self._last[where]).astype(np.float64)
        return self._w[where] * np.power(self._lam, age)

    def refit(self) -> None:
        """Additive ridge fit on the cells, fill thin bins, detect jumps, smooth, make monotone."""
        cfg = self.config
        self._dirty = 0
        self.refits += 1
        W_full = self._decayed_weights()
        self._row_fit_w = W_full.sum(axis=1).tolist()
        self._row_unfitted = [False] * self.n_r
        rows = np.flatnonzero(self._row_seen)
        has_prior = self._prior is not None
        n0 = cfg.prior_weight if has_prior else 0.0
        theta = self._prior_theta.copy() if has_prior else np.full(self.n_b, np.nan)
        alpha = self._prior_alpha.copy()
        Wb = np.zeros(self.n_b)
        if rows.size:
            W = W_full[rows]
            Y = self._y[rows]
            Wb = W.sum(axis=0)
            D = Wb + n0
            use = D > 1e-12
            Wu = W[:, use]
            Du = D[use]
            S = (Wu * Y[:, use]).sum(axis=0) + n0 * self._prior_theta[use]
            T = (W * Y).sum(axis=1)
            Wr = W.sum(axis=1)
            rho = cfg.alpha_ridge
            WuD = Wu / Du
            A = np.diag(Wr + rho) - WuD @ Wu.T
            if cfg.alpha_smooth > 0 and rows.size >= 3:
                # alpha is a per-request overhead: penalise its curvature across neighbouring
                # R-bins (linear trends are free), which tames the R/B confounding
                x = self.r_edges[rows].astype(np.float64)
                h = np.diff(x)
                D2 = np.zeros((rows.size - 2, rows.size))
                i = np.arange(rows.size - 2)
                D2[i, i] = 1.0 / h[:-1]
                D2[i, i + 1] = -(1.0 / h[:-1] + 1.0 / h[1:])
                D2[i, i + 2] = 1.0 / h[1:]
                D2 *= (0.5 * (h[:-1] + h[1:]))[:, None]
                A = A + cfg.alpha_smooth * (D2.T @ D2)
            rhs = T + rho * self._prior_alpha[rows] - WuD @ S
            try:
                a_sol = np.linalg.solve(A, rhs)
            except np.linalg.LinAlgError:
                a_sol = np.linalg.lstsq(A, rhs, rcond=None)[0]
            theta[np.flatnonzero(use)] = (S - Wu.T @ a_sol) / Du
            alpha[rows] = a_sol
            if not has_prior:
                rl = self.r_edges[:-1].astype(np.float64)
                alpha = np.interp(rl, rl[rows], a_sol)      # unseen R-bins: interpolate, flat outside
        known = Wb >= cfg.min_bin_weight
        weights = Wb + n0
        theta_raw = np.where(np.isfinite(theta), theta, 1.0)
        if not has_prior:
            theta, weights = self._fill_without_prior(theta, Wb, known)
        sig_rel = max(_MAD_TO_SIGMA * self.rel_scale, 0.002)
        theta = self._median3(theta, known | (n0 > 0))
        jumps = self._detect_jumps(theta, weights, sig_rel, known | (n0 > 0))
        pav_w = np.maximum(weights, 1e-6)
        # monotone first (pooling violators leaves flat shelves and kinks), then smooth the
        # kinks away inside each jump-free segment, then a final (tiny) monotone correction
        theta = _pav_nondecreasing(theta, pav_w)
        theta = self._smooth_segments(theta, weights, jumps)
        theta = _pav_nondecreasing(theta, pav_w)
        theta = np.maximum(theta, _MIN_STEP_SECONDS)
        min_alpha = float(alpha.min()) if alpha.size else 0.0
        if theta[0] + min_alpha <= _MIN_STEP_SECONDS:
            theta = theta + (2 * _MIN_STEP_SECONDS - (theta[0] + min_alpha))
        lines = self._fit_row_lines(theta, alpha, jumps, W_full, rows) if cfg.row_correction else {}
        self._set_fit(theta, alpha, jumps, known, theta_raw, row_lines=lines)

    def _fit_row_lines(self, theta: np.ndarray, alpha: np.ndarray, jumps: np.ndarray, W_full: np.ndarray,
                       rows: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per R-bin row with data: ``(knots, corrections)`` in shape seconds, over the knots
        of its bins from the first to the last with at least ``min_bin_weight``.

        At each measured bin, a weighted local-linear fit of the residuals (cell mean minus
        the additive fit) over ``row_window`` measured bins on each side, its slope shrunk
        by ``lam = (sigma * level / tau)^2`` (sigma: one step's relative noise; tau:
        ``row_slope_rel`` times the fit's slope over the row) and its value by
        ``S / (S + row_shrink_samples)`` (S: the window's forgotten samples)."""
        cfg = self.config
        n0 = float(cfg.row_shrink_samples)
        sig_rel = max(_MAD_TO_SIGMA * self.rel_scale, 0.002)
        x_all = self.knots.astype(np.float64)
        table = self._build_table(theta, jumps)
        half = int(cfg.row_window)
        # every row at once (a refit runs on the planner's step, and a serving engine has
        # dozens of rows): the rows' measured bins laid end to end, row by row
        W = W_full[rows]
        solid = W >= cfg.min_bin_weight
        keep = solid.any(axis=1)
        if not keep.any():
            return {}
        rows, W, solid = rows[keep], W[keep], solid[keep]
        nb = W.shape[1]
        first = solid.argmax(axis=1)
        last = nb - 1 - solid[:, ::-1].argmax(axis=1)
        col = np.arange(nb)
        ri, bi = np.nonzero((W > 1e-9) & (col >= first[:, None]) & (col <= last[:, None]))
        nr = rows.size
        counts = np.bincount(ri, minlength=nr)
        ends = np.cumsum(counts)
        starts = ends - counts
        x, w, rr = x_all[bi], W[ri, bi], rows[ri]
        fit = theta[bi] + alpha[rr]
        e = self._y[rr, bi] - fit
        sw = np.bincount(ri, weights=w, minlength=nr)
        level = np.bincount(ri, weights=w * fit, minlength=nr) / sw
        lo, hi = x[starts].astype(np.int64), x[ends - 1].astype(np.int64)
        fit_slope = np.where(hi > lo, (table[hi] - table[lo]) / np.maximum(hi - lo, 1), 0.0)
        tau = cfg.row_slope_rel * np.maximum(fit_slope, 1e-3 * np.abs(level))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            lam = (sig_rel * np.abs(level) / tau) ** 2
        lam = np.where((tau > 0) & np.isfinite(lam), lam, 1e300)
        corr = _local_linear_shrunk_segments(x, e, w, ri, starts, ends, half, lam, n0)
        ok = np.bincount(ri, weights=~np.isfinite(corr), minlength=nr) == 0
        return {int(rows[k]): (x[starts[k]:ends[k]].astype(np.int64), corr[starts[k]:ends[k]])
                for k in np.flatnonzero(ok).tolist()}

    @staticmethod
    def _median3(theta: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """Median of three neighbouring known bins: removes single-bin spikes, keeps steps."""
        idx = np.flatnonzero(eligible)
        if idx.size < 3:
            return theta
        v = theta[idx]
        med = v.copy()
        med[1:-1] = np.median(np.stack([v[:-2], v[1:-1], v[2:]]), axis=0)
        out = theta.copy()
        out[idx] = med
        return out

    def _set_fit(self, theta: np.ndarray, alpha: np.ndarray, jumps: np.ndarray, known: np.ndarray,
                 theta_raw: Optional[np.ndarray] = None,
                 row_lines: Optional[Mapping[int, tuple[np.ndarray, np.ndarray]]] = None) -> None:
        self._theta = theta
        self._theta_raw_list = (theta if theta_raw is None else theta_raw).tolist()
        self._alpha = alpha
        self._jumps = jumps
        self._known_b = known
        self._table = self._build_table(theta, jumps)
        self._table_list = self._table.tolist()
        self._alpha_list = alpha.tolist()
        self._row_lines = dict(row_lines or {})
        self._row_fix = {}
        self._row_tables = {}
        top = self._b_top - 1
        for rb, (kx, kc) in self._row_lines.items():
            lo, hi = max(1, min(int(kx[0]), top)), max(1, min(int(kx[-1]), top))
            if hi < lo:
                continue
            base = self._table[lo:hi + 1] + alpha[rb]
            v = base + np.interp(np.arange(lo, hi + 1, dtype=np.float64), np.asarray(kx, dtype=np.float64), kc)
            v = np.maximum.accumulate(np.maximum(v, 2 * _MIN_STEP_SECONDS))   # non-decreasing in B
            self._row_fix[int(rb)] = (lo, hi, v)
        self._fit_valid = True

    def _shape_at(self, rb: int, b: int) -> float:
        """Drift-free predicted step time at R-bin ``rb`` and ``0 <= b < b_top`` (scalar path)."""
        return float(self._row_table(rb)[max(b, 1)])

    def _row_table(self, rb: int) -> np.ndarray:
        """Dense drift-free step times of R-bin ``rb`` for B = 0 .. b_top - 1 (cached per fit):
        the additive fit, its measured range replaced by the corrected curve, and the parts
        below and above shifted to meet that curve at its ends (monotone, continuous).  Below,
        the shift is floored at half the additive fit scaled to meet the curve: a row whose
        own curve lies far under the additive fit at its first measured bin would otherwise
        price a few tokens at zero or less (SPS(1) < 0 stopped the planner)."""
        t = self._row_tables.get(rb)
        if t is None:
            t = self._table + self._alpha[rb]
            fix = self._row_fix.get(rb)
            if fix is not None:
                lo, hi, vals = fix
                below = t[:lo]
                t[:lo] = np.maximum(below + (vals[0] - t[lo]), _BELOW_FLOOR * below * (vals[0] / t[lo]))
                t[hi + 1:] += vals[-1] - t[hi]
                t[lo:hi + 1] = vals
            self._row_tables[rb] = t
        return t

    def additive_step_time(self, num_requests: int, batch_tokens: int) -> float:
        """Predicted step seconds of the additive part alone (no per-row correction): what
        :meth:`to_sglang_additive_table` exports."""
        self._require_ready()
        self._ensure_fit()
        r, b, top = int(num_requests), int(batch_tokens), self._b_top - 1
        rb = self._r_bin[max(r, 0)] if r <= self._r_top else self.n_r - 1
        th = self._table_list[max(b, 1)] if b <= top else self._table_list[top] * b / top
        return self.scale * (th + self._alpha_list[rb])

    def row_correction_extent(self) -> tuple[float, Optional[int]]:
        """Largest relative change the per-row corrections make to the additive fit, over the
        ranges the rows measured, and the first R of that row (``(0.0, None)`` without any)."""
        self._ensure_fit()
        worst, at = 0.0, None
        for rb, (lo, hi, vals) in self._row_fix.items():
            base = self._table[lo:hi + 1] + self._alpha[rb]
            rel = float(np.max(np.abs(vals / np.maximum(base, 1e-300) - 1.0)))
            if rel > worst:
                worst, at = rel, int(self.r_edges[rb])
        return worst, at

    def row_corrections(self) -> dict[int, dict[str, float]]:
        """The fitted per-row corrections (seconds, drift-free), keyed by the row's first R."""
        self._ensure_fit()
        return {int(self.r_edges[rb]): {"batch_tokens": [int(x) for x in kx], "seconds": [float(c) for c in kc]}
                for rb, (kx, kc) in sorted(self._row_lines.items())}

    def _build_table(self, theta: np.ndarray, jumps: np.ndarray) -> np.ndarray:
        """Dense theta(B), B = 0..b_top-1: linear between knots, steps at jumps."""
        table = np.empty(self._b_top)
        cuts = np.flatnonzero(jumps) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [self.n_b]])
        for s, e in zip(starts.tolist(), ends.tolist()):
            lo = 0 if s == 0 else int(self.b_edges[s])
            hi = int(self.b_edges[e])                  # exclusive
            xs = np.arange(lo, hi, dtype=np.float64)
            table[lo:hi] = np.interp(xs, self.knots[s:e].astype(np.float64), theta[s:e])
        return table

    @staticmethod
    def _fill_gaps_optimistically(out: np.ndarray, theta: np.ndarray, x: np.ndarray, kidx: np.ndarray) -> None:
        """Lower each gap between known bins ``a < b`` (``out`` holds the chord) to the
        cheapest curve a non-decreasing, convex step time allows there: ``max(t_a, t_b -
        s (x_b - x))``, never above the chord.  ``s``: the secant from ``b`` to the farthest
        known bin within one gap width to its right (at least the next known bin), at most
        the proportional slope ``t_b / x_b``; a gap with no known bin to the right of ``b``
        keeps the chord.  Vectorised: a refit runs on the planner's step."""
        n = kidx.size
        if n < 3:
            return
        gap = np.flatnonzero(np.diff(kidx) > 1)
        gap = gap[gap + 2 < n]                              # a known bin right of b
        if gap.size == 0:
            return
        xk = x[kidx]
        xa, xb = xk[gap], xk[gap + 1]
        far = np.maximum(np.searchsorted(xk, 2.0 * xb - xa, side="right") - 1, gap + 2)
        tb = theta[kidx[gap + 1]]
        slope = np.full(n - 1, np.nan)
        slope[gap] = np.clip((theta[kidx[far]] - tb) / (xk[far] - xb), 0.0, tb / xb)
        inside = np.arange(int(kidx[gap[0]]) + 1, int(kidx[gap[-1] + 1]))
        p = np.searchsorted(kidx, inside, side="right") - 1    # the gap (its left known bin) of each
        sel = np.isfinite(slope[p]) & (kidx[p] != inside)
        inside, p = inside[sel], p[sel]
        b = kidx[p + 1]
        low = np.maximum(theta[kidx[p]], theta[b] - slope[p] * (x[b] - x[inside]))
        out[inside] = np.minimum(out[inside], low)

    def _fill_without_prior(self, theta: np.ndarray, Wb: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not known.any():
            known = Wb > 1e-9                 # nothing has enough weight yet: use whatever has data
            if not known.any():
                return np.ones(self.n_b), np.full(self.n_b, 1e-6)
        kidx = np.flatnonzero(known)
        x = self.knots.astype(np.float64)
        out = np.interp(x, x[kidx], theta[kidx])          # linear between known bins, flat below
        self._fill_gaps_optimistically(out, theta, x, kidx)
        hi = kidx[-1]
        above = np.arange(self.n_b) > hi
        # above: the trend of the last known bins, between a floor and proportional growth.
        # Proportional growth alone (t(B_hi) / B_hi per token) is far steeper than the truth
        # on a curve with a large fixed cost (a CPU engine's), and a region predicted too
        # dear is never visited again to be corrected (one predicted too cheap is)
        avg = theta[hi] / x[hi]
        last = kidx[-4:]
        local = ((theta[last[-1]] - theta[last[0]]) / (x[last[-1]] - x[last[0]])
                 if last.size >= 2 and x[last[-1]] > x[last[0]] else avg)
        slope = min(avg, max(local, self.config.extrapolate_min_slope * avg))
        out[above] = theta[hi] + slope * (x[above] - x[hi])
        w = np.where(known, Wb, 1e-6)
        return out, w

    def _detect_jumps(self, theta: np.ndarray, w: np.ndarray, sig_rel: float, eligible: np.ndarray) -> np.ndarray:
        """Level shifts between neighbouring known bins beyond the local trend.

        For each gap between consecutive known bins, the weighted mean level of up to three
        bins on each side is projected along the local trend (median slope of the nearby
        gaps); a jump is an excess over ``jump_z`` standard errors and ``min_jump_rel`` of
        the level that is also the largest excess within two gaps (one step is reported
        once, not smeared over its neighbours).
        """
        cfg = self.config
        jumps = np.zeros(max(self.n_b - 1, 0), dtype=bool)
        idx = np.flatnonzero(eligible & np.isfinite(theta))
        n = idx.size
        if n < 4:
            return jumps
        x = self.knots[idx].astype(np.float64)
        v = theta[idx]
        ww = np.maximum(w[idx], 1e-6)
        gap = np.diff(x)
        slope = np.diff(v) / gap
        m = slope.size
        offs = [o for o in range(-4, 5) if o != 0]
        nb = np.full((m, len(offs)), np.nan)
        ar = np.arange(m)
        for col, off in enumerate(offs):
            j = ar + off
            ok = (j >= 0) & (j < m)
            nb[ok, col] = slope[j[ok]]
        srt = np.sort(nb, axis=1)                      # NaNs sort last
        cnt = np.sum(~np.isnan(nb), axis=1)
        lo_i = np.maximum((cnt - 1) // 2, 0)
        hi_i = np.maximum(cnt // 2, 0)
        med = 0.5 * (srt[ar, lo_i] + srt[ar, np.minimum(hi_i, len(offs) - 1)])
        trend = np.maximum(np.where(cnt > 0, med, 0.0), 0.0)
        z = np.zeros(1)
        cw = np.concatenate([z, np.cumsum(ww)])
        cwv = np.concatenate([z, np.cumsum(ww * v)])
        cwx = np.concatenate([z, np.cumsum(ww * x)])
        llo = np.maximum(ar - 2, 0)
        lhi = ar + 1
        rlo = ar + 1
        rhi = np.minimum(ar + 4, n)
        sl_w, sl_v, sl_x = cw[lhi] - cw[llo], cwv[lhi] - cwv[llo], cwx[lhi] - cwx[llo]
        sr_w, sr_v, sr_x = cw[rhi] - cw[rlo], cwv[rhi] - cwv[rlo], cwx[rhi] - cwx[rlo]
        xl, xr = x[:-1], x[1:]
        left = (sl_v + trend * (xl * sl_w - sl_x)) / sl_w
        right = (sr_v - trend * (sr_x - xr * sr_w)) / sr_w
        excess = right - left - trend * gap
        se = sig_rel * np.abs(v[:-1]) * np.sqrt(1.0 / sl_w + 1.0 / sr_w)
        thr = np.maximum(cfg.jump_z * se, cfg.min_jump_rel * np.abs(v[:-1]))
        score = excess / np.maximum(thr, 1e-300)
        min_side = 3.0 * cfg.min_bin_weight
        hit = (score > 1.0) & (sl_w >= min_side) & (sr_w >= min_side)
        for off in (-2, -1, 1, 2):
            j = ar + off
            ok = (j >= 0) & (j < m)
            other = np.full(m, -np.inf)
            other[ok] = score[j[ok]]
            hit &= (score > other) | ((score == other) & (off > 0))
        for k in np.flatnonzero(hit).tolist():
            a, b = int(idx[k]), int(idx[k + 1])
            jumps[b - 1 if b - a == 1 else a] = True
        return jumps

    def _smooth_segments(self, theta: np.ndarray, w: np.ndarray, jumps: np.ndarray) -> np.ndarray:
        half = self.config.smooth_half_window
        if half <= 0:
            return theta
        out = theta.copy()
        cuts = np.flatnonzero(jumps) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [self.n_b]])
        x = self.knots.astype(np.float64)
        for s, e in zip(starts.tolist(), ends.tolist()):
            if e - s > 2:
                out[s:e] = _local_linear(x[s:e], theta[s:e], np.maximum(w[s:e], 1e-6), half)
        return out

    def _ensure_fit(self, rows: Iterable[int] = ()) -> None:
        """Refit when the fit is missing or ``refit_every`` updates old, or when one of
        ``rows`` (the R-bins about to be predicted) has steps the fit has not seen and the
        fit saw fewer than ``young_row_refit`` forgotten samples there: a young row's fit is
        extrapolated from other loads, and each of its first steps moves it most (a load
        jump to an unseen row otherwise plans up to ``refit_every`` steps on the
        extrapolation; docs/worker.md, "Young rows").  At most one refit per step measured
        there, and only until the row is measured."""
        if (not self._fit_valid or self._dirty >= self.config.refit_every
                or any(self._row_unfitted[rb] and self._row_fit_w[rb] < self.config.young_row_refit
                       for rb in rows)):
            self.refit()

    # ------------------------------------------------------------------ predict
    def predict_step_time(self, num_requests: Any, batch_tokens: Any) -> Any:
        """Predicted step seconds; scalars in -> float, arrays in -> ndarray (NaN if not ready)."""
        scalar = np.isscalar(num_requests) and np.isscalar(batch_tokens)
        if not self.ready:
            if scalar:
                return float("nan")
            return np.full(np.broadcast(np.asarray(num_requests), np.asarray(batch_tokens)).shape, np.nan)
        if scalar:
            r = int(num_requests)
            b = int(batch_tokens)
            rb = self._r_bin[max(r, 0)] if r <= self._r_top else self.n_r - 1
            self._ensure_fit((rb,))
            s = math.exp(self.log_scale)
            top = self._b_top - 1
            if b <= top:
                return s * self._shape_at(rb, b)
            return s * (self._shape_at(rb, top) + self._table_list[top] * (b / top - 1.0))
        r = np.asarray(num_requests, dtype=np.int64)
        b = np.asarray(batch_tokens, dtype=np.int64)
        rb = self._r_bin_np[np.clip(r, 0, self._r_top)]
        rb, b = np.broadcast_arrays(rb, b)
        rows = np.unique(rb).tolist()
        self._ensure_fit(rows)
        s = math.exp(self.log_scale)
        top = self._b_top - 1
        bc = np.clip(b, 1, top)
        out = np.empty(b.shape, dtype=np.float64)
        for row in rows:
            sel = rb == row
            out[sel] = self._row_table(int(row))[bc[sel]]
        over = b > top
        if np.any(over):
            out = np.where(over, out + self._table[top] * (b / top - 1.0), out)
        return s * out

    def sps(self, batch_tokens: Any, *, num_requests: int) -> Any:
        """Verify steps per second at ``batch_tokens`` for a batch of ``num_requests``."""
        return 1.0 / self.predict_step_time(num_requests, batch_tokens)

    def sps_function(self, num_requests: int) -> Callable[[Any], Any]:
        """``B -> steps/s`` at a fixed R for the planner (flat 1.0 when not ready)."""
        if not self.ready:
            def flat(b: Any) -> Any:
                return 1.0 if np.isscalar(b) else np.ones(np.shape(b))
            return flat
        r = int(num_requests)
        rb = self._r_bin[max(r, 0)] if r <= self._r_top else self.n_r - 1
        self._ensure_fit((rb,))
        s = math.exp(self.log_scale)
        # this row's step times (additive fit plus the row's correction): replaced, never
        # mutated, by a refit, so safe to close over
        table = self._row_table(rb)
        top = self._b_top - 1
        t_top, slope_top = float(table[top]), float(self._table[top]) / top

        # evaluated only where asked (the planner asks for a few dozen B on every decode step)
        def fn(b: Any) -> Any:
            if np.isscalar(b):
                bi = int(b)
                if bi <= top:
                    return 1.0 / (s * float(table[max(bi, 1)]))
                return 1.0 / (s * (t_top + slope_top * (bi - top)))
            arr = np.asarray(b, dtype=np.int64)
            out = 1.0 / (s * table[np.minimum(np.maximum(arr, 1), top)])
            over = arr > top
            if over.any():
                out = np.where(over, 1.0 / (s * (t_top + slope_top * (arr - top))), out)
            return out

        return fn

    # ------------------------------------------------------------------ metrics
    def heldout_error(self) -> ErrorSummary:
        """Prequential error: each recent sample was predicted *before* the model saw it."""
        return ErrorSummary.from_relative_errors(np.fromiter(self._rel_err, dtype=np.float64,
                                                             count=len(self._rel_err)))

    def evaluate(self, num_requests: Sequence[int], batch_tokens: Sequence[int],
                 step_time_s: Sequence[float]) -> ErrorSummary:
        """Error on explicit held-out samples (not fed to the model)."""
        t = np.asarray(step_time_s, dtype=np.float64)
        if not self.ready:
            return ErrorSummary.from_relative_errors(np.array([]))
        p = self.predict_step_time(np.asarray(num_requests), np.asarray(batch_tokens))
        return ErrorSummary.from_relative_errors((p - t) / t)

    def cell_weights(self, num_requests: int, batch_tokens: Any) -> np.ndarray:
        """Effective (forgotten) sample count of the ``(R, B)`` cell of each batch size in
        ``batch_tokens`` at ``num_requests`` requests (exploration fills the thinnest)."""
        rb = int(self._r_bin_np[min(max(int(num_requests), 0), self._r_top)])
        bb = self._b_bin_np[np.clip(np.asarray(batch_tokens, dtype=np.int64), 0, self._b_top - 1)]
        # decay only the cells asked for (the planner asks for one, or one row's budgets)
        return self._decayed_weights((rb, bb))

    def window_weight(self, num_requests: int, batch_tokens: Any) -> Any:
        """Effective (forgotten) samples of the ``(R, B)`` cell and of the ``row_window``
        B-bins on each side of it in the same row: the data the row's local fit around
        ``B`` stands on.  A scalar ``batch_tokens`` gives a float, an array an array."""
        rb = int(self._r_bin_np[min(max(int(num_requests), 0), self._r_top)])
        bb = self._b_bin_np[np.clip(np.asarray(batch_tokens, dtype=np.int64), 0, self._b_top - 1)]
        half = int(self.config.row_window)
        c = np.concatenate(([0.0], np.cumsum(self._decayed_weights(rb))))
        out = c[np.minimum(bb + half + 1, self.n_b)] - c[np.maximum(bb - half, 0)]
        return float(out) if np.ndim(out) == 0 else out

    def bin_weights(self) -> np.ndarray:
        """Effective (forgotten) sample count per B-bin."""
        return self._decayed_weights().sum(axis=0)

    def thin_bins(self) -> list[tuple[int, int]]:
        """``[lo, hi)`` batch-token ranges whose bins are below ``min_bin_weight``."""
        wb = self.bin_weights()
        return [(int(self.b_edges[i]), int(self.b_edges[i + 1]))
                for i in range(self.n_b) if wb[i] < self.config.min_bin_weight]

    def raw_samples(self) -> list[tuple[int, int, float]]:
        return list(self._raw)

    # ------------------------------------------------------------------ SGLang exports
    def to_sglang_cost_table(self, *, num_requests: int, b_min: Optional[int] = None,
                             b_max: Optional[int] = None) -> dict[str, Any]:
        """SGLang ``SpsCostTable`` JSON dict for a batch of ``num_requests`` (floor lookup).

        One probe per integer B in ``[b_min, b_max]`` (default ``[1, max_batch_tokens]``)
        where the value changes, so SGLang's lookup equals :meth:`sps` at every integer in
        that range (outside it SGLang holds the first/last value).
        """
        self._require_ready()
        fn = self.sps_function(num_requests)
        top = self._b_top - 1
        lo = 1 if b_min is None else max(1, min(int(b_min), top))
        hi = top if b_max is None else max(lo, min(int(b_max), top))
        bs = np.arange(lo, hi + 1, dtype=np.int64)
        vals = np.asarray(fn(bs), dtype=np.float64)
        keep = np.ones(bs.size, dtype=bool)
        keep[1:] = vals[1:] != vals[:-1]
        return {"sample_batch_tokens": bs[keep].tolist(), "sample_steps_per_sec": vals[keep].tolist(),
                "max_batch_tokens": int(hi)}

    def to_sglang_additive_table(self) -> dict[str, Any]:
        """SGLang ``SpsAdditiveCostTable`` JSON dict: bias + alpha(R) + theta(R + K).

        The additive part of the fit (:meth:`additive_step_time`): SGLang's format cannot
        hold the per-row corrections (:meth:`row_correction_extent` says how much they
        matter; :meth:`to_sglang_cost_table` for one R includes them).

        Probes are the knots plus both sides of every jump (theta) and both ends of every
        R-bin (alpha), so SGLang's clamped linear interpolation reproduces this model at
        every integer R in ``[1, max_requests]`` and B in ``[1, max_batch_tokens]``.
        """
        self._require_ready()
        self._ensure_fit()
        s = self.scale
        table = self._table * s
        bias = float(table[1:].min()) * 0.5
        if not bias > 0:
            bias = 1e-9
        probes = set(int(k) for k in self.knots.tolist())
        probes.add(1)
        probes.add(self._b_top - 1)
        for i in np.flatnonzero(self._jumps).tolist():
            e = int(self.b_edges[i + 1])
            probes.update((e - 1, e))
        for i in range(self.n_b):                          # segment ends around the knots
            lo, hi = int(self.b_edges[i]), int(self.b_edges[i + 1]) - 1
            if i == 0 or self._jumps[i - 1]:
                probes.add(lo)
            if i == self.n_b - 1 or self._jumps[i]:
                probes.add(hi)
        m_probes = sorted(p for p in probes if 1 <= p <= self._b_top - 1)
        theta_s = [float(table[p] - bias) for p in m_probes]
        bs_probes: list[int] = []
        alpha_s: list[float] = []
        for i in range(self.n_r):
            lo, hi = int(self.r_edges[i]), int(self.r_edges[i + 1]) - 1
            v = float(self._alpha[i] * s)
            bs_probes.append(lo)
            alpha_s.append(v)
            if hi > lo:
                bs_probes.append(hi)
                alpha_s.append(v)
        return {"bias_seconds": bias, "bs_probes": bs_probes, "alpha_seconds": alpha_s,
                "m_probes": m_probes, "theta_seconds": theta_s}

    def _require_ready(self) -> None:
        if not self.ready:
            raise ValueError("the SPS model has no data and no prior yet; feed it step telemetry (at least "
                             f"{self.config.min_ready_samples} samples) or load a prior profile first.")

    # ------------------------------------------------------------------ state
    def to_state(self, *, include_raw: bool = True, include_cells: bool = True) -> dict[str, Any]:
        """JSON-able state (validated at the boundary by ``profile_file.SpsModelState``); its
        fit is the one every row's next prediction would use (young rows' latest steps in)."""
        if self.ready:
            self._ensure_fit(range(self.n_r))
        cells: list[list[float]] = []
        if include_cells:
            W = self._decayed_weights()
            ri, bi = np.nonzero(W > 1e-9)
            cells = [[int(r), int(b), float(W[r, b]), float(self._y[r, b])] for r, b in zip(ri, bi)]
        return {
            "format": _STATE_FORMAT,
            "config": asdict(self.config),
            "b_edges": self.b_edges.tolist(),
            "r_edges": self.r_edges.tolist(),
            "theta": self._theta.tolist() if self._fit_valid else [],
            "alpha": self._alpha.tolist() if self._fit_valid else [],
            "jumps": [int(i) for i in np.flatnonzero(self._jumps)] if self._fit_valid else [],
            "row_lines": ([[int(rb)] + [float(v) for pair in zip(kx.tolist(), kc.tolist()) for v in pair]
                           for rb, (kx, kc) in sorted(self._row_lines.items())]
                          if self._fit_valid else []),
            "scale": self.scale,
            "rel_scale": self.rel_scale,
            "steps": int(self.steps),
            "cells": cells,
            "prior_theta": self._prior_theta.tolist() if self._prior is not None else None,
            "prior_alpha": self._prior_alpha.tolist() if self._prior is not None else None,
            "raw_samples": [list(x) for x in self._raw] if include_raw else [],
        }

    def snapshot_for_prediction(self) -> dict[str, Any]:
        """Small state (fitted curve only: no cells, no raw samples, no separate prior).

        :meth:`from_state` on it rebuilds a model that predicts exactly the same step
        times, and uses that curve as its prior if it is fed more samples.
        """
        self._require_ready()
        state = self.to_state(include_raw=False, include_cells=False)
        state["prior_theta"] = None
        state["prior_alpha"] = None
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *,
                   config_overrides: Optional[Mapping[str, Any]] = None) -> "SpsModel":
        """Rebuild a model (cell statistics, drift factor and prior included)."""
        if int(state.get("format", -1)) != _STATE_FORMAT:
            raise ValueError(f"unsupported SPS model state format {state.get('format')!r}; this version reads "
                             f"format {_STATE_FORMAT}.")
        known_fields = set(SpsModelConfig.__dataclass_fields__)
        cfg = SpsModelConfig(**{k: v for k, v in dict(state["config"]).items() if k in known_fields})
        if config_overrides:
            cfg = replace(cfg, **dict(config_overrides))
        model = cls(config=cfg)
        if list(state["b_edges"]) != model.b_edges.tolist() or list(state["r_edges"]) != model.r_edges.tolist():
            raise ValueError("state bin edges do not match its config; the file is corrupt.")

        def arr(name: str, size: int) -> Optional[np.ndarray]:
            v = state.get(name)
            if v is None or len(v) == 0:
                return None
            a = np.asarray(v, dtype=np.float64)
            if a.size != size or not np.all(np.isfinite(a)):
                raise ValueError(f"state field {name!r} has the wrong size or non-finite values.")
            return a

        pt, pa = arr("prior_theta", model.n_b), arr("prior_alpha", model.n_r)
        th, al = arr("theta", model.n_b), arr("alpha", model.n_r)
        jumps = np.zeros(max(model.n_b - 1, 0), dtype=bool)
        for j in state.get("jumps", []) or []:
            if not 0 <= int(j) < jumps.size:
                raise ValueError(f"invalid jump index {j!r} in SPS model state.")
            jumps[int(j)] = True
        lines: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for ln in state.get("row_lines", []) or []:
            vals = np.asarray(ln, dtype=np.float64)
            kx, kc = vals[1::2], vals[2::2]
            bad = (len(ln) < 3 or len(ln) % 2 == 0 or not np.all(np.isfinite(vals))
                   or not 0 <= int(vals[0]) < model.n_r or np.any(kx < 1) or np.any(kx >= model._b_top)
                   or np.any(np.diff(kx) <= 0))
            if bad:
                raise ValueError(f"invalid row correction {ln!r} in SPS model state: expected "
                                 "[r_bin, b1, seconds1, b2, seconds2, ...] with increasing b.")
            lines[int(vals[0])] = (kx.astype(np.int64), kc)
        cells = state.get("cells", []) or []
        knots = model.knots.astype(np.float64)
        rl = model.r_edges[:-1].astype(np.float64)
        if pt is not None and pa is not None:
            model.set_prior(PriorCurve(theta=lambda b, _t=pt: np.interp(b, knots, _t),
                                       alpha=_floor_lookup(rl, pa), description="prior (from state)"))
        elif not cells and th is not None and al is not None:
            # a prediction snapshot: its curve is the prior for anything learned after loading
            model.set_prior(PriorCurve(theta=lambda b, _t=th: np.interp(b, knots, _t),
                                       alpha=_floor_lookup(rl, al), description="snapshot"))
        steps = int(state.get("steps", 0))
        model.steps = max(0, steps)
        for cell in cells:
            r, b, w, y = int(cell[0]), int(cell[1]), float(cell[2]), float(cell[3])
            if not (0 <= r < model.n_r and 0 <= b < model.n_b) or not (w > 0 and math.isfinite(y)):
                raise ValueError(f"invalid cell {cell!r} in SPS model state.")
            model._w[r, b] = w
            model._y[r, b] = y
            model._last[r, b] = model.steps
            model._row_seen[r] = True
        scale = float(state.get("scale", 1.0))
        model.log_scale = math.log(scale) if scale > 0 and math.isfinite(scale) else 0.0
        rs = float(state.get("rel_scale", 0.05))
        model.rel_scale = rs if math.isfinite(rs) and rs > 0 else 0.05
        for s in state.get("raw_samples", []) or []:
            model._raw.append((int(s[0]), int(s[1]), float(s[2])))
        if th is not None and al is not None and model.ready:
            # restore the fitted curve as saved so predictions match before any new data
            wb = model.bin_weights()
            model._set_fit(th, al, jumps, wb >= cfg.min_bin_weight, row_lines=lines)
            model._dirty = 0
            model._row_fit_w = model._decayed_weights().sum(axis=1).tolist()
        return model


def replay(model: SpsModel, samples: Iterable[tuple[int, int, float]]) -> SpsModel:
    """Feed ``(R, B, step_time_s)`` samples; returns the model for chaining."""
    for r, b, t in samples:
        model.update(r, b, t)
    return model
