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
2. a fresh controller decision (``verify_all``, fixed fraction, a budget for this
   many requests, or the controller's learned curve planned locally);
3. the worker's own online :class:`~dspark_controller.sps_model.SpsModel`, learned
   from this engine's measured steps (no controller and no table needed);
4. SGLang's static table (upstream behaviour; none = verify all).

Lossless: every input to K (lagged confidences, profiles, policies, exploration
coin flips from a private RNG) exists before the current step's draft tokens are
sampled, so K never depends on them.  The current step's tokens only enter through
SGLang's top-K admission, exactly as upstream.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
from sglang.srt.speculative.dspark_components.dspark_planner import (
    HostConfidenceBudgetPlanner,
    VerifyBudgetDecision,
    compute_verify_token_budget,
)

from dspark_controller.planner import compute_lagged_budget

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetConfig:
    decision_max_age_s: float = 2.0     # older controller decisions are ignored
    explore_prob_young: float = 0.25    # local: random budget on this fraction of steps
    young_steps: int = 200              # ... while the model has seen fewer steps,
    explore_prob: float = 0.03          # then this fraction
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
                kw.update(explore_prob_young=p, explore_prob=p, explore_until_steps=1 << 62)
        except ValueError:
            raise ValueError("SGLANG_DSPARK_DECISION_MAX_AGE_S must be a number and "
                             "SGLANG_DSPARK_EXPLORE_PROB a number in [0, 1].") from None
        return cls(**kw)


def survival_to_confidences(survival: torch.Tensor) -> np.ndarray:
    """Per-position conditional confidences from cumulative survival rows."""
    s = np.nan_to_num(survival.detach().to(torch.float64).cpu().numpy(), nan=0.0,
                      posinf=1.0, neginf=0.0)
    prev = np.concatenate([np.ones((s.shape[0], 1)), s[:, :-1]], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(prev > 0, s / prev, 0.0)
    return np.clip(c, 0.0, 1.0)


class BudgetBrain:
    """Chooses K from the sources above; keeps counters for observability."""

    def __init__(self, *, local_model, config: BudgetConfig = BudgetConfig(),
                 latest_decision: Optional[Callable[[float], object]] = None,
                 enabled: bool = True) -> None:
        self.local_model = local_model
        self.config = config
        self.latest_decision = latest_decision
        self.enabled = enabled
        self.sources: Counter = Counter()
        self.errors = 0
        self.last_source = "none"
        self._rng = random.Random(config.seed)

    def _max_tokens(self, survival: torch.Tensor, max_len: int) -> int:
        return int(survival[:, :max_len].numel())

    def decide(self, survival: torch.Tensor, *, max_len: int) -> Optional[VerifyBudgetDecision]:
        if not self.enabled or survival.numel() == 0:
            return None
        num_req = int(survival.shape[0])
        full = self._max_tokens(survival, max_len)
        decision = self.latest_decision(self.config.decision_max_age_s) if self.latest_decision else None
        if decision is not None:
            out = self._from_controller(decision, survival, max_len, num_req, full)
            if out is not None:
                return self._note("controller", out)
        model = self.local_model
        if model is None:
            return None
        p = (self.config.explore_prob_young if model.steps < self.config.young_steps
             else self.config.explore_prob if model.steps < self.config.explore_until_steps else 0.0)
        if p > 0 and self._rng.random() < p:
            k = self._rng.randint(0, full)
            return self._note("explore", VerifyBudgetDecision(budget=k))
        if not model.ready:
            return None
        sps = model.sps_function(num_req)
        return self._note("local", self._argmax(survival, max_len, sps))

    def _from_controller(self, d, survival, max_len, num_req, full):
        cap = full if d.max_budget_tokens is None else min(full, int(d.max_budget_tokens))
        if d.explore_prob and self._rng.random() < float(d.explore_prob):
            return VerifyBudgetDecision(budget=self._rng.randint(0, cap))
        if d.verify_all:
            return VerifyBudgetDecision(budget=full)
        if d.budget_frac is not None:
            return VerifyBudgetDecision(budget=min(cap, int(float(d.budget_frac) * full)))
        sps = d.sps_function(num_req)
        if sps is not None:
            out = self._argmax(survival, max_len, sps, sla_floor=getattr(d.policy, "floor_tok_s", None)
                               if getattr(d.policy, "mode", None) == "sla" else None)
            return VerifyBudgetDecision(budget=min(cap, out.budget),
                                        predicted_step_seconds=out.predicted_step_seconds,
                                        predicted_theta=out.predicted_theta)
        if d.budget_tokens is not None and int(d.num_requests) == num_req:
            return VerifyBudgetDecision(budget=min(cap, int(d.budget_tokens)))
        return None

    @staticmethod
    def _argmax(survival, max_len, sps, sla_floor=None) -> VerifyBudgetDecision:
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

    def __init__(self, *, base: HostConfidenceBudgetPlanner, brain: BudgetBrain) -> None:
        relay = max(int(base.lag_steps) - int(base.carry_steps), 0)
        super().__init__(sps_table=base.sps_table, cfg=base.cfg,
                         model_runner=base._model_runner, relay_lag_steps=relay)
        self.forced_budget_frac = base.forced_budget_frac
        self.brain = brain
        self.last_budget: Optional[int] = None
        self.last_decided_at = 0.0

    def compute_budget(self, *, confidence, generation, current_generation,
                       req_pool_indices_cpu) -> int:
        lagged_c, lagged_g = self._shift_to_lag(
            confidence=confidence, generation=generation,
            req_pool_indices_cpu=req_pool_indices_cpu)
        survival = self._two_steps_prior_survival(
            lagged_confidence=lagged_c, lagged_generation=lagged_g,
            current_generation=current_generation)
        max_len = self.cfg.resolved_max_verify_len()
        if self.forced_budget_frac is not None:
            full = int(survival[:, :max_len].numel())
            decision = VerifyBudgetDecision(budget=max(0, int(float(self.forced_budget_frac) * full)))
            self.brain._note("forced", decision)
        else:
            try:
                decision = self.brain.decide(survival, max_len=max_len)
            except Exception:  # a planning bug must never fail requests
                self.brain.errors += 1
                if self.brain.errors <= 3 or self.brain.errors % 1000 == 0:
                    logger.exception("sglang-dspark: budget planning failed (%d times); "
                                     "using SGLang's table for this step", self.brain.errors)
                decision = None
            if decision is None:
                decision = compute_verify_token_budget(
                    history_survival_probs=survival, sps_table=self.sps_table, cfg=self.cfg)
                self.brain._note("table", decision)
        self.last_decision = decision
        self.last_budget = int(decision.budget)
        self.last_decided_at = time.monotonic()
        return int(decision.budget)
