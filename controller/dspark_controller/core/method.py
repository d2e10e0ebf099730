"""DSpark verify-length planning (pure Python + numpy; used by the controller and the worker).

Notation (DSpark paper, Algorithm 1): R requests, request r has draft confidences
``c[r][0..gamma_r-1]`` where ``c[r][j-1] = P(draft token j survives | tokens < j survived)``.
The survival product ``a[r][j] = prod_{i<=j} c[r][i-1]`` is non-increasing in j. A plan
chooses a verify length ``l_r`` (draft tokens, the anchor excluded) per request; the
target then verifies ``B = R + sum_r l_r`` tokens, the expected accepted tokens (bonus
included) are ``tau = sum_r (1 + sum_{j<=l_r} a[r][j])`` and the predicted throughput is
``Theta = tau * SPS(B)`` tokens per second.

The lossless rule
-----------------
Speculative sampling stays exactly distributed as the target model only if the decision
to verify draft token j of request r does not depend on that token itself. The
confidence of position j+1 is computed from token j, so any rule that admits (r, j)
*because* admitting (r, j+1) later pays off leaks token j into its own admission
(paper, Appendix A: with a_1 = 0.8 and SPS(1, 2, 3) = (1, 0.5, 0.45) a global argmax
verifies two tokens and turns p_t = (0.7, 0.3) into (0.85, 0.15)). Two constructions are
safe and are the only ones here:

* :func:`plan_exact` visits (r, j) in descending a, each request's positions in order,
  and *stops at the first admission that does not raise Theta* (early stop). Whether
  (r, j) is admitted depends only on entries visited before it, and none of them is
  computed from token j of request r.
* :func:`plan_lagged` (production variant) picks the batch budget K as a global argmax
  over the (possibly jagged) SPS curve using confidences from two steps earlier, then
  takes the global top-K of the live a values. K never depends on the current tokens and
  top-K membership of (r, j) never depends on a[r][j+1..] (they are not larger), so no
  early stop is needed.

Every override (``fixed`` fraction, ``cap``, ``off``) keeps one of these shapes: a budget
fixed before the current tokens exist, applied as a top-K or as a bound on the greedy.
Ties in a are broken by position j first, so a request's positions are always visited
in order even when c = 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = [
    "PlanError", "PlanPolicy", "Plan", "LaggedBudget", "survival_products", "sps_from_pairs", "plan_exact", "plan_lagged", "compute_lagged_budget", "plan", "plan_fixed_fraction", "plan_verify_all", "expected_throughput", "survival_to_confidences", "fraction_budget",
]

SpsFn = Callable[[Any], Any]
_DEFAULT_TRACE = 24


class PlanError(ValueError):
    """Bad planner input; the message says what to fix."""


@dataclass(frozen=True)
class PlanPolicy:
    """Planner-side policy (mirrors ``protocol.PolicySpec`` without pydantic).

    ``off`` verifies every draft token (the name is historical: *scheduling* off, stock
    DSpark); ``no_draft`` drafts nothing at all (plain decoding, no draft forward)."""

    # the fleet's policy modes; protocol.PolicySpec.mode and the CLI's choices list the same
    MODES = ("throughput", "sla", "fixed", "cap", "off", "no_draft")

    mode: str = "throughput"          # one of MODES
    floor_tok_s: Optional[float] = None
    frac: Optional[float] = None
    max_tokens: Optional[int] = None
    explore_prob: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in self.MODES:
            raise PlanError(f"unknown policy mode {self.mode!r}; use {', '.join(self.MODES[:-1])} "
                            f"or {self.MODES[-1]}")
        if self.mode == "sla" and not (self.floor_tok_s is not None and self.floor_tok_s > 0):
            raise PlanError("policy 'sla' needs a positive floor (tokens/s per user)")
        if self.mode == "fixed" and not (self.frac is not None and 0.0 <= self.frac <= 1.0):
            raise PlanError("policy 'fixed' needs a fraction in [0, 1]")
        if self.mode == "cap" and not (self.max_tokens is not None and self.max_tokens >= 0):
            raise PlanError("policy 'cap' needs max tokens >= 0")
        if not 0.0 <= self.explore_prob <= 1.0:
            raise PlanError("explore_prob must be in [0, 1]")
        if self.mode == "no_draft" and self.explore_prob > 0:
            raise PlanError("policy 'no_draft' makes no drafts, so there is no budget to explore; "
                            "drop explore_prob (--explore)")

    @staticmethod
    def from_spec(spec: Any) -> "PlanPolicy":
        if spec is None:
            return PlanPolicy()
        if isinstance(spec, PlanPolicy):
            return spec
        if isinstance(spec, str):
            return PlanPolicy(mode=spec)
        get = spec.get if isinstance(spec, dict) else lambda k, d=None: getattr(spec, k, d)
        return PlanPolicy(mode=get("mode", "throughput"), floor_tok_s=get("floor_tok_s"),
                          frac=get("frac"), max_tokens=get("max_tokens"),
                          explore_prob=float(get("explore_prob", 0.0) or 0.0))

    @property
    def verify_all(self) -> bool:
        """``off``: verify every draft token."""
        return self.mode == "off"

    @property
    def no_draft(self) -> bool:
        """``no_draft``: decode without drafting (no draft forward, one token per request).
        Every other property reads as "no rule" for it; callers check this one first."""
        return self.mode == "no_draft"

    @property
    def fixed_frac(self) -> Optional[float]:
        """``fixed``: the fraction of all draft tokens to verify (else None)."""
        return float(self.frac) if self.mode == "fixed" else None

    @property
    def cap(self) -> Optional[int]:
        """``cap``: at most this many draft tokens (else None)."""
        return int(self.max_tokens) if self.mode == "cap" else None

    @property
    def sla_floor(self) -> Optional[float]:
        """``sla``: the per-user tokens/s floor the plan must keep (else None)."""
        return float(self.floor_tok_s) if self.mode == "sla" else None

    def describe(self) -> str:
        if self.mode == "sla":
            return f"sla(floor={self.floor_tok_s:g} tok/s/user)"
        if self.mode == "fixed":
            return f"fixed(frac={self.frac:g})"
        if self.mode == "cap":
            return f"cap(max={self.max_tokens})"
        return self.mode


@dataclass(frozen=True)
class Plan:
    lengths: tuple[int, ...]
    budget_tokens: int
    batch_tokens: int
    expected_tau: float
    expected_tau_per_request: tuple[float, ...]
    predicted_sps: float
    predicted_throughput: float
    min_user_rate: float
    algorithm: str
    policy: str
    explanation: tuple[str, ...] = field(default_factory=tuple)
    sla_met: Optional[bool] = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lengths"] = list(self.lengths)
        d["expected_tau_per_request"] = list(self.expected_tau_per_request)
        d["explanation"] = list(self.explanation)
        return d


@dataclass(frozen=True)
class LaggedBudget:
    """A draft-token budget K chosen from lagged confidences."""

    budget_tokens: int
    expected_tau: float
    predicted_throughput: float
    batch_tokens: int
    num_requests: int
    explanation: tuple[str, ...] = ()
    sla_met: Optional[bool] = None


# ------------------------------------------------------------------ helpers
def _clean_confidences(confidences: Any) -> list[np.ndarray]:
    if isinstance(confidences, np.ndarray):
        if confidences.ndim != 2:
            raise PlanError("confidences must be a 2-D array (requests x positions) or a list of lists")
        rows = [confidences[i] for i in range(confidences.shape[0])]
    else:
        if not isinstance(confidences, (list, tuple)):
            raise PlanError("confidences must be a list with one list of per-position "
                            "confidences per request, e.g. [[0.9, 0.8], [0.5]]")
        rows = list(confidences)
    out: list[np.ndarray] = []
    for i, row in enumerate(rows):
        if isinstance(row, (int, float)) and not isinstance(row, bool):
            raise PlanError(f"request {i}: expected a list of confidences, got the number {row!r}; "
                            "wrap each request's confidences in a list, e.g. [[0.8]]")
        try:
            arr = np.asarray(row, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise PlanError(f"request {i}: confidences must be numbers in [0, 1] ({exc})") from None
        if arr.size and (np.any(~np.isfinite(arr)) or np.any(arr < 0.0) or np.any(arr > 1.0)):
            bad = arr[~np.isfinite(arr) | (arr < 0) | (arr > 1)][0]
            raise PlanError(f"request {i}: confidence {float(bad)!r} is not a probability in [0, 1]")
        out.append(arr)
    return out


def survival_products(confidences: Any) -> list[np.ndarray]:
    """``a[r][j-1] = prod_{i<=j} c[r][i-1]`` per request (jagged rows allowed)."""
    return _prepare(confidences)[0]


def _rectangular(confidences: Any) -> Optional[np.ndarray]:
    if isinstance(confidences, np.ndarray):
        arr = confidences
    else:
        if not isinstance(confidences, (list, tuple)) or not confidences:
            return None
        first = confidences[0]
        if not isinstance(first, (list, tuple, np.ndarray)):
            return None
        n = len(first)
        if any(not isinstance(row, (list, tuple, np.ndarray)) or len(row) != n for row in confidences):
            return None
        try:
            arr = np.asarray(confidences, dtype=np.float64)
        except (TypeError, ValueError):
            return None
    if arr.ndim != 2:
        return None
    try:
        arr = arr.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        return None
    bad = ~np.isfinite(arr) | (arr < 0.0) | (arr > 1.0)
    if np.any(bad):
        return None           # let the slow path name the offending request
    return arr


def _prepare(confidences: Any) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Survival rows plus the flattened entries in visit order (a desc, then j, then r)."""
    arr = _rectangular(confidences)
    empty = (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if arr is not None:
        R, g = arr.shape
        A = np.cumprod(arr, axis=1)
        rows = [A[i] for i in range(R)]
        if R == 0 or g == 0:
            return (rows,) + empty
        a = A.ravel()
        r = np.repeat(np.arange(R, dtype=np.int64), g)
        j = np.tile(np.arange(1, g + 1, dtype=np.int64), R)
    else:
        rows = [np.cumprod(c) if c.size else c for c in _clean_confidences(confidences)]
        if not rows or not any(s.size for s in rows):
            return (rows,) + empty
        a = np.concatenate(rows)
        r = np.concatenate([np.full(s.size, i, dtype=np.int64) for i, s in enumerate(rows)])
        j = np.concatenate([np.arange(1, s.size + 1, dtype=np.int64) for s in rows])
    order = np.lexsort((r, j, -a))
    return rows, a[order], r[order], j[order]


def _sps_values(sps: SpsFn, batch_tokens: np.ndarray) -> np.ndarray:
    vals: Optional[np.ndarray] = None
    try:
        v = sps(batch_tokens)
        v = np.asarray(v, dtype=np.float64)
        if v.shape == batch_tokens.shape:
            vals = v
    except Exception:
        vals = None
    if vals is None:
        try:
            vals = np.array([float(sps(int(b))) for b in batch_tokens.tolist()], dtype=np.float64)
        except PlanError:
            raise
        except Exception as exc:
            raise PlanError(f"the SPS function failed: {exc.__class__.__name__}: {exc}") from None
    bad = ~np.isfinite(vals) | (vals <= 0)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise PlanError(f"SPS({int(batch_tokens[i])}) = {vals[i]!r}; steps per second must be "
                        "positive and finite at every batch size the planner may visit")
    return vals


def sps_from_pairs(pairs: Sequence[tuple[int, float]]) -> SpsFn:
    """Floor-lookup SPS curve (SGLang ``SpsCostTable`` semantics) from ``(B, steps/s)`` pairs."""
    if not pairs:
        raise PlanError("an SPS curve needs at least one B:steps_per_sec pair")
    items = sorted((int(b), float(s)) for b, s in pairs)
    bs = [b for b, _ in items]
    if len(set(bs)) != len(bs):
        raise PlanError(f"duplicate batch size in SPS pairs: {bs}")
    if bs[0] < 1:
        raise PlanError("SPS batch sizes must be >= 1")
    if any(not (s > 0 and math.isfinite(s)) for _, s in items):
        raise PlanError("steps_per_sec values must be positive and finite")
    xb = np.asarray(bs, dtype=np.int64)
    ys = np.asarray([s for _, s in items], dtype=np.float64)

    def fn(b: Any) -> Any:
        idx = np.clip(np.searchsorted(xb, np.asarray(b), side="right") - 1, 0, xb.size - 1)
        out = ys[idx]
        return float(out) if np.ndim(out) == 0 else out

    return fn


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 1e4 else f"{x:.4g}"


def _finish(*, surv: list[np.ndarray], lengths: list[int], sps_vals_at: Callable[[int], float],
            algorithm: str, policy: str, explanation: list[str], sla_floor: Optional[float]) -> Plan:
    R = len(surv)
    per_req = tuple(float(1.0 + (s[:l].sum() if l else 0.0)) for s, l in zip(surv, lengths))
    K = int(sum(lengths))
    B = R + K
    if R == 0:
        return Plan(lengths=(), budget_tokens=0, batch_tokens=0, expected_tau=0.0,
                    expected_tau_per_request=(), predicted_sps=0.0, predicted_throughput=0.0,
                    min_user_rate=0.0, algorithm=algorithm, policy=policy,
                    explanation=tuple(explanation + ["no requests: nothing to verify"]),
                    sla_met=None)
    s = float(sps_vals_at(B))
    tau = float(sum(per_req))
    min_rate = min(per_req) * s
    sla_met = None if sla_floor is None else bool(min_rate >= sla_floor)
    explanation = explanation + [
        f"result: lengths={list(lengths)}, K={K} draft tokens, B={B}, expected tau={_fmt(tau)}, "
        f"SPS(B)={_fmt(s)} steps/s, predicted throughput={_fmt(tau * s)} tok/s, "
        f"slowest user {_fmt(min_rate)} tok/s"
        + ("" if sla_floor is None else f" (SLA floor {sla_floor:g}: {'met' if sla_met else 'NOT met'})")
    ]
    return Plan(lengths=tuple(int(x) for x in lengths), budget_tokens=K, batch_tokens=B,
                expected_tau=tau, expected_tau_per_request=per_req, predicted_sps=s,
                predicted_throughput=tau * s, min_user_rate=min_rate, algorithm=algorithm,
                policy=policy, explanation=tuple(explanation), sla_met=sla_met)


def _sps_cached(sps: SpsFn, R: int, n: int) -> tuple[np.ndarray, Callable[[int], float]]:
    Bs = np.arange(R, R + n + 1, dtype=np.int64)
    vals = _sps_values(sps, Bs) if R > 0 else np.zeros(0)

    def at(b: int) -> float:
        i = b - R
        if 0 <= i < vals.size:
            return float(vals[i])
        return float(_sps_values(sps, np.asarray([b], dtype=np.int64))[0])

    return vals, at


# ------------------------------------------------------------------ Algorithm 1 (exact)
def plan_exact(confidences: Any, sps: SpsFn, *, max_tokens: Optional[int] = None,
               sla_floor: Optional[float] = None, max_trace: int = _DEFAULT_TRACE,
               policy: str = "throughput") -> Plan:
    """Paper Algorithm 1 with early stop (lossless; see the module docstring).

    Start with l_r = 0, B = R, tau = R, best = R * SPS(R). Visit (r, j) in descending
    a[r][j]: set l_r = j, B += 1, tau += a[r][j], Theta = tau * SPS(B); keep it if
    Theta > best, else stop. ``max_tokens`` stops after that many admissions (cap);
    ``sla_floor`` additionally stops at the first admission that would take the slowest
    user's rate ``min_r tau_r * SPS(B)`` below the floor once it is met. While the floor is
    not met the greedy runs as in throughput mode (best effort: the lossless visit order
    cannot favour slow users) and ``Plan.sla_met`` reports False.
    """
    surv, a, rr, jj = _prepare(confidences)
    R = len(surv)
    n = int(a.size)
    limit = n if max_tokens is None else max(0, min(n, int(max_tokens)))
    algo = "exact"
    expl: list[str] = []
    if R == 0:
        _, sps_at = _sps_cached(sps, R, 0)
        return _finish(surv=surv, lengths=[], sps_vals_at=sps_at, algorithm=algo,
                       policy=policy, explanation=expl, sla_floor=sla_floor)
    sps_vals, sps_at = _sps_cached(sps, R, limit)
    tau = R + np.concatenate([[0.0], np.cumsum(a[:limit])])
    theta = tau * sps_vals
    ok = theta[1:] > theta[:-1]
    rate = None
    if sla_floor is not None:
        rate = _prefix_min_tau(R, a, rr, limit) * sps_vals
        feas_prev = np.logical_or.accumulate(rate >= sla_floor)[:-1]
        breaks = feas_prev & (rate[1:] < sla_floor)
        ok &= ~breaks
    bad = np.flatnonzero(~ok)
    K = int(bad[0]) if bad.size else limit          # admissions kept before the first refusal
    lengths = [0] * R
    if K:
        arr = np.zeros(R, dtype=np.int64)
        np.maximum.at(arr, rr[:K], jj[:K])
        lengths = arr.tolist()
    # ---- explanation trace
    expl.append(f"R={R} request(s), {n} draft position(s); policy {policy}; "
                "admit draft tokens in descending survival a_(r,j), stop at the first that "
                "does not raise Theta = tau * SPS(B) (early stop keeps it lossless)")
    expl.append(f"start: l=0 for every request, B={R}, tau={_fmt(float(tau[0]))}, "
                f"SPS({R})={_fmt(float(sps_vals[0]))} -> Theta={_fmt(float(theta[0]))} tok/s")
    if rate is not None:
        met = rate[0] >= sla_floor
        expl.append(f"SLA floor {sla_floor:g} tok/s/user: slowest user at start {_fmt(float(rate[0]))} "
                    f"tok/s ({'met' if met else 'not met: admitting as in throughput mode until it is'})")

    def line(k: int) -> str:
        better = theta[k] > theta[k - 1]
        why = f"Theta={_fmt(float(theta[k]))} {'>' if better else '<='} best {_fmt(float(theta[k - 1]))}"
        if rate is not None:
            why += f", slowest user {_fmt(float(rate[k]))} tok/s"
            if better and not ok[k - 1]:
                why += f" would fall below the floor {sla_floor:g}"
        return (f"visit #{k} (r={int(rr[k - 1])}, j={int(jj[k - 1])}, a={_fmt(float(a[k - 1]))}): "
                f"B={R + k}, tau={_fmt(float(tau[k]))}, SPS({R + k})={_fmt(float(sps_vals[k]))} -> {why}")

    for k in range(1, min(K, max_trace) + 1):
        expl.append(line(k) + ": keep")
    if K > max_trace:
        expl.append(f"... {K - max_trace} more admission(s) kept, each raising Theta")
    if K < limit:
        expl.append(line(K + 1) + ": STOP (early stop: nothing after this is admitted)")
    elif limit < n:
        expl.append(f"cap reached: {limit} draft token(s) admitted, the cap allows no more")
    elif n > 0:
        expl.append("every draft token admitted: Theta rose at each step")
    return _finish(surv=surv, lengths=lengths, sps_vals_at=sps_at, algorithm=algo, policy=policy,
                   explanation=expl, sla_floor=sla_floor)


def _prefix_min_tau(R: int, a: np.ndarray, rr: np.ndarray, limit: int) -> np.ndarray:
    """min_r tau_r after each prefix of the visit order (length limit + 1)."""
    if limit == 0:
        return np.ones(1)
    if R * (limit + 1) <= 4_000_000:
        inc = np.zeros((limit + 1, R))
        inc[np.arange(1, limit + 1), rr[:limit]] = a[:limit]
        return 1.0 + np.cumsum(inc, axis=0).min(axis=1)
    per = np.ones(R)
    mins = np.empty(limit + 1)
    cur = 1.0
    mins[0] = cur
    for i in range(limit):
        r = int(rr[i])
        was = per[r]
        per[r] = was + a[i]
        if was <= cur:
            cur = float(per.min())
        mins[i + 1] = cur
    return mins


# ------------------------------------------------------------------ lagged (production)
def compute_lagged_budget(lagged_confidences: Any, sps: SpsFn, *, max_tokens: Optional[int] = None,
                          sla_floor: Optional[float] = None) -> LaggedBudget:
    """Budget K = argmax_k (R + top-k sum of a) * SPS(R + k), over old confidences.

    A global argmax (no early stop) is fine here because K is fixed before the current
    step's tokens exist. With ``sla_floor`` only k whose slowest user meets the floor are
    eligible (if none does, the throughput-optimal k, flagged ``sla_met=False``). Ties go
    to the smaller k.
    """
    surv, a, rr, _ = _prepare(lagged_confidences)
    R = len(surv)
    n = int(a.size)
    limit = n if max_tokens is None else max(0, min(n, int(max_tokens)))
    if R == 0:
        return LaggedBudget(budget_tokens=0, expected_tau=0.0, predicted_throughput=0.0,
                            batch_tokens=0, num_requests=0, explanation=("no requests",))
    sps_vals, _ = _sps_cached(sps, R, limit)
    tau = R + np.concatenate([[0.0], np.cumsum(a[:limit])])
    theta = tau * sps_vals
    expl = [f"lagged budget from confidences of an earlier step: R={R}, {n} positions, "
            f"global argmax of (R + top-k survival) * SPS(R + k) over k = 0..{limit}"]
    sla_met = None
    if sla_floor is None:
        k = int(np.argmax(theta))
    else:
        mins = _prefix_min_tau(R, a, rr, limit)
        rates = mins * sps_vals
        feas = rates >= sla_floor
        if np.any(feas):
            k = int(np.flatnonzero(feas)[np.argmax(theta[feas])])
            sla_met = True
        else:
            k = int(np.argmax(theta))
            sla_met = False
            best_k = int(np.argmax(rates))
            expl.append(f"SLA floor unreachable at this load (best slowest-user rate "
                        f"{_fmt(float(rates[best_k]))} tok/s at K={best_k}); using the "
                        "throughput-optimal K")
        expl.append(f"SLA floor {sla_floor:g}: {int(feas.sum())} of {limit + 1} budgets feasible")
    expl.append(f"K={k}: B={R + k}, tau={_fmt(float(tau[k]))}, SPS={_fmt(float(sps_vals[k]))}, "
                f"Theta={_fmt(float(theta[k]))} tok/s (K=0 gives {_fmt(float(theta[0]))}, "
                f"all {limit} gives {_fmt(float(theta[limit]))})")
    return LaggedBudget(budget_tokens=k, expected_tau=float(tau[k]),
                        predicted_throughput=float(theta[k]), batch_tokens=R + k,
                        num_requests=R, explanation=tuple(expl), sla_met=sla_met)


def clip01(x: Any) -> np.ndarray:
    """float64 array clamped to [0, 1] with NaN -> 0 (``fmax`` drops NaN), in two ufuncs
    (``nan_to_num`` + ``clip`` cost several times more on the planner's hot path)."""
    return np.fmin(np.fmax(np.asarray(x, dtype=np.float64), 0.0), 1.0)


def clean_survival(survival: Any) -> np.ndarray:
    """A survival matrix ``[R, positions]`` as the fast planner assumes it: float64, NaN and
    negatives 0, at most 1, non-increasing along each row (a running minimum).  Survival
    from SGLang (a cumulative product of confidences) and from the worker's calibrator
    already is; for such rows it equals ``cumprod(survival_to_confidences(s))``."""
    s = clip01(survival)
    return np.minimum.accumulate(s, axis=1) if s.ndim == 2 and s.shape[1] > 1 else s


def lagged_budget_fast(survival: np.ndarray, sps: SpsFn, *,
                       max_tokens: Optional[int] = None) -> tuple[int, float, float]:
    """The hot-path twin of :func:`compute_lagged_budget` for a *clean* survival matrix (see
    :func:`clean_survival`): the same K = argmax_k (R + top-k survival) * SPS(R + k) (ties
    to the smaller k), as ``(K, predicted throughput, steps/s at R + K)``, with no input
    validation and no explanation.  Survival rows are non-increasing, so the global top-k
    of the survival values is the top-k of :func:`compute_lagged_budget`'s visit order."""
    R = int(survival.shape[0])
    n = int(survival.size)
    limit = n if max_tokens is None else max(0, min(n, int(max_tokens)))
    if R == 0:
        return 0, 0.0, 0.0
    tau = np.empty(limit + 1)
    tau[0] = 0.0
    if limit:
        np.cumsum(np.sort(survival, axis=None)[::-1][:limit], out=tau[1:])
    tau += R
    sps_vals = _sps_values(sps, np.arange(R, R + limit + 1, dtype=np.int64))
    theta = tau * sps_vals
    k = int(theta.argmax())
    return k, float(theta[k]), float(sps_vals[k])


def _top_k_lengths(prepared: tuple, k: int) -> list[int]:
    surv, a, rr, jj = prepared
    lengths = np.zeros(len(surv), dtype=np.int64)
    k = min(int(k), int(a.size))
    if k > 0:
        np.maximum.at(lengths, rr[:k], jj[:k])
    return lengths.tolist()


def plan_lagged(confidences: Any, sps: SpsFn, *, lagged_confidences: Any = None,
                budget: Optional[int] = None, max_tokens: Optional[int] = None,
                sla_floor: Optional[float] = None, explore_prob: float = 0.0,
                rng: Optional[np.random.Generator] = None, policy: str = "throughput") -> Plan:
    """Production variant: K from old confidences (or given), then global top-K of live a.

    Pass either ``budget`` (a K computed earlier, e.g. by the controller or by
    :func:`compute_lagged_budget` two steps ago) or ``lagged_confidences``. Using the live
    confidences for K would break losslessness, so that is refused. ``explore_prob`` (with
    ``rng``) replaces K by a uniform random budget on that fraction of steps.
    """
    prepared = _prepare(confidences)
    surv = prepared[0]
    R = len(surv)
    n = int(prepared[1].size)
    expl: list[str] = []
    if budget is None:
        if lagged_confidences is None:
            raise PlanError("plan_lagged needs the budget K or the confidences from an earlier step "
                            "(lagged_confidences); computing K from the live confidences would make "
                            "admissions depend on the tokens being verified")
        lb = compute_lagged_budget(lagged_confidences, sps, max_tokens=max_tokens, sla_floor=sla_floor)
        K = lb.budget_tokens
        expl.extend(lb.explanation)
    else:
        if int(budget) < 0:
            raise PlanError(f"budget must be >= 0 draft tokens, got {budget}")
        K = int(budget)
        expl.append(f"budget K={K} given (computed before this step)")
    if explore_prob > 0.0 and rng is not None and rng.random() < explore_prob:
        K = int(rng.integers(0, n + 1))
        expl.append(f"exploration step: K replaced by uniform random {K}")
    if max_tokens is not None and K > max_tokens:
        expl.append(f"cap: K {K} -> {int(max_tokens)}")
        K = int(max_tokens)
    if K > n:
        expl.append(f"K {K} exceeds the {n} live draft positions; verifying all of them")
        K = n
    lengths = _top_k_lengths(prepared, K)
    expl.append(f"live step: global top-{K} of the current survival products a_(r,j)")
    _, sps_at = _sps_cached(sps, R, 0)
    return _finish(surv=surv, lengths=lengths, sps_vals_at=sps_at, algorithm="lagged",
                   policy=policy, explanation=expl, sla_floor=sla_floor)


# ------------------------------------------------------------------ worker-side budget rules
# Used by the one policy (dspark_controller.core.policy.BudgetPolicy), which the worker and the
# simulator both run.
def survival_to_confidences(survival: Any) -> np.ndarray:
    """Per-position conditional confidences from cumulative survival rows ``[R, positions]``."""
    s = np.nan_to_num(np.asarray(survival, dtype=np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    prev = np.concatenate([np.ones((s.shape[0], 1)), s[:, :-1]], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(prev > 0, s / prev, 0.0)
    return np.clip(c, 0.0, 1.0)


# ------------------------------------------------------------------ overrides
def fraction_budget(frac: float, full: int) -> int:
    """The budget of a fixed fraction: ``floor(frac * full)``, robust to the binary
    rounding of ``frac`` (0.29 of 100 is 29).  Every fixed-fraction rule uses it: the
    operator's forced fraction, the ``fixed`` policy, an A/B arm."""
    return max(0, int(math.floor(float(frac) * int(full) + 1e-9)))


def plan_fixed_fraction(confidences: Any, sps: SpsFn, *, frac: float, algorithm: str = "fixed") -> Plan:
    """Verify ``floor(frac * total draft positions)`` tokens, the top ones by live a."""
    if not 0.0 <= float(frac) <= 1.0:
        raise PlanError(f"fixed fraction must be in [0, 1], got {frac}")
    prepared = _prepare(confidences)
    surv = prepared[0]
    n = int(prepared[1].size)
    K = fraction_budget(frac, n)
    lengths = _top_k_lengths(prepared, K)
    _, sps_at = _sps_cached(sps, len(surv), 0)
    expl = [f"fixed fraction {frac:g} of {n} draft positions -> K={K}, top-K by survival "
            "(the budget does not depend on the current tokens, so this is lossless)"]
    return _finish(surv=surv, lengths=lengths, sps_vals_at=sps_at, algorithm=algorithm,
                   policy=f"fixed(frac={frac:g})", explanation=expl, sla_floor=None)


def plan_verify_all(confidences: Any, sps: SpsFn) -> Plan:
    """Scheduling off: every request verifies all its draft tokens."""
    surv = survival_products(confidences)
    lengths = [int(s.size) for s in surv]
    _, sps_at = _sps_cached(sps, len(surv), 0)
    return _finish(surv=surv, lengths=lengths, sps_vals_at=sps_at, algorithm="off", policy="off",
                   explanation=["policy off: verify every draft token (stock DSpark)"], sla_floor=None)


def plan(confidences: Any, sps: SpsFn, *, policy: Any = None, algorithm: str = "exact",
         lagged_confidences: Any = None, budget: Optional[int] = None,
         rng: Optional[np.random.Generator] = None, max_trace: int = _DEFAULT_TRACE) -> Plan:
    """Dispatch on policy (throughput | sla | fixed | cap | off) and algorithm (exact | lagged)."""
    pol = PlanPolicy.from_spec(policy)
    if algorithm not in ("exact", "lagged"):
        raise PlanError(f"unknown algorithm {algorithm!r}; use 'exact' (Algorithm 1) or 'lagged'")
    if pol.verify_all:
        return plan_verify_all(confidences, sps)
    if pol.fixed_frac is not None:
        return plan_fixed_fraction(confidences, sps, frac=pol.fixed_frac, algorithm=algorithm)
    cap, floor = pol.cap, pol.sla_floor
    if algorithm == "exact":
        return plan_exact(confidences, sps, max_tokens=cap, sla_floor=floor, max_trace=max_trace,
                          policy=pol.describe())
    return plan_lagged(confidences, sps, lagged_confidences=lagged_confidences, budget=budget,
                       max_tokens=cap, sla_floor=floor, explore_prob=pol.explore_prob, rng=rng,
                       policy=pol.describe())


def expected_throughput(confidences: Any, lengths: Sequence[int], sps: SpsFn) -> float:
    """Theta = tau * SPS(B) of given verify lengths under a (true) SPS curve."""
    surv = survival_products(confidences)
    if len(lengths) != len(surv):
        raise PlanError("one length per request is needed")
    R = len(surv)
    if R == 0:
        return 0.0
    tau = sum(1.0 + float(s[: int(l)].sum()) for s, l in zip(surv, lengths))
    B = R + int(sum(int(l) for l in lengths))
    return tau * float(_sps_values(sps, np.asarray([B], dtype=np.int64))[0])
