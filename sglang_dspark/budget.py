"""Verify budgets from live profiles: the worker's planning collaborator.

SGLang's ragged-verify planner (``HostConfidenceBudgetPlanner``) already has the
lossless *production* structure of DSpark's scheduler (paper section 5.2): the
per-step draft-token budget K is computed from confidences relayed from earlier
steps (``_shift_to_lag`` + ``_two_steps_prior_survival``), and only then does the
current step admit a global top-K of its live survival products.  What it lacks is
a *live* SPS curve: it reads a static table (none = verify all).

:class:`OnlineBudgetPlanner` subclasses it and keeps that structure untouched; only
the choice of K changes.  K comes from, in order:

1. the operator's forced fraction (SGLang's ``dspark_force_budget_frac``);
2. exploration, on a fraction of steps whoever decides below, set by how well the step's
   row of the profile is measured (:func:`~dspark_controller.planner.explore_now`); half
   on the budget whose profile cell has the fewest samples, half uniform
   (:func:`~dspark_controller.planner.explore_budget`);
3. a fresh controller decision (``verify_all``, fixed fraction, a budget for this
   many requests, or the controller's learned curve planned locally);
4. the worker's own online :class:`~dspark_controller.sps_model.SpsModel`, learned
   from this engine's measured steps (no controller and no table needed);
5. SGLang's static table (upstream behaviour; none = verify all).

Lossless: every input to K (lagged confidences, profiles, policies, exploration
draws from a private RNG and the profile's past sample counts) exists before the
current step's draft tokens are sampled, so K never depends on them.  The current step's tokens only enter through
SGLang's top-K admission, exactly as upstream.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from sglang.srt.speculative.dspark_components.dspark_planner import (
    HostConfidenceBudgetPlanner,
    VerifyBudgetDecision,
    compute_verify_token_budget,
)

from dspark_controller.planner import (AdmissionGain, _operator_pinned, admitted_theta, budget_from_controller,
                                       clean_survival, clip01, compute_lagged_budget, controller_allows_uniform,
                                       explore_budget, explore_now, lagged_budget_fast, local_theta, prefer_uniform,
                                       probe_budget, uniform_throughput)
from dspark_controller.planner import survival_to_confidences as _survival_to_confidences

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetConfig:
    decision_max_age_s: float = 2.0     # older controller decisions are ignored
    explore_prob_young: float = 0.25    # local: random budget on this fraction of steps
    young_steps: int = 200              # ... while the model has seen fewer steps,
    explore_prob: float = 0.03          # then this fraction
    explore_prob_settled: float = 0.01  # ... or this on a row whose ragged cells are measured
    explore_until_steps: int = 5000     # ... until it has seen this many
    seed: int = 0

    @classmethod
    def from_env(cls) -> "BudgetConfig":
        """``SGLANG_DSPARK_DECISION_MAX_AGE_S`` (seconds) and ``SGLANG_DSPARK_EXPLORE_PROB``
        (a fixed fraction of steps with a uniformly random budget, replacing the default
        young/old schedule; 0 disables exploration)."""
        import os

        kw = {}
        try:
            if "SGLANG_DSPARK_DECISION_MAX_AGE_S" in os.environ:
                kw["decision_max_age_s"] = float(os.environ["SGLANG_DSPARK_DECISION_MAX_AGE_S"])
            if "SGLANG_DSPARK_EXPLORE_PROB" in os.environ:
                p = float(os.environ["SGLANG_DSPARK_EXPLORE_PROB"])
                if not 0.0 <= p <= 1.0:
                    raise ValueError
                kw.update(explore_prob_young=p, explore_prob=p, explore_prob_settled=p, explore_until_steps=1 << 62)
        except ValueError:
            raise ValueError("SGLANG_DSPARK_DECISION_MAX_AGE_S must be a number and "
                             "SGLANG_DSPARK_EXPLORE_PROB a number in [0, 1].") from None
        return cls(**kw)


def _host_array(survival) -> np.ndarray:
    """float64 numpy view of a survival matrix (torch tensor on any device, or numpy)."""
    if isinstance(survival, np.ndarray):
        return survival.astype(np.float64, copy=False)
    if survival.device.type == "cpu":      # SGLang's host planner: a view, then one numpy cast
        return survival.detach().numpy().astype(np.float64)
    return survival.detach().to("cpu", torch.float64).numpy()


def survival_to_confidences(survival) -> np.ndarray:
    """Per-position conditional confidences from cumulative survival rows (torch or numpy)."""
    return _survival_to_confidences(_host_array(survival))


class SurvivalCalibrator:
    """Online calibration of the planner's lagged survival against realised acceptance.

    SGLang's planner predicts a request's prefix survival from confidences *two steps old*
    (they must exist before the current draft tokens are sampled).  Those are often a poor
    forecast of the current block: a request whose old block had a weak position gets a low
    survival although its current block is usually accepted.  With a flat cost curve this
    hardly matters (verify everything anyway); with a real marginal token cost it makes the
    planner skip tokens that would have been accepted.

    Per draft position k and per bin of predicted survival, we count how often the prefix
    through k was actually accepted, among requests whose verify window reached k, and
    replace the prediction by the bin's rate, shrunk towards the prediction with a pseudo
    count (``prior_weight``); rows stay non-increasing along positions.  Counts are
    exponentially forgotten (``half_life`` observations per cell).  Lossless: it only
    changes how many tokens are verified, from outcomes of *earlier* steps.
    """

    def __init__(self, *, bins: int = 10, prior_weight: float = 8.0, half_life: float = 2000.0) -> None:
        self.bins = int(bins)
        self.prior_weight = float(prior_weight)
        self.decay = 0.5 ** (1.0 / float(half_life))
        self.n: Optional[np.ndarray] = None   # [gamma, bins] effective observations
        self.a: Optional[np.ndarray] = None   # [gamma, bins] prefix accepted
        self.observations = 0

    def _ensure(self, gamma: int) -> None:
        if self.n is None or self.n.shape[0] != gamma:
            self.n = np.zeros((gamma, self.bins))
            self.a = np.zeros((gamma, self.bins))
            self._cols = np.arange(gamma)

    def _bin(self, s: np.ndarray) -> np.ndarray:
        """Survival bin per entry, for an array already in [0, 1] (:func:`clip01`)."""
        return np.minimum((s * self.bins).astype(np.int64), self.bins - 1)

    def apply(self, survival: np.ndarray) -> np.ndarray:
        """Calibrated survival, same shape ``[R, gamma]``."""
        s = clip01(survival)
        if self.n is None or self.observations == 0 or s.shape[1] != self.n.shape[0]:
            return s
        b = self._bin(s)
        n, a = self.n[self._cols, b], self.a[self._cols, b]
        cal = (a + self.prior_weight * s) / (n + self.prior_weight)
        return np.minimum.accumulate(np.clip(cal, 0.0, 1.0), axis=1)

    def observe(self, survival: np.ndarray, accepted: Sequence[int], verified: Sequence[int]) -> None:
        """``survival`` [R, gamma] as predicted for a step; per request the draft tokens that
        step accepted and verified (prefix k is observed when ``verified > k``)."""
        s = np.asarray(survival, dtype=np.float64)
        if s.ndim != 2 or s.shape[0] != len(accepted) or len(accepted) != len(verified):
            return
        gamma = s.shape[1]
        self._ensure(gamma)
        acc = np.asarray(accepted, dtype=np.int64).reshape(-1, 1)
        ver = np.asarray(verified, dtype=np.int64).reshape(-1, 1)
        pos = np.arange(gamma).reshape(1, -1)
        seen = ver > pos
        if not seen.any():
            return
        cell = (pos * self.bins + self._bin(clip01(s)))[seen]  # flat (position, bin) index
        size = gamma * self.bins
        self.n *= self.decay
        self.a *= self.decay
        self.n += np.bincount(cell, minlength=size).reshape(gamma, self.bins)
        self.a += np.bincount(cell, weights=(acc > pos)[seen].astype(np.float64),
                              minlength=size).reshape(gamma, self.bins)
        self.observations += int(seen.sum())

    def summary(self) -> dict:
        if self.n is None:
            return {"observations": 0}
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(self.n > 0.5, self.a / self.n, np.nan)
        mids = (np.arange(self.bins) + 0.5) / self.bins
        return {"observations": self.observations,
                "mean_abs_gap": (None if np.isnan(rate).all()
                                 else round(float(np.nanmean(np.abs(rate - mids[None, :]))), 4))}


class BudgetBrain:
    """Chooses K from the sources above; keeps counters for observability."""

    def __init__(self, *, local_model, config: BudgetConfig = BudgetConfig(),
                 latest_decision: Optional[Callable[[float], object]] = None,
                 enabled: bool = True,
                 uniform_step_time: Optional[Callable[[int], Optional[float]]] = None,
                 fleet_model: Optional[Callable[[], object]] = None,
                 admission: Optional[AdmissionGain] = None) -> None:
        self.local_model = local_model
        # realised / predicted accepted drafts of ragged and uniform steps (planner.AdmissionGain);
        # None: the comparison takes the lagged survival at its word
        self.admission = admission
        self.last_pred_drafts: Optional[float] = None   # the local plan's expected accepted drafts
        # the controller's whole profile (None: plan a controller decision with its SGLang
        # tables); SGLang's additive table cannot hold the profile's per-row corrections
        self.fleet_model = fleet_model
        # measured seconds of a full-budget step on SGLang's uniform path at R requests (None:
        # unknown); such steps are cheaper than any ragged layout on some devices, which the
        # profile (one monotone curve in B) cannot represent, so the planner compares them
        self.uniform_step_time = uniform_step_time
        self.uniform_steps = 0      # steps the profile did not learn from (uniform path): they
        #                             still count for the exploration schedule
        self.config = config
        self.latest_decision = latest_decision
        self.enabled = enabled
        self.sources: Counter = Counter()
        self.boundary_checks = 0    # "uniform wins" steps that ran a thin ragged plan instead
        self.errors = 0
        self.last_source = "none"
        self._rng = random.Random(config.seed)

    def _max_tokens(self, survival, max_len: int) -> int:
        return int(survival.shape[0]) * min(int(survival.shape[1]), int(max_len))

    def decide(self, survival, *, max_len: int) -> Optional[VerifyBudgetDecision]:
        """``survival``: [R, positions] lagged prefix survival (torch tensor or numpy array)."""
        self.last_pred_drafts = None
        if not self.enabled or survival.shape[0] == 0 or survival.shape[1] == 0:
            return None
        num_req = int(survival.shape[0])
        full = self._max_tokens(survival, max_len)
        model = self.local_model
        decision = self.latest_decision(self.config.decision_max_age_s) if self.latest_decision else None
        # exploration first, whoever decides: it keeps the local fallback profile informed
        # and puts the unseen budgets into the telemetry the controller learns from; not
        # when the operator pinned the policy (off = verify all, or a fixed fraction)
        if model is not None and not _operator_pinned(decision):
            if explore_now(self.config, model, steps=model.steps + self.uniform_steps,
                           num_req=num_req, full=full, rng=self._rng):
                k = explore_budget(model, num_req=num_req, full=full, rng=self._rng)
                return self._note("explore", VerifyBudgetDecision(budget=k))
        if decision is not None:
            out = self._from_controller(decision, survival, max_len, num_req, full)
            if out is not None:
                return self._note("controller", out)
        if model is None:
            return None
        if not model.ready:
            return None
        sps = model.sps_function(num_req)
        planned = self._argmax(survival, max_len, sps)
        d = self._uniform_if_better(planned, survival, max_len, num_req, full, admitted=True)
        k2 = probe_budget(int(d.budget), full=full, rng=self._rng)
        if k2 is not None:      # a neighbouring budget, so the row's slope is its own (planner.probe_budget)
            return self._note("probe", VerifyBudgetDecision(budget=k2))
        # what this step is expected to accept, before any admission correction (what
        # AdmissionGain compares with the realised drafts)
        if d.budget >= full:
            self.last_pred_drafts = float(clip01(_host_array(survival[:, :max_len])).sum())
        elif planned.predicted_theta is not None and planned.predicted_step_seconds:
            self.last_pred_drafts = max(planned.predicted_theta * planned.predicted_step_seconds - num_req, 0.0)
        return self._note("local", d)

    def _uniform_if_better(self, d: VerifyBudgetDecision, survival, max_len: int, num_req: int,
                           full: int, theta: Optional[float] = None,
                           admitted: bool = False) -> VerifyBudgetDecision:
        """Verify everything (the uniform path) when its measured step time gives more expected
        tokens per second than the best ragged budget the profile found (``d``, priced at
        ``theta`` when given, else at its own prediction); ``d`` itself otherwise.
        ``admitted``: each side's expected drafts are scaled by what such steps realised
        (``self.admission``, local plans only: their step time is the local profile's)."""
        theta = d.predicted_theta if theta is None else theta
        if self.uniform_step_time is None or d.budget >= full or theta is None:
            return d
        t_u = self.uniform_step_time(num_req)
        theta_u = uniform_throughput(_host_array(survival[:, :max_len]), num_req=num_req, uniform_step_s=t_u)
        if admitted and self.admission is not None:
            theta = admitted_theta(theta, d.predicted_step_seconds, num_req=num_req,
                                   factor=self.admission.factor(uniform=False))
            theta_u = admitted_theta(theta_u, t_u, num_req=num_req, factor=self.admission.factor(uniform=True))
        uniform, checked = prefer_uniform(theta_u, theta, model=self.local_model,
                                          num_req=num_req, budget=d.budget, rng=self._rng)
        self.boundary_checks += int(checked)
        if uniform:
            return VerifyBudgetDecision(budget=full, predicted_step_seconds=float(t_u), predicted_theta=theta_u)
        return d

    def _from_controller(self, d, survival, max_len, num_req, full):
        # the fleet's learned curve is planned here with this step's calibrated survival
        r = budget_from_controller(d, num_req=num_req, full=full, rng=self._rng,
                                   plan=lambda sps, floor: self._argmax(survival, max_len, sps, sla_floor=floor),
                                   fleet=self.fleet_model() if self.fleet_model is not None else None)
        if r is None:
            return None
        k, planned = r
        if planned is None:
            return VerifyBudgetDecision(budget=k)
        out = VerifyBudgetDecision(budget=k, predicted_step_seconds=planned.predicted_step_seconds,
                                   predicted_theta=planned.predicted_theta)
        # the fleet's curve is one monotone curve in B too: this engine's measured uniform
        # path may still beat its best ragged budget (as in the local branch); both sides
        # of that comparison are priced by this engine's own measurements (local_theta)
        if controller_allows_uniform(d):
            theta = local_theta(out.predicted_theta, out.predicted_step_seconds,
                                model=self.local_model, num_req=num_req, budget=k)
            return self._uniform_if_better(out, survival, max_len, num_req, full, theta=theta)
        return out

    @staticmethod
    def _argmax(survival, max_len, sps, sla_floor=None) -> VerifyBudgetDecision:
        if sla_floor is None:   # the hot path: same K as compute_lagged_budget, fewer host ops
            k, theta, s = lagged_budget_fast(clean_survival(_host_array(survival[:, :max_len])), sps)
            return VerifyBudgetDecision(budget=k, predicted_step_seconds=(1.0 / s) if s > 0 else None,
                                        predicted_theta=theta)
        conf = survival_to_confidences(survival[:, :max_len])
        lb = compute_lagged_budget(conf, sps, sla_floor=sla_floor)
        s = float(sps(lb.batch_tokens)) if lb.batch_tokens else 0.0
        return VerifyBudgetDecision(budget=int(lb.budget_tokens),
                                    predicted_step_seconds=(1.0 / s) if s > 0 else None,
                                    predicted_theta=float(lb.predicted_throughput))

    def _note(self, source: str, d: VerifyBudgetDecision) -> VerifyBudgetDecision:
        self.sources[source] += 1
        self.last_source = source
        return d


class OnlineBudgetPlanner(HostConfidenceBudgetPlanner):
    """SGLang's lagged budget planner with K from :class:`BudgetBrain`."""

    def __init__(self, *, base: HostConfidenceBudgetPlanner, brain: BudgetBrain,
                 rotation=None) -> None:
        relay = max(int(base.lag_steps) - int(base.carry_steps), 0)
        super().__init__(sps_table=base.sps_table, cfg=base.cfg,
                         model_runner=base._model_runner, relay_lag_steps=relay)
        self.forced_budget_frac = base.forced_budget_frac
        self.brain = brain
        self.last_budget: Optional[int] = None
        self.last_decided_at = 0.0
        self.plan_time_s = 0.0
        self.plan_calls = 0
        # host seconds by phase: SGLang's lag shift + survival, our survival calibration,
        # the decision (brain or SGLang's table); plan_time_s minus their sum is bookkeeping
        self.phase_time_s = {"lag_survival": 0.0, "calibrate": 0.0, "decide": 0.0}
        self.recent_plan_s: deque = deque(maxlen=512)     # per-call, for the median
        self.calibrator: Optional[SurvivalCalibrator] = SurvivalCalibrator() if brain.enabled else None
        self.last_survival: Optional[np.ndarray] = None   # raw lagged survival of the last decision
        # SGLANG_DSPARK_AB_ARMS: the arm of each step (sglang_dspark.ab); None: no A/B
        self.rotation = rotation
        self.last_arm: Optional[str] = None

    def _calibrated(self, survival: torch.Tensor, max_len: int):
        if self.calibrator is None or survival.numel() == 0:
            return survival
        raw = _host_array(survival[:, :max_len])
        self.last_survival = raw
        return self.calibrator.apply(raw)        # numpy: BudgetBrain.decide takes either

    def compute_budget(self, *, confidence, generation, current_generation,
                       req_pool_indices_cpu) -> int:
        t0 = time.perf_counter()
        budget = self._compute_budget(confidence=confidence, generation=generation,
                                      current_generation=current_generation,
                                      req_pool_indices_cpu=req_pool_indices_cpu)
        # host time of the whole planning call (lag shift, survival, decision): the
        # overhead the worker benchmark compares with SGLang's own table path
        dt = time.perf_counter() - t0
        self.plan_time_s += dt
        self.recent_plan_s.append(dt)
        self.plan_calls += 1
        return budget

    def _compute_budget(self, *, confidence, generation, current_generation,
                        req_pool_indices_cpu) -> int:
        clock, phases = time.perf_counter, self.phase_time_s
        t0 = clock()
        lagged_c, lagged_g = self._shift_to_lag(
            confidence=confidence, generation=generation,
            req_pool_indices_cpu=req_pool_indices_cpu)
        survival = self._two_steps_prior_survival(
            lagged_confidence=lagged_c, lagged_generation=lagged_g,
            current_generation=current_generation)
        max_len = self.cfg.resolved_max_verify_len()
        t1 = clock()
        phases["lag_survival"] += t1 - t0
        arm = None if self.rotation is None or self.forced_budget_frac is not None else self.rotation.next()
        self.last_arm = None if arm is None else arm.name
        if self.forced_budget_frac is not None or (arm is not None and arm.kind == "fixed"):
            frac = self.forced_budget_frac if arm is None else arm.frac
            full = int(survival[:, :max_len].numel())
            decision = VerifyBudgetDecision(budget=max(0, int(float(frac) * full)))
            self.brain._note("forced" if arm is None else f"ab:{arm.name}", decision)
        elif arm is not None and arm.kind == "upstream":   # SGLang's own planner, as without us
            decision = self._table_decision(survival, "ab:upstream")
        else:
            try:
                calibrated = self._calibrated(survival, max_len)
                t2 = clock()
                phases["calibrate"] += t2 - t1
                t1 = t2
                decision = self.brain.decide(calibrated, max_len=max_len)
            except Exception:  # a planning bug must never fail requests
                self.brain.errors += 1
                if self.brain.errors <= 3 or self.brain.errors % 1000 == 0:
                    logger.exception("sglang-dspark: budget planning failed (%d times); "
                                     "using SGLang's table for this step", self.brain.errors)
                decision = None
            if decision is None:
                decision = self._table_decision(survival, "table")
            phases["decide"] += clock() - t1
        self.last_decision = decision
        self.last_budget = int(decision.budget)
        self.last_decided_at = time.monotonic()
        return int(decision.budget)

    def _table_decision(self, survival, source: str) -> VerifyBudgetDecision:
        """SGLang's own K: its static table on its uncalibrated lagged survival (none = verify all)."""
        decision = compute_verify_token_budget(history_survival_probs=survival, sps_table=self.sps_table,
                                               cfg=self.cfg)
        self.brain._note(source, decision)
        return decision
