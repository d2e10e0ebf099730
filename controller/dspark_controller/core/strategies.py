"""The policy's learning strategies, each a rule with its constants (pure numpy).

Exploration (:func:`explore_now`, :func:`explore_budget`), the uniform-path gate with its
boundary re-checks (:func:`prefer_uniform`), probes (:func:`probe_budget`), the admission
gain (:class:`AdmissionGain`), the uniform path's own step times (:class:`UniformTimes`,
:func:`learn_step_time`) and how a controller decision becomes this step's K
(:func:`budget_from_controller`).  :class:`dspark_controller.core.policy.BudgetPolicy`
composes them; :class:`~dspark_controller.core.policy.PolicyConfig` switches each off.
None of them sees the current step's draft tokens (the lossless rule of
:mod:`dspark_controller.core.method`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from dspark_controller.core.method import SpsFn, clip01, fraction_budget


YOUNG_ROW_SAMPLES = 2.0         # young exploration ends for a row once each budget's fit window has this many
SETTLED_ROW_SAMPLES = 4.0       # ... and a row whose ragged cells all have this many is settled


def exploration_probability(config: Any, steps: int, thin: Optional[float] = None,
                            window_thin: Optional[float] = None) -> float:
    """The local model's exploration schedule at one step.

    ``steps``: what the model has seen; ``thin``: the fewest (forgotten) samples among the
    ragged profile cells of this step's row, ``(R, R + K)`` for ``K < full``
    (:func:`row_thinness`); ``window_thin``: the fewest among those cells' fit windows,
    each cell with the ``row_window`` cells on each side (:func:`row_window_thinness`;
    None: ``thin`` stands for it); None for both: unknown, the schedule by steps alone.
    While young (``steps < young_steps``) a row some of whose budgets' fit windows still
    miss a couple of samples explores at ``explore_prob_young``; then ``explore_prob``
    until ``explore_until_steps``, except on a settled row (every ragged cell measured a
    few times), which explores at ``explore_prob_settled``: each exploration step costs
    throughput (at one request a step with a random budget loses ~a third of its tokens),
    and a measured row only needs to be kept fresh.  The young test asks for windows, not
    cells: a row has ``R * gamma`` budgets, and the row's fit at each budget stands on its
    window (docs/worker.md has the benchmark behind the rule)."""
    young_thin = thin if window_thin is None else window_thin
    if steps < config.young_steps and (young_thin is None or young_thin < YOUNG_ROW_SAMPLES):
        return float(config.explore_prob_young)
    if steps >= config.explore_until_steps:
        return 0.0
    if thin is not None and thin >= SETTLED_ROW_SAMPLES:
        return float(config.explore_prob_settled)
    return float(config.explore_prob)


def row_thinness(model: Any, *, num_req: int, full: int) -> Optional[float]:
    """The fewest forgotten samples among the profile cells of the ragged budgets
    ``K = 0 .. full - 1`` at ``num_req`` requests (a full budget may run on SGLang's uniform
    path, which the profile does not learn from); None when the model keeps no cells."""
    weights = getattr(model, "cell_weights", None)
    if weights is None or int(full) <= 0:
        return None
    return float(np.min(weights(int(num_req), int(num_req) + np.arange(int(full)))))


def row_window_thinness(model: Any, *, num_req: int, full: int) -> Optional[float]:
    """The fewest forgotten samples among the fit windows (``model.window_weight``: a cell
    and the ``row_window`` cells on each side) of the ragged budgets ``K = 0 .. full - 1``
    at ``num_req`` requests; None when the model keeps no windows."""
    window = getattr(model, "window_weight", None)
    if window is None or int(full) <= 0:
        return None
    return float(np.min(window(int(num_req), int(num_req) + np.arange(int(full)))))


def explore_now(config: Any, model: Any, *, steps: int, num_req: int, full: int, rng: Any,
                decided: Optional[Callable[[], bool]] = None) -> bool:
    """Whether this step explores, from at most one ``rng.random()`` draw (none when no
    schedule branch can explore); the row's thinness is looked up only when the draw falls
    under the highest probability the schedule could give.  ``decided()`` (looked up only
    when the draw would explore above the settled rate): the row's question is answered
    whatever its ragged cells hold (:func:`uniform_settled`), so it explores at
    ``explore_prob_settled``, only to stay fresh.  Worker and simulator share it."""
    # the highest probability any row could get at this age: one thin row of each kind
    p_hi = max(exploration_probability(config, steps, thin)
               for thin in (0.0, YOUNG_ROW_SAMPLES, SETTLED_ROW_SAMPLES))
    if p_hi <= 0.0:
        return False
    u = float(rng.random())
    if u >= p_hi:
        return False
    thin = row_thinness(model, num_req=num_req, full=full)
    window_thin = (row_window_thinness(model, num_req=num_req, full=full)
                   if steps < config.young_steps and thin is not None and thin < YOUNG_ROW_SAMPLES else None)
    p = exploration_probability(config, steps, thin, window_thin)
    if u >= p:
        return False
    settled = min(float(config.explore_prob_settled), p)
    if u >= settled and decided is not None and decided():
        return False
    return True


def _operator_pinned(decision: Any) -> bool:
    """A controller decision whose policy the operator pinned (``off``: verify all, or a
    ``fixed`` fraction): the worker applies it as is, without exploring."""
    return decision is not None and getattr(getattr(decision, "policy", None), "mode", None) in ("off", "fixed")


def uniform_throughput(survival: Any, *, num_req: int, uniform_step_s: Optional[float]) -> Optional[float]:
    """Expected tokens/s of verifying every draft token on SGLang's uniform path, whose step
    took ``uniform_step_s`` (measured) at this request count: (R + sum of the lagged
    survival) / step seconds; None when no such step was measured.  The worker compares it
    with the best ragged budget, because a uniform step can cost less than a ragged one a
    token short, which a profile monotone in B cannot represent."""
    if not uniform_step_s or uniform_step_s <= 0:
        return None
    return (int(num_req) + float(clip01(survival).sum())) / float(uniform_step_s)


BOUNDARY_CHECK_PROB = 0.2       # share of "uniform wins" steps that re-check a thin ragged plan
BOUNDARY_MIN_SAMPLES = 8.0      # ... while its (R, B) profile cell has fewer (forgotten) samples
BOUNDARY_NEAR = 0.10            # past that, a near tie (uniform ahead by less) keeps re-checking,
#                                 at BOUNDARY_CHECK_PROB * (BOUNDARY_MIN_SAMPLES / samples) ** 2


def boundary_check_probability(samples: float, margin: float) -> float:
    """Share of "uniform wins" steps that run the ragged plan instead, for a plan cell with
    ``samples`` (forgotten) samples that the uniform path beats by ``margin`` (relative)."""
    if samples < BOUNDARY_MIN_SAMPLES:
        return BOUNDARY_CHECK_PROB
    if margin >= BOUNDARY_NEAR:
        return 0.0
    return BOUNDARY_CHECK_PROB * (BOUNDARY_MIN_SAMPLES / float(samples)) ** 2


def prefer_uniform(theta_u: Optional[float], planned_theta: Optional[float], *, model: Any,
                   num_req: int, budget: int, rng: Any) -> tuple[bool, bool]:
    """``(take the uniform path, this step re-checks the ragged plan instead)``.

    The uniform path wins when its measured throughput ``theta_u`` is at least the ragged
    plan's predicted ``planned_theta``.  Once it wins, the ragged budgets near that
    boundary stop being measured, so a thin, stale profile cell would keep deciding: when
    the plan's ``(R, B = R + budget)`` price stands on fewer than ``BOUNDARY_MIN_SAMPLES``
    forgotten samples (its cell and the ``row_window`` cells on each side, which the row's
    local fit there uses: ``model.window_weight``; a model without it never re-checks),
    the plan runs anyway on a ``BOUNDARY_CHECK_PROB`` share of those steps, which measures
    exactly the comparison being made; and while uniform wins by less than
    ``BOUNDARY_NEAR``, checks go on at a share that fades with the square of those
    samples (:func:`boundary_check_probability`), so the cells keep filling, ever more
    slowly, until their mean settles the tie.  (A plan's budget moves with the step's
    confidences, so its exact cell at 16 or more requests stayed thin for a whole
    benchmark and the re-checks never stopped.)  One ``rng.random()`` draw, only when the
    share is not zero (the benchmarks behind the rule: docs/worker.md, "Full-budget steps
    on the uniform path").
    Worker and simulator share this rule."""
    if theta_u is None or planned_theta is None or theta_u < float(planned_theta):
        return False, False
    window = getattr(model, "window_weight", None)
    if window is None or BOUNDARY_CHECK_PROB <= 0:
        return True, False
    w = float(window(int(num_req), int(num_req) + int(budget)))
    margin = float(theta_u) / float(planned_theta) - 1.0 if float(planned_theta) > 0 else math.inf
    p = boundary_check_probability(w, margin)
    if p <= 0.0 or rng.random() >= p:
        return True, False
    return False, True


def ragged_prices(survival: Any, *, num_req: int, model: Any) -> Optional[np.ndarray]:
    """Expected tokens/s of each ragged budget ``K = 0 .. full - 1`` by the profile: ``R``
    plus the ``K`` likeliest drafts (what the lagged plan verifies at ``K``) over the
    profile's ``t(R, R + K)``; None for a model that is not ready."""
    if not getattr(model, "ready", False):
        return None
    s = clip01(survival)
    full, r = int(s.size), int(num_req)
    if full == 0:
        return None
    t = np.asarray(model.predict_step_time(np.full(full, r), r + np.arange(full)), dtype=np.float64)
    tokens = r + np.concatenate(([0.0], np.cumsum(np.sort(s.ravel())[::-1])[:-1]))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, tokens / t, np.inf)


def uniform_settled(theta_u: Optional[float], survival: Any, *, num_req: int, model: Any) -> bool:
    """Exploring this row cannot change its decision: the uniform path's measured
    ``theta_u`` beats the best ragged budget ``K < full`` the profile prices
    (:func:`ragged_prices`) by the boundary rule's own verdict -- by ``BOUNDARY_NEAR`` or
    more, on a price that stands on ``BOUNDARY_MIN_SAMPLES`` samples
    (:func:`boundary_check_probability` is zero).  What :func:`explore_now`'s ``decided``
    asks in the worker and the simulator."""
    if theta_u is None or not theta_u > 0 or getattr(model, "window_weight", None) is None:
        return False
    prices = ragged_prices(survival, num_req=num_req, model=model)
    if prices is None:
        return False
    k = int(np.argmax(prices))
    if not (np.isfinite(prices[k]) and prices[k] > 0) or float(theta_u) < float(prices[k]):
        return False
    w = float(model.window_weight(int(num_req), int(num_req) + k))
    return boundary_check_probability(w, float(theta_u) / float(prices[k]) - 1.0) <= 0.0


def explore_budget(model: Any, *, num_req: int, full: int, rng: Any, survival: Any = None) -> int:
    """An exploration step's K in ``[0, full]``, from one ``rng.random()`` draw.

    Half the exploration steps take a ragged budget (``K < full``) where the profile is
    blind: given the step's ``survival``, the budget the profile prices highest
    (:func:`ragged_prices`) among those whose price stands on fewer than
    ``BOUNDARY_MIN_SAMPLES`` samples (``model.window_weight``), so exploring measures the
    plans that could win first; otherwise, or once every price stands on data, the one
    whose ``(R, B = R + K)`` cell has the fewest (forgotten) samples (ties split by the same
    draw).  A curve region nobody measured is extrapolated, e.g. into "drafts are too
    expensive", and nothing would correct it.  Not ``K = full``: a full budget may run on
    SGLang's uniform path, which a ready profile does not learn from
    (:func:`profile_takes_step`), so its cell can stay thin for good and that half of
    exploration would teach nothing.  The other half take a uniform K in ``[0, full]``,
    so the whole curve keeps being re-measured (after a drift every cell is stale, not
    just thin).  Uniform always when the model keeps no cells."""
    full = max(int(full), 0)
    u = float(rng.random())
    weights = getattr(model, "cell_weights", None)
    if weights is None or full == 0 or u >= 0.5:
        v = (u - 0.5) * 2.0 if u >= 0.5 else u * 2.0
        return min(int(v * (full + 1)), full)
    window = getattr(model, "window_weight", None)
    if survival is not None and int(np.size(survival)) == full and window is not None:
        prices = ragged_prices(survival, num_req=num_req, model=model)
        if prices is not None:
            thin = np.asarray(window(int(num_req), int(num_req) + np.arange(full))) < BOUNDARY_MIN_SAMPLES
            if thin.any():
                return int(np.argmax(np.where(thin, prices, -np.inf)))
    w = np.asarray(weights(int(num_req), int(num_req) + np.arange(full)), dtype=np.float64)
    ties = np.flatnonzero(w <= w.min() + 1e-9)
    return int(ties[min(int(u * 2.0 * len(ties)), len(ties) - 1)])


PROBE_PROB = 0.05      # share of the local policy's steps that probe a neighbouring budget
PROBE_STEP = 0.25      # ... a quarter of all draft tokens above or below the chosen one,
PROBE_MAX_PER_REQUEST = 1.0   # ... at most this many drafts per request


def probe_budget(k: int, *, full: int, num_req: int, rng: Any, prob: float = PROBE_PROB,
                 step: float = PROBE_STEP, max_per_request: float = PROBE_MAX_PER_REQUEST) -> Optional[int]:
    """A neighbouring budget for this step instead of the policy's ``k``, or None (most steps).

    The profile decides by the slope of step time in B around the budget it chose, and its
    steps pile up at that budget: the neighbouring cells of the row are measured only by
    the rare exploration steps, so the slope there would mostly be the additive fit's, set
    by other rows.  So on ``PROBE_PROB`` of the steps the policy runs ``k`` plus or minus
    ``PROBE_STEP`` of the draft tokens, at most ``PROBE_MAX_PER_REQUEST`` drafts per request
    of the ``num_req`` (half each way, clipped to the ragged budgets ``[0, full - 1]``; from a
    full budget, down): the row's own cells on both sides of the choice fill, the row
    correction follows them, and the choice moves along.  Near the optimum such a step
    costs little (second order in the step), which is why it is bounded per request
    whatever gamma is.  One ``rng.random()`` draw (the benchmarks behind the rule:
    docs/worker.md, source 4).  Worker and simulator share it."""
    full = int(full)
    if full < 2:
        return None
    u = float(rng.random())
    if u >= prob:
        return None
    delta = max(1, int(round(min(step * full, max_per_request * int(num_req)))))
    up = u < 0.5 * prob and int(k) < full
    k2 = int(k) + delta if up else int(k) - delta
    k2 = min(max(k2, 0), full - 1)
    return None if k2 == int(k) else k2


ADMISSION_HALF_LIFE = 300.0    # steps: how fast AdmissionGain forgets
ADMISSION_MIN_STEPS = 30       # ... and how many steps of a kind it needs before it corrects


class AdmissionGain:
    """Realised over predicted accepted drafts, apart for ragged and uniform-path steps.

    The planner prices a budget K with the top-K of the *lagged* survival (all it may use
    before the drafts are sampled), but SGLang admits the top-K of the *live* survival,
    which keeps more of the accepted tokens than the lagged ranking predicts; and the
    survival calibration learns only from verified positions, which a ragged step picks
    by live survival, so it need not hold for a uniform step that verifies everything.
    The two sides of the comparison of a ragged plan with the uniform path
    (:func:`prefer_uniform`) are thus off by different amounts (the CPU bench pair's
    worker benchmark ended with 1.035 for ragged and 0.858 for uniform steps).  This keeps,
    per kind of step, forgotten sums of the predicted and the realised accepted drafts of
    the planned steps (local plans, and controller-planned ragged steps), and
    :func:`admitted_theta` scales each side's expected drafts by its own ratio.  Lossless:
    it learns only from steps already verified."""

    def __init__(self, *, half_life: float = ADMISSION_HALF_LIFE, min_steps: int = ADMISSION_MIN_STEPS) -> None:
        self.decay = 0.5 ** (1.0 / float(half_life))
        self.min_steps = int(min_steps)
        self._sums = {False: [0.0, 0.0, 0], True: [0.0, 0.0, 0]}   # predicted, realised, steps

    def observe(self, predicted: float, realised: float, *, uniform: bool) -> None:
        if not (predicted > 0 and math.isfinite(predicted)) or not realised >= 0:
            return
        s = self._sums[bool(uniform)]
        s[0] = s[0] * self.decay + float(predicted)
        s[1] = s[1] * self.decay + float(realised)
        s[2] += 1

    def factor(self, *, uniform: bool) -> float:
        """Realised / predicted (clipped to [0.5, 2]); 1 until ``min_steps`` of that kind."""
        p, r, n = self._sums[bool(uniform)]
        if n < self.min_steps or p <= 0:
            return 1.0
        return float(min(max(r / p, 0.5), 2.0))

    def summary(self) -> dict:
        return {("uniform" if u else "ragged"): {"steps": s[2], "factor": round(self.factor(uniform=u), 4)}
                for u, s in self._sums.items()}


def admitted_theta(theta: Optional[float], step_s: Optional[float], *, num_req: int,
                   factor: float) -> Optional[float]:
    """Expected tokens/s ``theta`` of a step taking ``step_s`` with its expected accepted
    drafts (tokens minus the ``num_req`` bonus tokens) scaled by ``factor``."""
    if theta is None or not step_s or step_s <= 0 or factor == 1.0:
        return theta
    drafts = max(float(theta) * float(step_s) - int(num_req), 0.0)
    return (int(num_req) + factor * drafts) / float(step_s)


RAGGED_TIME_DECAY = 0.9     # forgetting of an R's ragged-plan step seconds (per step at that R)
RAGGED_TIME_MIN = 3         # ragged steps at an R before RaggedTime corrects there


class RaggedTime:
    """Predicted over realised step seconds of the local ragged plans, per R.

    A ragged plan's time is the profile's prediction, the uniform path's a measured mean
    (:func:`uniform_throughput`): comparing them (:func:`prefer_uniform`) trusts a young
    profile's guess as much as a measurement.  The profile's per-R term is shrunk towards
    the other loads', so a load it has seen little of can be priced well off for many
    steps.  This keeps, per R, forgotten sums of the seconds the ragged steps the local
    policy planned were predicted to take and took, and :meth:`factor` (clipped to
    [0.5, 2]; 1 until ``RAGGED_TIME_MIN`` steps at that R) scales the ragged side's
    tokens/s in that comparison, so both sides are priced on measured time.  Lossless: it
    learns only from steps already run."""

    def __init__(self, *, decay: float = RAGGED_TIME_DECAY, min_steps: int = RAGGED_TIME_MIN) -> None:
        self.decay = float(decay)
        self.min_steps = int(min_steps)
        self._sums: dict[int, list] = {}      # R -> [predicted s, realised s, steps]

    def observe(self, num_req: int, predicted_s: Optional[float], realised_s: float) -> None:
        if not (predicted_s and predicted_s > 0 and math.isfinite(predicted_s)) or not realised_s > 0:
            return
        s = self._sums.setdefault(int(num_req), [0.0, 0.0, 0])
        s[0] = s[0] * self.decay + float(predicted_s)
        s[1] = s[1] * self.decay + float(realised_s)
        s[2] += 1

    def factor(self, num_req: int) -> float:
        s = self._sums.get(int(num_req))
        if s is None or s[2] < self.min_steps or not s[1] > 0:
            return 1.0
        return float(min(max(s[0] / s[1], 0.5), 2.0))

    def summary(self) -> dict:
        return {r: {"steps": s[2], "factor": round(self.factor(r), 4)} for r, s in sorted(self._sums.items())}


UNIFORM_EMA = 0.1      # weight of a new uniform-path step in its per-R average


def profile_takes_step(model: Any, uniform: bool) -> bool:
    """Whether a profile learns from a step: uniform-path steps only until it is ready (the
    profile is the ragged layout's curve, monotone in B; a uniform full-budget step can cost
    less than a ragged one a token short).  Worker, controller and simulator share it."""
    return not (uniform and model.ready)


class UniformTimes:
    """Per-R average of uniform-path step seconds, on the profile's drift clock.

    The planner compares a measured uniform-path step with the profile's prediction for a
    ragged one (:func:`prefer_uniform`).  The profile follows a machine that speeds up or
    slows down through its drift factor, but only ragged steps move it; a raw average of
    uniform steps taken minutes ago does not follow, and once the ragged plan wins at some R
    nothing re-measures the uniform path there, so a uniform time caught in a slow spell kept
    the worker verifying fewer tokens at one request on a noisy host.  So a sample is stored
    divided by the profile's drift factor (``model.scale``) and read back times today's.
    Not relative to the profile's prediction for the step: a young profile's per-R terms
    move by several times as its fit fills in (on the ``deep`` pair a 16-request uniform
    step read as 48 ms where it took about 120, after a refit moved the row it was stored
    against), and the uniform time is the comparison's measured side.  Without a profile,
    plain seconds."""

    def __init__(self, model: Any = None) -> None:
        self.model = model
        # R -> [EMA of the stored value (seconds / drift factor here), batch tokens, its kind]
        self.base: dict[int, list] = {}
        self.samples: dict[int, int] = {}       # R -> samples in its current value

    def _pred(self, num_req: int, batch_tokens: int) -> Optional[float]:
        m = self.model
        if m is None or not getattr(m, "ready", False):
            return None
        t = float(m.predict_step_time(int(num_req), int(batch_tokens)))
        return t if t > 0 and math.isfinite(t) else None

    def _scale(self) -> float:
        """The profile's drift factor (1 without a profile)."""
        s = getattr(self.model, "scale", None) if self.model is not None else None
        return float(s) if s is not None and s > 0 and math.isfinite(s) else 1.0

    def _encode(self, num_req: int, step_s: float, batch_tokens: int) -> tuple:
        """(the value a sample is stored as, its kind): seconds over the drift factor.  A
        sample of another kind than the stored average restarts it."""
        del num_req, batch_tokens
        return float(step_s) / self._scale(), True

    def _decode(self, num_req: int, entry: list) -> Optional[float]:
        """Seconds, on today's clock, of a stored ``[value, batch tokens, kind]``."""
        del num_req
        return entry[0] * self._scale()

    def observe(self, num_req: int, step_s: float, batch_tokens: int) -> None:
        if not step_s > 0:
            return
        r = int(num_req)
        x, kind = self._encode(r, step_s, batch_tokens)
        old = self.base.get(r)
        if old is None or old[2] != kind:
            self.base[r] = [x, int(batch_tokens), kind]
            self.samples[r] = 1
        else:
            n = self.samples.get(r, 1) + 1
            self.samples[r] = n
            old[0] += self._weight(n) * (x - old[0])
            old[1] = int(batch_tokens)

    def _weight(self, n: int) -> float:
        """Weight of an R's ``n``-th sample in its average."""
        del n
        return UNIFORM_EMA

    def get(self, num_req: int) -> Optional[float]:
        """Seconds of a uniform-path step at ``num_req`` requests, on today's clock (None: none seen)."""
        e = self.base.get(int(num_req))
        return None if e is None else self._decode(int(num_req), e)


def learn_step_time(model: Any, times: UniformTimes, brain: Any, *, num_req: int, batch_tokens: int,
                    step_s: float, uniform: bool) -> None:
    """A worker's measured step time, routed as ``DSparkControlledWorker`` does (and the
    simulator's policies, through this same function): uniform-path steps update the per-R
    average ``times`` (what ``BudgetPolicy._uniform_if_better`` compares), and count for
    ``brain``'s exploration schedule when the profile ``model`` (None: none) does not take
    them; the other steps, and uniform ones while the profile is not ready, feed the profile."""
    fed = model is not None and profile_takes_step(model, uniform)
    if uniform and step_s > 0:
        times.observe(num_req, step_s, batch_tokens)
        if not fed:
            brain.uniform_steps += 1
    if fed:
        model.update(num_req, batch_tokens, step_s)


def local_theta(planned_theta: Optional[float], planned_step_s: Optional[float], *, model: Any,
                num_req: int, budget: int) -> Optional[float]:
    """A plan's expected tokens/s re-priced with this engine's own profile ``model``.

    A controller-planned K carries the throughput its (fleet) curve predicts, while the
    uniform path it is compared with (:func:`prefer_uniform`) is priced by this engine's
    measured step time; a fleet curve published seconds ago, or learned on a slightly
    different clock, then tips the comparison (the benchmark's controller row ran ragged
    plans where the online row, pricing both sides locally, verified everything and was
    faster). So the comparison uses the plan's expected tokens (``theta * step_s``) over
    the local profile's step time at ``(R, R + K)``; unchanged while the local profile is
    not ready or the plan carries no step time."""
    if planned_theta is None or not planned_step_s or planned_step_s <= 0:
        return planned_theta
    if model is None or not getattr(model, "ready", False):
        return planned_theta
    t = float(model.predict_step_time(int(num_req), int(num_req) + int(budget)))
    if not (t > 0 and math.isfinite(t)):
        return planned_theta
    return float(planned_theta) * float(planned_step_s) / t


def controller_allows_uniform(d: Any) -> bool:
    """Whether a worker may swap a controller-planned budget for verify-all on its measured
    uniform path: not under a budget cap (``max_budget_tokens``) or an SLA floor, which a
    throughput comparison does not honour."""
    return d.max_budget_tokens is None and getattr(getattr(d, "policy", None), "mode", None) != "sla"


def budget_from_controller(d: Any, *, num_req: int, full: int, rng: Any,
                           plan: Callable[[SpsFn, Optional[float], int], Any],
                           fleet: Any = None) -> Optional[tuple[int, Any]]:
    """K from a fresh controller decision ``d``, or None when it says nothing for this batch.

    Order: exploration coin, verify-all, a ``fixed`` policy's fraction, the controller's
    learned curve planned here with this step's per-request survival (``plan(sps,
    sla_floor, cap)``, whose result is returned beside K), the controller's fraction while no
    curve has arrived, its K if it was computed for this batch size. ``max_budget_tokens``
    caps everything but verify-all; a planned K is the best one within the cap, so the plan
    returned beside it prices the K that runs. The curve is the ``fleet`` model's when it is given and
    ready (the controller's whole profile, rebuilt from its ProfileUpdate), else the
    decision's SGLang tables.
    """
    cap = full if d.max_budget_tokens is None else min(full, int(d.max_budget_tokens))
    if d.explore_prob and rng.random() < float(d.explore_prob):
        return rng.randint(0, cap), None
    if d.verify_all:
        return full, None
    mode = getattr(d.policy, "mode", None)
    if d.budget_frac is not None and mode == "fixed":
        return min(cap, fraction_budget(d.budget_frac, full)), None
    # the controller's own K assumes every request has the engine's mean acceptance
    sps = fleet.sps_function(num_req) if fleet is not None and fleet.ready else d.sps_function(num_req)
    if sps is None and d.budget_frac is not None:
        return min(cap, fraction_budget(d.budget_frac, full)), None
    if sps is not None:
        out = plan(sps, getattr(d.policy, "floor_tok_s", None) if mode == "sla" else None, cap)
        return min(cap, int(out.budget)), out
    if d.budget_tokens is not None and int(d.num_requests) == num_req:
        return min(cap, int(d.budget_tokens)), None
    return None


