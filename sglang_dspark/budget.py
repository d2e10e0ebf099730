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
   row of the profile is measured (:func:`~dspark_controller.core.strategies.explore_now`); half
   on the budget whose profile cell has the fewest samples, half uniform
   (:func:`~dspark_controller.core.strategies.explore_budget`);
3. a fresh controller decision (``verify_all``, fixed fraction, a budget for this
   many requests, or the controller's learned curve planned locally);
4. the worker's own online :class:`~dspark_controller.core.sps_model.SpsModel`, learned
   from this engine's measured steps (no controller and no table needed);
5. SGLang's static table (upstream behaviour; none = verify all).

Lossless: every input to K (lagged confidences, profiles, policies, exploration
draws from a private RNG and the profile's past sample counts) exists before the
current step's draft tokens are sampled, so K never depends on them.  The current step's tokens only enter through
SGLang's top-K admission, exactly as upstream.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Optional

import numpy as np
import torch
from sglang.srt.speculative.dspark_components.dspark_planner import (
    HostConfidenceBudgetPlanner,
    VerifyBudgetDecision,
    compute_verify_token_budget,
)
from sglang.srt.speculative.dspark_components.dspark_sps import is_uninitialized_sps_table

from dspark_controller.core.method import fraction_budget
from dspark_controller.core.policy import BudgetPolicy, PolicyConfig

logger = logging.getLogger(__name__)


def policy_config(settings) -> PolicyConfig:
    """The policy's config from :class:`sglang_dspark.settings.Settings`:
    ``decision_max_age_s``, ``no_draft`` (the no-draft gate), and ``explore_prob`` (a fixed share of steps with a random
    budget, replacing the young/settled schedule; 0 disables exploration)."""
    cfg = PolicyConfig(decision_max_age_s=float(settings.decision_max_age_s),
                       no_draft=bool(settings.no_draft))
    return cfg if settings.explore_prob is None else cfg.with_fixed_exploration(float(settings.explore_prob))


class RelayedRows:
    """Which relayed confidence rows are the request's own.

    Under overlap scheduling SGLang relays each request's confidences from the last drafted
    step through a buffer indexed by request slot, and on CPU it stamps the row with the
    slot's *current* generation (``ConfidenceRelay.resolve``), so a request that has not
    drafted yet reads what the slot last held: the previous request's confidences, or an
    uninitialised buffer (a trace on the ``deep`` pair had 1e33 and NaN in the lagged
    survival at the start of each wave).  A row is the request's own once the request has
    been in ``lag`` drafted steps (the relay's delay; 0 when SGLang plans on the step's own
    confidences, without overlap scheduling); :meth:`mask` turns the others into NaN, which
    the policy reads as "unknown" (``BudgetPolicy.calibrated``).  Call :meth:`mask` once per
    drafted step, before SGLang's lag shift."""

    def __init__(self, lag: int) -> None:
        if int(lag) < 0:
            raise ValueError(f"RelayedRows lag={lag!r}: must be >= 0")
        self.lag = int(lag)
        self._gen = torch.full((0,), -1, dtype=torch.int64)    # slot -> generation counted
        self._drafted = torch.zeros((0,), dtype=torch.int64)   # slot -> drafted steps of that generation
        self.unknown_rows = 0

    def mask(self, confidence: torch.Tensor, rows: torch.Tensor, generation: torch.Tensor) -> torch.Tensor:
        """``confidence`` [R, gamma] with the rows not yet the request's own set to NaN;
        ``rows`` the requests' slots, ``generation`` their current generations; counts this
        step as drafted for them."""
        if self.lag == 0 or rows.numel() == 0:
            return confidence
        rows, generation = rows.to("cpu", torch.int64), generation.to("cpu", torch.int64)
        need = int(rows.max()) + 1
        if need > self._gen.shape[0]:
            grow = max(need, 2 * self._gen.shape[0])
            self._gen = torch.cat([self._gen, torch.full((grow - self._gen.shape[0],), -1, dtype=torch.int64)])
            self._drafted = torch.cat([self._drafted, torch.zeros(grow - self._drafted.shape[0], dtype=torch.int64)])
        drafted = torch.where(self._gen[rows] == generation, self._drafted[rows], 0)
        self._gen[rows] = generation
        self._drafted[rows] = drafted + 1
        own = drafted >= self.lag
        if bool(own.all()):
            return confidence
        self.unknown_rows += int((~own).sum())
        return torch.where(own.to(confidence.device).view(-1, 1), confidence,
                           torch.full_like(confidence, float("nan")))


def _host_array(survival) -> np.ndarray:
    """float64 numpy copy of a survival matrix (torch tensor on any device, or numpy)."""
    if isinstance(survival, np.ndarray):
        return survival.astype(np.float64, copy=False)
    if survival.device.type == "cpu":      # SGLang's host planner: a view, then one numpy cast
        return survival.detach().numpy().astype(np.float64)
    return survival.detach().to("cpu", torch.float64).numpy()


class OnlineBudgetPlanner(HostConfidenceBudgetPlanner):
    """SGLang's lagged budget planner with K from the one policy object
    (:class:`dspark_controller.core.policy.BudgetPolicy`): this class only converts SGLang's
    survival tensor to numpy and the policy's decision to SGLang's ``VerifyBudgetDecision``,
    and applies the operator's pin and the A/B arms, which are not the policy's."""

    def __init__(self, *, base: HostConfidenceBudgetPlanner, policy: BudgetPolicy) -> None:
        relay = max(int(base.lag_steps) - int(base.carry_steps), 0)
        super().__init__(sps_table=base.sps_table, cfg=base.cfg,
                         model_runner=base._model_runner, relay_lag_steps=relay)
        # the relay's delay in drafted steps: none without overlap scheduling (SGLang plans
        # on the step's own confidences), one on CPU (the relay reads the last publish),
        # SGLang's ring lag on a GPU
        on_cpu = torch.device(getattr(base._model_runner, "device", "cpu")).type == "cpu"
        self.relayed = RelayedRows(0 if relay == 0 else (1 if on_cpu else relay))
        self.forced_budget_frac = base.forced_budget_frac
        self.policy = policy
        self.last_budget: Optional[int] = None
        self.last_decided_at = 0.0
        self.plan_time_s = 0.0
        self.plan_calls = 0
        # host seconds by phase: SGLang's lag shift + survival, the copy to numpy, the
        # decision (the policy, calibration included, or SGLang's table); plan_time_s minus
        # their sum is bookkeeping
        self.phase_time_s = {"lag_survival": 0.0, "to_host": 0.0, "decide": 0.0}
        self.recent_plan_s: deque = deque(maxlen=512)     # per-call, for the median
        self.last_arm: Optional[str] = None     # AbBudgetPlanner: the arm of the last step
        self._step_draft: Optional[bool] = None   # this decode step drafts (None: not asked yet)
        self._plain = False     # the last step's batch needed plain decoding (a sampling penalty)

    # ------------------------------------------------------------------ draft or not
    def step_draft(self, num_req: int, plain: Optional[bool] = None) -> bool:
        """Whether the coming decode step drafts (False: a no-draft step).  Asked once per
        step, by whichever comes first: SGLang's budget preparation for the step (overlap
        scheduling) or the worker at the step's start; :meth:`end_step` closes the step.
        ``plain``: the step's batch needs plain decoding (:mod:`sglang_dspark.penalties`),
        which no pin or arm overrides; None (SGLang's budget preparation, which has no
        batch): as the last step that said."""
        if plain is not None:
            self._plain = bool(plain)
        if self._step_draft is None:
            if self._plain and self.policy.gate is not None:
                self._step_draft = self.policy.draft_step(int(num_req), plain=True)
            else:
                self._step_draft = self._gate(int(num_req))
        return self._step_draft

    def end_step(self) -> None:
        self._step_draft = None

    def _off_source(self) -> str:
        return "no_draft"

    def _gate(self, num_req: int) -> bool:
        """An operator's pinned budget keeps drafting (it pins what drafts verify); else the
        policy's gate (:meth:`BudgetPolicy.draft_step`)."""
        if self.forced_budget_frac is not None:
            return True
        return self.policy.draft_step(num_req)

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
        if not self.step_draft(int(req_pool_indices_cpu.shape[0])):
            # a no-draft step: nothing to verify, and no confidences enter the lag relay
            # (the next drafted step plans on the last ones drafted)
            self.policy.note(self._off_source())
            self.last_decision = VerifyBudgetDecision(budget=0)
            self.last_budget = 0
            self.last_decided_at = time.monotonic()
            return 0
        clock, phases = time.perf_counter, self.phase_time_s
        t0 = clock()
        confidence = self.relayed.mask(confidence, req_pool_indices_cpu, current_generation)
        lagged_c, lagged_g = self._shift_to_lag(
            confidence=confidence, generation=generation,
            req_pool_indices_cpu=req_pool_indices_cpu)
        survival = self._two_steps_prior_survival(
            lagged_confidence=lagged_c, lagged_generation=lagged_g,
            current_generation=current_generation)
        max_len = self.cfg.resolved_max_verify_len()
        phases["lag_survival"] += clock() - t0
        decision = self._decide(survival, max_len)
        self.last_decision = decision
        self.last_budget = int(decision.budget)
        self.last_decided_at = time.monotonic()
        return int(decision.budget)

    def _decide(self, survival, max_len: int) -> VerifyBudgetDecision:
        """This step's decision: the operator's pin, else the policy (else the fallback)."""
        if self.forced_budget_frac is not None:
            return self._fixed(survival, max_len, self.forced_budget_frac, "forced")
        return self._policy_decision(survival, max_len)

    def _fixed(self, survival, max_len: int, frac: float, source: str) -> VerifyBudgetDecision:
        self.policy.note(source)
        return VerifyBudgetDecision(budget=fraction_budget(frac, int(survival[:, :max_len].numel())))

    def _policy_decision(self, survival, max_len: int) -> VerifyBudgetDecision:
        """The policy's K on the lagged survival (copied to numpy), converted for SGLang;
        SGLang's own rule when the policy declines or fails (a planning bug must never
        fail requests)."""
        clock, phases = time.perf_counter, self.phase_time_s
        pol, decision = self.policy, None
        t1 = clock()
        try:
            if pol.enabled:
                raw = _host_array(survival[:, :max_len])
                t2 = clock()
                phases["to_host"] += t2 - t1
                t1 = t2
                d = pol.decide(raw, max_len=max_len)
                if d is not None:
                    decision = VerifyBudgetDecision(budget=int(d.budget),
                                                    predicted_step_seconds=d.predicted_step_seconds,
                                                    predicted_theta=d.predicted_theta)
        except Exception:
            pol.errors += 1
            if pol.errors <= 3 or pol.errors % 1000 == 0:
                logger.exception("sglang-dspark: budget planning failed (%d times); "
                                 "using SGLang's table for this step", pol.errors)
        if decision is None:   # named for what decides: SGLang's table, or verify-all without one
            decision = self._table_decision(survival, self._fallback_source())
        phases["decide"] += clock() - t1
        return decision

    def _fallback_source(self) -> str:
        """``warmup`` while the local profile is young; otherwise ``table`` when SGLang has
        an SPS table and ``verify_all`` when it has none (SGLang then verifies everything)."""
        if self.policy.warming_up:
            return "warmup"
        return "table" if self.has_table else "verify_all"

    @property
    def has_table(self) -> bool:
        """SGLang was given an SPS table (uninitialized = flat = verify-all)."""
        return not is_uninitialized_sps_table(self.sps_table)

    def _table_decision(self, survival, source: str) -> VerifyBudgetDecision:
        """SGLang's own K: its static table on its uncalibrated lagged survival (none = verify
        all); a row whose confidences are not the request's own (NaN, :class:`RelayedRows`)
        survives with 1, SGLang's value for a row it knows to be stale."""
        if bool(torch.isnan(survival).any()):
            survival = torch.nan_to_num(survival, nan=1.0)
        decision = compute_verify_token_budget(history_survival_probs=survival, sps_table=self.sps_table,
                                               cfg=self.cfg)
        self.policy.note(source)
        return decision


class AbBudgetPlanner(OnlineBudgetPlanner):
    """The serving planner under ``SGLANG_DSPARK_AB_ARMS`` (:mod:`sglang_dspark.ab`): each
    step runs the next arm of the rotation -- ``policy`` (the serving policy), ``upstream``
    (SGLang's table on its uncalibrated survival) or ``fixed@F`` -- unless the operator
    pinned a fraction.  Installed only when arms are set; ``OnlineBudgetPlanner`` knows
    nothing of arms."""

    def __init__(self, *, base: HostConfidenceBudgetPlanner, policy: BudgetPolicy, rotation) -> None:
        super().__init__(base=base, policy=policy)
        self.rotation = rotation
        self._arm = None      # the arm of the step being run, drawn when its draft is decided

    def _gate(self, num_req: int) -> bool:
        """The step's arm is drawn here, before its draft: ``off`` runs a no-draft step, the
        ``policy`` arm asks the policy's gate, the others draft."""
        if self.forced_budget_frac is not None:
            self._arm = None
            self.last_arm = None
            return True
        arm = self._arm = self.rotation.next()
        self.last_arm = arm.name
        if arm.kind == "off":
            return False
        return self.policy.draft_step(num_req) if arm.kind == "policy" else True

    def _off_source(self) -> str:
        return "ab:off" if self._arm is not None and self._arm.kind == "off" else "no_draft"

    def _decide(self, survival, max_len: int) -> VerifyBudgetDecision:
        arm = self._arm
        if self.forced_budget_frac is not None or arm is None:
            self.last_arm = None
            return super()._decide(survival, max_len)
        if arm.kind == "fixed":
            return self._fixed(survival, max_len, arm.frac, f"ab:{arm.name}")
        if arm.kind == "upstream":       # SGLang's own planner, as without us
            return self._table_decision(survival, "ab:upstream")
        return self._policy_decision(survival, max_len)


class HostLengthLayouts:
    """Wraps a ``DSparkVerifyPlanner``'s ``schedule_layout`` (per instance, compact mode)
    so that a layout whose verify lengths follow from the host-decided budget alone
    carries them on the host (``RaggedVerifyLayout.verify_lens_cpu``), as SGLang's
    verify-all layout does.  A layout without host lengths costs a blocking
    device-to-host read before the verify launch: ``TargetVerifyExecutor._run_ragged``
    reads ``layout.verify_lens.cpu()`` whenever the batch has ``seq_lens_cpu`` (e.g.
    flashinfer), and ``schedule_layout`` reads them itself when no ragged graph is
    captured.  SGLang never pays it without an SPS table (verify-all); our budgets must
    not add it where the budget already says what every request verifies:

    * a full budget (every draft token): SGLang's uniform layout, the one its
      verify-all path serves, built once per (requests, DP-global requests);
    * a zero budget: SGLang's layout with host lengths ``max(min_verify_len, 1)`` per
      request attached (its top-K admits nothing: every request verifies the floor);
    * any other budget: SGLang's layout unchanged.  Which requests get the K tokens is
      the global top-K of this step's live confidences, computed on the device; SGLang
      reads those lengths exactly as it does with its own SPS table.

    Under a DP-gathered verify tier (``dp_tier_num_tokens``) every rank must build the
    agreed graph size, so only the zero-budget lengths are attached there; with
    ``--speculative-dspark-align-verify-tokens-to-graph-tier`` SGLang raises a zero
    budget to fill the graph tier, so it is left alone too.
    """

    def __init__(self, planner) -> None:
        from sglang.srt.speculative.ragged_verify import RaggedVerifyMode

        if not planner.is_compact_mode:
            raise ValueError(f"HostLengthLayouts needs compact mode, got {planner.mode_value!r}")
        self.inner = planner.schedule_layout
        self._model_runner = planner.model_runner
        self._num_tokens = int(planner.verify_num_draft_tokens)
        self.gamma = self._num_tokens - 1
        cfg = planner._schedule_cfg
        self.floor = min(max(int(cfg.min_verify_len), 1), int(cfg.resolved_max_verify_len()))
        self._zero_is_floor = not bool(planner._align_verify_tokens_to_graph_tier)
        self._mode = RaggedVerifyMode.COMPACT
        self._uniform: dict = {}
        self.uniform_steps = 0     # full budget: SGLang's uniform layout
        self.floor_steps = 0       # zero budget: host lengths attached
        self.device_steps = 0      # a ragged budget: lengths known on the device only

    def __call__(self, **kw):
        budget, rows = kw.get("budget"), kw.get("req_pool_indices")
        if budget is None or rows is None:
            return self.inner(**kw)
        bs, budget = int(rows.shape[0]), int(budget)
        tier = kw.get("dp_tier_num_tokens")
        if budget >= bs * self.gamma and tier is None:
            self.uniform_steps += 1
            return self._uniform_layout(bs, kw.get("global_num_reqs"), kw["device"])
        layout = self.inner(**kw)
        if layout is None or layout.verify_lens_cpu is not None:
            return layout
        if budget <= 0 and self._zero_is_floor:
            import msgspec

            self.floor_steps += 1
            lens = [self.floor] * bs
            return msgspec.structs.replace(layout, verify_lens_cpu=lens, total_verify_tokens=sum(lens))
        self.device_steps += 1
        return layout

    def _uniform_layout(self, bs: int, global_num_reqs, device):
        from sglang.srt.speculative.dspark_components.dspark_planner import uniform_ragged_layout

        key = (bs, global_num_reqs)
        if key not in self._uniform:    # None (past the captured grid) is cached as SGLang does
            self._uniform[key] = uniform_ragged_layout(
                bs=bs, device=device, verify_num_draft_tokens=self._num_tokens,
                ragged_verify_mode=self._mode, model_runner=self._model_runner,
                tier_num_reqs=global_num_reqs)
        return self._uniform[key]

    def summary(self) -> dict:
        return {"uniform_steps": self.uniform_steps, "floor_steps": self.floor_steps,
                "device_length_steps": self.device_steps}
