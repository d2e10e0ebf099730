"""The budget policy: one object that chooses each step's draft-token budget K.

Numpy in, a frozen :class:`Decision` out; no torch, no SGLang.  The worker's
``OnlineBudgetPlanner`` (``sglang_dspark.budget``) converts SGLang's tensors to numpy and
the decision to SGLang's ``VerifyBudgetDecision``; the simulator's online and controller
policies call the very same object.

Call order per step (the worker and the simulator both follow it):

0. ``draft_step(R)`` before the step: False means a no-draft step (plain decoding, no
   draft forward; :mod:`.no_draft`); it then runs, and ``observe_off_step(R, seconds)``
   follows instead of 1-2;
1. ``decide(raw_survival, max_len=...)``: the lagged prefix survival ``[R, positions]``
   (confidences relayed from earlier steps, never from this step's draft tokens) ->
   :class:`Decision` or None (None: the caller's fallback decides: SGLang's table, or
   verify-all without one; :attr:`BudgetPolicy.warming_up` says why);
2. the step runs; then ``observe_step(...)`` with what it realised (accepted and verified
   draft tokens per request) and ``learn_step_time`` (:mod:`.strategies`) with its time.

Sources of K, in order (``last_source``): exploration (``explore``), a fresh controller
decision (``controller``), the local online profile (``local``, or ``probe`` when the
probe strategy moves it, or ``measure`` when the full budget is measured before an off
vote); None otherwise.

Strategies, each with its constants in :class:`PolicyConfig` and an off switch:

* **calibration** -- the lagged survival is replaced by the rate at which such
  predictions were realised on steps that verified every draft (:class:`SurvivalCalibrator`);
* **exploration** -- on a fraction of steps that shrinks as the step's profile row is
  measured, a budget chosen to fill the row where a plan could still win
  (:func:`.strategies.explore_now`, :func:`.strategies.explore_budget`); a row whose uniform
  path beats every ragged budget by the boundary rule's verdict explores only at the
  settled rate (:func:`.strategies.uniform_settled`);
* **uniform gate** -- verify every draft on SGLang's uniform path when its measured time
  gives more expected tokens per second than the best ragged budget
  (:func:`.strategies.prefer_uniform`, with boundary re-checks at near ties);
* **admission gain** -- that comparison scales each side's expected accepted drafts by
  what such steps realised (:class:`.strategies.AdmissionGain`), and the ragged budget is
  chosen on the survival scaled by the ragged steps' factor (:meth:`BudgetPolicy._ragged_plan`);
* **probes** -- a small share of the local ragged choices move by a bounded step, so the
  profile's row learns its own slope around the choice (:func:`.strategies.probe_budget`; a
  full budget is not probed: the boundary re-checks measure the ragged plans near it);
* **no-draft steps** -- each priced local plan votes on plain decoding against its own
  expected tokens/s (under a controller's budgets too, unless the operator pinned its
  policy: the no-draft time is this engine's; a controller-planned step is then priced
  like a local plan, so what it realised counts in the realised rate below and, for a
  ragged budget, in the ragged admission gain, though not in the uniform path's gain or
  the ragged-time correction), and a :class:`.no_draft.DraftGate`
  with hysteresis turns the votes into drafting or not; off steps are also run on a small
  share of steps to measure their time where it is unknown (``off_probe_prob_unknown``)
  or known (``off_probe_prob``),
  and on every step at a load where a plan found off better on a time not measured there,
  until it is, or until a couple of them already say drafting wins (a vote for off counts
  only on a measured time).
  Drafting is priced by the plan times what steps of its kind (ragged, or the uniform
  path) realised over what they predicted (time-weighted, as the no-draft steps' mean time
  prices off), and a switch needs that
  price and what drafted steps at that load realised to agree: stopping, drafting is
  priced at least at what they realised (one step's doubtful confidences, or one young
  plan's, do not stop drafting that pays over the recent steps), coming back on at most;
  no vote for off is cast at a load before ``measure_full_steps`` full-budget steps ran
  there (the budget a profile fitted on smaller ones extrapolates furthest).

An ablation is a config change: ``PolicyConfig(probe=False)`` etc.

Lossless: every input to K (lagged survival, profiles, controller decisions, the policy's
private RNG and past outcomes) exists before the current step's draft tokens are sampled.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dspark_controller.core.no_draft import DraftGate, GateConfig, OffTimes, StepGaps, off_wins, per_period
from dspark_controller.core.method import (clean_survival, clip01, compute_lagged_budget, lagged_budget_fast, survival_to_confidences)
from dspark_controller.core.strategies import (PROBE_MAX_PER_REQUEST, PROBE_PROB, PROBE_STEP, AdmissionGain, RaggedTime, _operator_pinned, admitted_theta, budget_from_controller, controller_allows_uniform, explore_budget, explore_now, local_theta, prefer_uniform, probe_budget, uniform_settled, uniform_throughput)

__all__ = ["PolicyConfig", "Decision", "SurvivalCalibrator", "BudgetPolicy"]

REALISED_MIN = 3         # steps of a plan kind at an R before its own realised-over-predicted ratio is used
REALISED_DECAY_R = 0.9   # forgetting of an R's realised-over-predicted sums (per step of that kind at that R)
REALISED_DECAY = 0.99    # forgetting of a plan kind's realised-over-predicted sums over all R
REALISED_BAND = 0.05     # an R reads the realised sums of the loads within this share of it
KNOWN_ROW_EMA = 0.25     # weight of the newest local plan in the survival the gate prices drafting on


def _load_bucket(num_req: int) -> int:
    """Request counts within about 19% of each other share a bucket (4 per doubling)."""
    return int(round(4.0 * math.log2(max(int(num_req), 1))))


@dataclass(frozen=True)
class PolicyConfig:
    """Every constant of the policy's strategies, and their off switches."""

    decision_max_age_s: float = 2.0     # older controller decisions are ignored
    # exploration (strategies.exploration_probability)
    explore: bool = True
    explore_prob_young: float = 0.25    # random budget on this fraction of steps
    young_steps: int = 200              # ... while the model has seen fewer steps,
    explore_prob: float = 0.03          # then this fraction
    explore_prob_settled: float = 0.01  # ... or this on a row whose ragged cells are measured
    explore_until_steps: int = 5000     # ... until it has seen this many
    # probes (strategies.probe_budget)
    probe: bool = True
    probe_prob: float = PROBE_PROB
    probe_step: float = PROBE_STEP
    probe_max_per_request: float = PROBE_MAX_PER_REQUEST
    # the uniform-path comparison and its correction
    uniform_gate: bool = True
    admission: bool = True
    ragged_time: bool = True
    # survival calibration (SurvivalCalibrator)
    calibration: bool = True
    calibration_bins: int = 10
    calibration_prior_weight: float = 8.0
    calibration_half_life: float = 2000.0
    # no-draft steps (core.no_draft): the gate's hysteresis, and off steps run to measure
    # the no-draft time where it is unknown / known
    no_draft: bool = True
    gate: GateConfig = GateConfig()
    off_probe_prob_unknown: float = 0.03
    off_probe_prob: float = 0.005
    measure_full_steps: int = 1         # full-budget steps at a load before its first off vote there
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("explore_prob_young", "explore_prob", "explore_prob_settled", "probe_prob", "probe_step",
                     "off_probe_prob_unknown", "off_probe_prob"):
            v = getattr(self, name)
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"PolicyConfig.{name} must be in [0, 1], got {v!r}")
        if not self.probe_max_per_request > 0:
            raise ValueError(f"PolicyConfig.probe_max_per_request must be > 0, got {self.probe_max_per_request!r}")
        if not self.decision_max_age_s > 0:
            raise ValueError(f"PolicyConfig.decision_max_age_s must be > 0, got {self.decision_max_age_s!r}")
        if int(self.measure_full_steps) < 0:
            raise ValueError(f"PolicyConfig.measure_full_steps must be >= 0, got {self.measure_full_steps!r}")

    def with_fixed_exploration(self, p: float) -> "PolicyConfig":
        """A fixed share ``p`` of steps explores, replacing the young/settled schedule."""
        return dataclasses.replace(self, explore_prob_young=p, explore_prob=p, explore_prob_settled=p,
                                   explore_until_steps=1 << 62)


@dataclass(frozen=True)
class Decision:
    """K (draft tokens verified by the batch) and what the plan predicted for it."""

    budget: int
    predicted_step_seconds: Optional[float] = None
    predicted_theta: Optional[float] = None


class SurvivalCalibrator:
    """Online calibration of the planner's lagged survival against realised acceptance.

    Per draft position k and per bin of predicted survival, it counts how often the prefix
    through k was accepted, and replaces the prediction by the bin's rate, shrunk towards
    the prediction with a pseudo count (``prior_weight``); rows stay non-increasing along
    positions.  It learns only from steps that verified every draft of every request it
    has a prediction for: a budget admits each step's drafts by their *live* confidences,
    so the positions a smaller budget verified are the likelier accepted ones, and their
    rate overstates what verifying more would accept.  Counts are forgotten with a
    half-life of ``half_life`` learning steps.  Lossless: it changes how many tokens are
    verified, from outcomes of earlier steps only.  (Why: docs/worker.md, "Survival
    calibration".)"""

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
        step accepted and verified.  Nothing is learnt unless every row with a prediction
        (no NaN) verified all ``gamma`` positions; rows with a NaN never count."""
        s = np.asarray(survival, dtype=np.float64)
        if s.ndim != 2 or s.shape[0] != len(accepted) or len(accepted) != len(verified):
            return
        gamma = s.shape[1]
        known = ~np.isnan(s).any(axis=1)
        ver = np.asarray(verified, dtype=np.int64)
        if not known.any() or (ver[known] < gamma).any():
            return      # a budget chose these windows (the class docstring)
        self._ensure(gamma)
        acc = np.asarray(accepted, dtype=np.int64)[known].reshape(-1, 1)
        pos = np.arange(gamma).reshape(1, -1)
        cell = (pos * self.bins + self._bin(clip01(s[known]))).ravel()  # flat (position, bin) index
        size = gamma * self.bins
        self.n *= self.decay
        self.a *= self.decay
        self.n += np.bincount(cell, minlength=size).reshape(gamma, self.bins)
        self.a += np.bincount(cell, weights=(acc > pos).ravel().astype(np.float64),
                              minlength=size).reshape(gamma, self.bins)
        self.observations += int(cell.size)

    def summary(self) -> dict:
        """``observations`` (prefix positions seen) and ``mean_abs_gap``: the mean over the
        observed (position, bin) cells of |realised rate - bin midpoint|, how far the *raw*
        survival is from what happens (what :meth:`apply` corrects), not a residual."""
        if self.n is None:
            return {"observations": 0}
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(self.n > 0.5, self.a / self.n, np.nan)
        mids = (np.arange(self.bins) + 0.5) / self.bins
        return {"observations": self.observations,
                "mean_abs_gap": (None if np.isnan(rate).all()
                                 else round(float(np.nanmean(np.abs(rate - mids[None, :]))), 4))}


class BudgetPolicy:
    """Chooses K from the sources in the module docstring; keeps counters for observability.

    ``local_model``: this engine's online :class:`~.sps_model.SpsModel` (None: no local
    planning); ``latest_decision(max_age_s)``: the freshest controller decision or None;
    ``uniform_step_time(R)``: measured seconds of a full-budget step on the uniform path
    (:class:`.strategies.UniformTimes`); ``fleet_model()``: the controller's whole profile."""

    def __init__(self, *, local_model: Any, config: PolicyConfig = PolicyConfig(),
                 latest_decision: Optional[Callable[[float], Any]] = None, enabled: bool = True,
                 uniform_step_time: Optional[Callable[[int], Optional[float]]] = None,
                 fleet_model: Optional[Callable[[], Any]] = None) -> None:
        self.local_model = local_model
        self.config = config
        self.latest_decision = latest_decision
        self.enabled = enabled
        self.fleet_model = fleet_model
        self.uniform_step_time = uniform_step_time if config.uniform_gate else None
        self.admission: Optional[AdmissionGain] = AdmissionGain() if config.admission else None
        self.ragged_time: Optional[RaggedTime] = RaggedTime() if config.ragged_time else None
        self.calibrator: Optional[SurvivalCalibrator] = (
            SurvivalCalibrator(bins=config.calibration_bins, prior_weight=config.calibration_prior_weight,
                               half_life=config.calibration_half_life)
            if config.calibration and enabled else None)
        self.uniform_steps = 0      # steps the profile did not learn from (uniform path): they
        #                             still count for the exploration schedule
        self.sources: Counter = Counter()
        self.boundary_checks = 0    # "uniform wins" steps that ran a thin ragged plan instead
        self._checked_uniform: Optional[Decision] = None   # the uniform decision a boundary check set aside
        self.errors = 0
        self.last_source = "none"
        self.warming_up = False     # the last decide() declined because the profile is young
        self.last_pred_drafts: Optional[float] = None   # the local plan's expected accepted drafts
        self.last_pred_ragged_s: Optional[float] = None  # a local ragged plan's predicted step seconds
        self.last_survival: Optional[np.ndarray] = None  # raw lagged survival of the last decision
        self.last_known: Optional[np.ndarray] = None     # its rows that are known (None: all)
        self._rng = random.Random(config.seed)
        # no-draft steps: the gate, the measured time of off steps per R, and the mean
        # calibrated survival per position over the recent local plans (what the policy last
        # knew of the drafts, to price drafting while none are made)
        self.gate: Optional[DraftGate] = DraftGate(config.gate) if config.no_draft and enabled else None
        self.off_times = OffTimes(local_model)
        self.off_probes = 0
        # R -> the drafted price of the vote that wants R's no-draft time measured first
        self._off_wanted: dict[int, Optional[float]] = {}
        self._known_row: Optional[np.ndarray] = None
        self.operator_pin: Optional[bool] = None   # True: always draft, False: never (None: the policy)
        # what the local plans' drafted steps realised against what they predicted, per R and
        # over all R (forgotten sums), so the gate prices drafting by outcomes; kept apart
        # per plan kind (True: the uniform path), since each kind's price has its own error
        # (R, uniform) -> [realised tokens, predicted tokens in the same seconds, steps,
        # seconds per period]
        self._realised: dict[tuple[int, bool], list] = {}
        self._full_measured: Counter = Counter()  # load bucket -> full-budget steps run before an off vote
        self.step_gaps = StepGaps()      # the scheduler's host time per step (period pricing)
        self._real_vs_pred = {False: [0.0, 0.0], True: [0.0, 0.0]}   # uniform -> over all R
        self._pending_theta: Optional[float] = None
        self.last_draft_reason = "none"
        if self.gate is not None:
            self.gate.known_loss = self.drafting_known_to_lose

    # ------------------------------------------------------------------ draft or not
    def draft_step(self, num_req: int, *, plain: bool = False) -> bool:
        """Before a step: draft it (True), or decode it without drafts (False).  From
        earlier steps only: the step's batch needing plain decoding (``plain``: a sampling
        penalty, which only a one-position verify applies exactly; reason ``penalties``), an
        operator's pin (:attr:`operator_pin`), a controller's fresh ``no_draft`` pin, the
        gate's state, and an off step run to measure its time: at a load where a vote wants
        it measured (:meth:`_vote`), else on a private-RNG coin.  :attr:`last_draft_reason`
        says which decided."""
        gate = self.gate
        if gate is None or num_req <= 0:
            self.last_draft_reason = "no_gate"
            return True
        if plain:
            gate.pinned, reason = False, "penalties"
        elif self.operator_pin is not None:
            gate.pinned, reason = self.operator_pin, "operator"
        else:
            d = self.latest_decision(self.config.decision_max_age_s) if self.latest_decision else None
            pinned = getattr(getattr(d, "policy", None), "mode", None) == "no_draft"
            gate.pinned, reason = (False, "controller") if pinned else (None, None)
        drafting = gate.draft(num_req)
        if reason is None:
            reason = "redraft" if gate.last_kind == "redraft" else "gate"
        if drafting and not gate.off and gate.pinned is None and self.local_model is not None:
            wanted = num_req in self._off_wanted
            if wanted and self._off_measured_enough(num_req, self._off_wanted[num_req]):
                del self._off_wanted[num_req]
                wanted = False
            known = self.off_times.get(num_req) is not None
            p = 1.0 if wanted else (self.config.off_probe_prob if known else self.config.off_probe_prob_unknown)
            if p > 0 and getattr(self.local_model, "ready", False) and self._rng.random() < p:
                self.off_probes += 1
                gate.recount_as_off()
                drafting, reason = False, "probe"
        self.last_draft_reason = reason
        return drafting

    def _off_measured_enough(self, num_req: int, theta_on: Optional[float]) -> bool:
        """The no-draft time a vote for off wanted measured at ``num_req`` (:meth:`_vote`)
        needs no more off steps: it is measured (``OffTimes.MIN_SAMPLES``), or from
        ``OffTimes.EARLY_SAMPLES`` samples on, this load's own time already prices plain
        decoding below the voting plan's ``theta_on`` (None: a zero-budget plan, which votes
        by rule) by the gate's ``on_margin`` (the margin by which drafting comes back on):
        the vote stood on a time read from another load, and the next drafted steps vote
        again on this one."""
        if self.off_times.measured(num_req):
            return True
        if theta_on is None or self.gate is None or not self.off_times.measured_here(num_req):
            return False
        off = self.off_throughput(num_req)
        return off is not None and self.gate.drafting_wins(theta_on, off)

    def off_throughput(self, num_req: int) -> Optional[float]:
        """Expected tokens/s of no-draft steps at ``num_req``, per period (step plus the
        scheduler's gap, :class:`StepGaps`; None: never measured)."""
        t = self.off_times.get(num_req)
        if t is None or not t > 0:
            return None
        return float(num_req) / (float(t) + self.step_gaps.get(num_req, drafted=False))

    def observe_gap(self, num_req: int, drafted: bool, gap_s: float) -> None:
        """The host time between a decode step of ``num_req`` requests (``drafted`` or
        not) and the next step's start (engines with host-timed steps only)."""
        self.step_gaps.observe(num_req, drafted, gap_s)

    def observe_off_step(self, num_req: int, step_s: float) -> None:
        """A no-draft step's measured seconds: its time per R, then, once this R has a time
        of its own (:meth:`OffTimes.measured_here`), the gate's check whether drafting,
        priced on the last known survival, pays again."""
        if not step_s > 0 or num_req <= 0:
            return
        self.off_times.observe_off(num_req, step_s)
        gate = self.gate
        if (gate is not None and gate.off and gate.pinned is None and gate.may_switch(num_req)
                and self.off_times.measured_here(num_req)):
            gate.vote_back(self.known_theta(num_req), self.off_throughput(num_req), num_req)

    def drafting_known_to_lose(self, num_req: int) -> bool:
        """Drafting at ``num_req`` requests has realised steps here (``REALISED_MIN``), the
        no-draft time here is measured (:meth:`OffTimes.measured`), and drafting,
        priced on what the policy last knew, as for stopping it (:meth:`known_theta`), loses
        to no-draft steps by more than the gate's ``redraft_skip_margin``: a load-drop
        re-draft there would re-measure a known answer, and drafting that moves there
        stops at once (:class:`~.no_draft.DraftGate`)."""
        if self.gate is None or self.realised_rate(num_req) is None or not self.off_times.measured(num_req):
            return False
        on, off = self.known_theta(num_req, to_stop=True), self.off_throughput(num_req)
        return (on is not None and off is not None
                and float(on) < float(off) * (1.0 - self.gate.config.redraft_skip_margin))

    def known_theta(self, num_req: int, *, to_stop: bool = False) -> Optional[float]:
        """Drafting's expected tokens/s at ``num_req`` requests while none is drafted: what
        the best drafted plan with every request drafting like the recent local plans' mean
        survival (:meth:`_know`), scaled by what drafted steps realised over what they
        predicted, and at most what the local plans' drafted steps at this R realised
        (:meth:`realised_rate`): the gate comes back on evidence, not on a profile's guess
        at a budget that has not run here (None: no plan or profile yet).  ``to_stop``: at
        least what they realised instead (:meth:`stop_price`)."""
        row, model = self._known_row, self.local_model
        if row is None or model is None or not getattr(model, "ready", False):
            return None
        survival = np.tile(row, (int(num_req), 1))
        planned, d = self._local_plan(survival, int(num_req), int(survival.size), recheck=False)
        theta = self.realised_theta(int(num_req), self._admitted(d, planned, int(num_req), int(survival.size)),
                                    d.predicted_step_seconds, uniform=int(d.budget) >= int(survival.size))
        if to_stop:
            return self.stop_price(theta, int(d.budget), int(num_req))[1]
        rate = self.realised_rate(int(num_req))
        return theta if theta is None or rate is None else min(theta, rate)

    def stop_price(self, theta_on: Optional[float], budget: int, num_req: int) -> tuple:
        """(the plan's K, drafting's tokens/s) as a vote for stopping it sees them: the
        plan's price ``theta_on``, but at least what the local plans' drafted steps at this
        R realised (:meth:`realised_rate`), so a vote for off needs both to lose.  Where
        they realised something, a zero budget is priced like any plan (its price counts
        the draft it pays for), not a vote for off by rule: one step with no draft worth
        verifying says little about the next steps'."""
        rate = self.realised_rate(num_req)
        if rate is None or theta_on is None:
            return int(budget), theta_on
        return max(int(budget), 1), max(float(theta_on), rate)

    def realised_rate(self, num_req: int) -> Optional[float]:
        """Tokens/s per period (step plus the scheduler's gap) that the planned drafted
        steps at ``num_req`` requests realised (local plans, and a controller's priced
        locally, :meth:`_expect`; forgotten sums; :meth:`_realised_at`): the better plan
        kind's (ragged, or the uniform path) once ``REALISED_MIN`` of it ran there; None
        before.  The better kind's, since a kind's rate describes its budgets: ragged
        re-checks of a young profile's small budgets realise less than the full budget that
        runs beside them."""
        rates = [e[0] / e[3] for e in (self._realised_at(num_req, u) for u in (False, True))
                 if e is not None and e[2] >= REALISED_MIN and e[3] > 0]
        return max(rates) if rates else None

    def realised_theta(self, num_req: int, predicted: Optional[float],
                       predicted_step_s: Optional[float] = None, *, uniform: bool = False) -> Optional[float]:
        """Drafting's tokens/s at ``num_req`` per period (step plus the scheduler's gap): the
        plan's ``predicted`` tokens/s (a step of ``predicted_step_s``; ``uniform``: a plan of
        the full budget, which runs on the uniform path) times what the local plans' steps
        of its kind realised over what they predicted, at this R (:meth:`_realised_at`) once
        it has ``REALISED_MIN`` such steps, else that kind's over all R, else (none of its kind ran
        yet) the other kind's.  Per kind: a ragged plan is priced on the local profile, the
        uniform path on its measured time, and one's error says nothing of the other's.  A
        ratio, not the realised tokens/s itself: those describe the budgets that ran, and a
        plan that under-drafted would otherwise price every budget by its own shortfall.  The ratio
        is time-weighted (:meth:`_observe_realised`): tokens realised over the tokens the
        plans predicted for the seconds the steps took, i.e. throughput over a stretch of
        steps, on the same footing as the no-draft price (a count over the mean step
        time)."""
        if predicted is None:
            return None
        gap = self.step_gaps.get(num_req, drafted=True)
        kind = bool(uniform)
        e = self._realised_at(num_req, kind)
        if e is not None and e[2] >= REALISED_MIN:
            real, pred = e[0], e[1]
        else:   # this kind over all R; before it has any step, the other kind's
            real, pred = self._real_vs_pred[kind if self._real_vs_pred[kind][1] > 0 else not kind]
        ratio = real / pred if pred > 0 else 1.0
        return per_period(float(predicted) * ratio, predicted_step_s, gap)

    def _realised_at(self, num_req: int, uniform: bool) -> Optional[list]:
        """The realised sums of plan kind ``uniform`` at ``num_req`` requests: its own,
        pooled with those of every load within ``REALISED_BAND`` of it (none below 20
        requests), their tokens scaled to ``num_req`` requests (None: no step of that kind
        there).  Under a steady load the batch size wanders over a few percent, so one R's
        own sums hold a handful of steps each, and the gate compared drafting's rate at
        one R, noisy by several percent, with a no-draft time that is not."""
        r, kind = int(num_req), bool(uniform)
        band = int(REALISED_BAND * r)
        if band == 0:
            return self._realised.get((r, kind))
        out = None
        for k in range(max(r - band, 1), r + band + 1):
            e = self._realised.get((k, kind))
            if e is None:
                continue
            if out is None:
                out = [0.0, 0.0, 0, 0.0]
            f = r / k
            out[0] += e[0] * f
            out[1] += e[1] * f
            out[2] += e[2]
            out[3] += e[3]
        return out

    def _observe_realised(self, num_req: int, tokens: int, step_s: float, uniform: bool) -> None:
        """A local plan's step (``uniform``: on the uniform path): ``tokens`` emitted in
        ``step_s`` seconds, against the plan's tokens/s (``_pending_theta``).  The sums are
        tokens and predicted tokens over the same seconds (each step's rate weighted by its
        time), so their ratio is realised over predicted *throughput*; a mean of per-step
        rates would overrate drafting by about the squared variation of its step times
        (1 / t averages above 1 / mean t), which the no-draft price, a count over the mean
        time, does not get."""
        pending = self._pending_theta
        if pending is None or not pending > 0:
            return
        pred_tokens = float(pending) * float(step_s)
        e = self._realised.setdefault((int(num_req), bool(uniform)), [0.0, 0.0, 0, 0.0])
        e[0] = e[0] * REALISED_DECAY_R + float(tokens)
        e[1] = e[1] * REALISED_DECAY_R + pred_tokens
        e[2] += 1
        e[3] = e[3] * REALISED_DECAY_R + float(step_s) + self.step_gaps.get(num_req, drafted=True)
        total = self._real_vs_pred[bool(uniform)]
        total[0] = total[0] * REALISED_DECAY + float(tokens)
        total[1] = total[1] * REALISED_DECAY + pred_tokens

    def _admitted(self, d: Decision, planned: Decision, num_req: int, full: int) -> Optional[float]:
        """``d``'s expected tokens/s with its drafts scaled by the admission gain; ``d`` is
        ``planned`` after the uniform gate, whose own uniform decision is priced admitted
        already (:meth:`_uniform_if_better`)."""
        if self.admission is None or d.predicted_theta is None or d is not planned:
            return d.predicted_theta
        return admitted_theta(d.predicted_theta, d.predicted_step_seconds, num_req=num_req,
                              factor=self.admission.factor(uniform=d.budget >= full))

    def _prices(self, d: Decision, planned: Decision, num_req: int, full: int) -> tuple:
        """(drafting's tokens/s for ``d``, priced by what such steps realised; plain
        decoding's), per period; either None when unknown."""
        predicted = self._admitted(d, planned, num_req, full)
        self._pending_theta = predicted
        return (self.realised_theta(num_req, predicted, d.predicted_step_seconds, uniform=int(d.budget) >= full),
                self.off_throughput(num_req))

    def _measure_full_first(self, d: Decision, verdict: tuple, num_req: int, full: int) -> bool:
        """Run this step at the full budget instead of voting: the plan ``d`` is not the full
        budget, its ``verdict`` (:meth:`_vote`) prices drafting below plain decoding, and
        fewer than ``measure_full_steps`` full-budget steps ran at this load
        (:func:`_load_bucket`).  The full budget is the one a profile fitted on smaller
        budgets extrapolates furthest; the gate must not stop drafting on that guess."""
        gate, cfg = self.gate, self.config
        bucket = _load_bucket(num_req)
        if (gate is None or gate.pinned is not None or d.budget >= full
                or self._full_measured[bucket] >= cfg.measure_full_steps):
            return False
        k, theta_on, theta_off = verdict
        if not off_wins(theta_on, theta_off, best_budget=k, margin=gate.config.off_margin):
            return False
        self._full_measured[bucket] += 1
        self._pending_theta = None
        return True

    def _vote(self, verdict: tuple, num_req: int) -> None:
        """A local plan's verdict on plain decoding, ``(K, drafting's tokens/s, plain
        decoding's)`` (priced by what such steps realised; while drafting, as for stopping
        it: :meth:`stop_price`).
        While drafting is off (a re-draft step) the verdict on coming back is priced like the
        off steps' (:meth:`known_theta`, the smoothed survival), not on this one step's, and
        only against a no-draft time measured at this R (:meth:`OffTimes.measured_here`).  While
        drafting, a verdict for off on a time not measured at this R (read from another R,
        or from fewer samples), a zero budget's included, is no vote: the next steps at this R
        run without drafts until it is measured, or until their own time already says this
        plan wins (:meth:`_off_measured_enough`), and the steps after them vote on it."""
        gate = self.gate
        if gate is None:
            return
        k, theta_on, theta_off = verdict
        if gate.off and gate.pinned is None and k > 0:
            theta_on = self.known_theta(num_req)
            if not self.off_times.measured_here(num_req):
                theta_off = None      # back on only against a no-draft time measured at this R
        elif (not gate.off and gate.pinned is None and not self.off_times.measured(num_req)
              and off_wins(theta_on, theta_off, best_budget=k, margin=gate.config.off_margin)):
            # off only on a time measured here: probe it first (a zero budget votes by rule,
            # not by its price, so its measurement runs to the end)
            self._off_wanted[int(num_req)] = theta_on if k > 0 else None
            gate.abstain()
            return
        gate.vote(theta_on=theta_on, theta_off=theta_off, best_budget=k, num_req=num_req)

    def _know(self, row: np.ndarray) -> None:
        """What the policy knows of the drafts while none are made: the mean survival per
        position of the local plans, an average over the last few (``KNOWN_ROW_EMA``).  The
        gate's on/off question is about the coming dwell of steps, not the next one, and one
        step's confidences move its price by +-15% on the ``bench`` pair at one request."""
        old = self._known_row
        if old is None or old.shape != row.shape:
            self._known_row = np.array(row, dtype=np.float64)
        else:
            old += KNOWN_ROW_EMA * (row - old)

    # ------------------------------------------------------------------ decide
    def calibrated(self, raw: np.ndarray, max_len: int) -> np.ndarray:
        """The survival the plan uses: ``raw[:, :max_len]``, calibrated when that is on.  A
        row with a NaN is unknown (the caller has no confidences of that request's own:
        ``sglang_dspark.budget.RelayedRows``): it is planned with what the policy knows of
        the drafts (the recent plans' mean row, :meth:`_know`), else with this step's known
        rows' mean, else with 1 (SGLang's value for an unknown row), and it neither
        calibrates nor joins the mean row (:attr:`last_known`)."""
        raw = np.asarray(raw, dtype=np.float64)[:, :max_len]
        self.last_survival = raw
        s = raw if self.calibrator is None else self.calibrator.apply(raw)
        known = ~np.isnan(raw).any(axis=1)
        self.last_known = None if known.all() else known
        if self.last_known is not None:
            s = np.array(s, dtype=np.float64, copy=True)
            row = self._known_row
            if row is None or row.shape[0] != s.shape[1]:
                row = s[known].mean(axis=0) if known.any() else np.ones(s.shape[1])
            s[~known] = row
        return s

    def decide(self, raw_survival: np.ndarray, *, max_len: int) -> Optional[Decision]:
        """``raw_survival``: [R, positions] lagged prefix survival (numpy)."""
        self.last_pred_drafts = None
        self.last_pred_ragged_s = None
        self.warming_up = False
        self.last_survival = None
        if not self.enabled or raw_survival.shape[0] == 0 or raw_survival.shape[1] == 0:
            return None
        survival = self.calibrated(raw_survival, max_len)
        num_req = int(survival.shape[0])
        full = int(survival.size)
        model = self.local_model
        cfg = self.config
        decision = self.latest_decision(cfg.decision_max_age_s) if self.latest_decision else None
        # exploration first, whoever decides: it keeps the local fallback profile informed
        # and puts the unseen budgets into the telemetry the controller learns from; not
        # when the operator pinned the policy (off = verify all, or a fixed fraction)
        if cfg.explore and model is not None and not _operator_pinned(decision):
            if explore_now(cfg, model, steps=model.steps + self.uniform_steps, num_req=num_req, full=full,
                           rng=self._rng, decided=lambda: self._row_decided(survival, num_req)):
                k = explore_budget(model, num_req=num_req, full=full, rng=self._rng, survival=survival)
                return self._note("explore", Decision(budget=k))
        if decision is not None:
            out = self._from_controller(decision, survival, num_req, full)
            if out is not None:
                # drafting or not is this engine's question (its own no-draft time): the
                # local plan still votes, unless the operator pinned the controller's policy
                if (self.gate is not None and model is not None and model.ready
                        and not _operator_pinned(decision)):
                    planned, d = self._local_plan(survival, num_req, full, recheck=False)
                    if self._gate_verdict(d, planned, survival, num_req, full):
                        return self._note("measure", Decision(budget=full))
                    self._expect(out, survival, num_req, full)
                return self._note("controller", out)
        if model is None:
            return None
        if not model.ready:
            self.warming_up = True      # the profile is young: the caller's fallback decides
            return None
        planned, d = self._local_plan(survival, num_req, full)
        if self._gate_verdict(d, planned, survival, num_req, full):
            return self._note("measure", Decision(budget=full))
        if cfg.probe and int(d.budget) < full:   # a full budget: the re-checks of prefer_uniform
            k2 = probe_budget(int(d.budget), full=full, num_req=num_req, rng=self._rng, prob=cfg.probe_prob,
                              step=cfg.probe_step, max_per_request=cfg.probe_max_per_request)
            if k2 is not None:      # a neighbouring budget, so the row's slope is its own
                return self._note("probe", Decision(budget=k2))
        tokens = (None if planned.predicted_theta is None or not planned.predicted_step_seconds
                  else planned.predicted_theta * planned.predicted_step_seconds)
        self._note_expected(survival, num_req, full, int(d.budget), tokens, planned.predicted_step_seconds)
        return self._note("local", d)

    def _note_expected(self, survival: np.ndarray, num_req: int, full: int, budget: int,
                       tokens: Optional[float], ragged_s: Optional[float]) -> None:
        """What a planned step of ``budget`` is expected to accept, before any admission
        correction (what AdmissionGain compares with the realised drafts): the survival's sum
        for a full budget (the uniform path), else the plan's expected ``tokens`` less the
        bonus tokens, with its predicted ragged step seconds ``ragged_s`` (RaggedTime)."""
        if budget >= full:
            self.last_pred_drafts = float(clip01(survival).sum())
        elif tokens is not None and ragged_s:
            self.last_pred_drafts = max(float(tokens) - num_req, 0.0)
            self.last_pred_ragged_s = ragged_s

    def _expect(self, d: Decision, survival: np.ndarray, num_req: int, full: int) -> None:
        """What a controller-planned step ``d`` is expected to realise, priced as a local
        plan is (the local profile's step time, or the uniform path's measured one for a
        full budget; drafts scaled by the admission gain), so that its outcome teaches the
        gate what drafting realises at this R (:meth:`_observe_realised`) and, for a
        ragged budget, the ragged admission gain (:meth:`observe_step`).  Without it
        a worker following a controller voted on the plan's price alone: on ``deep-weak``
        at one request, where drafting paid 1.13x, it stopped and restarted drafting 5
        times in 6 chunks.  Nothing when ``d`` carries no plan (exploration, verify-all,
        a fixed fraction)."""
        self._pending_theta = None
        if d.predicted_theta is None or not d.predicted_step_seconds or self.local_model is None:
            return
        tokens = float(d.predicted_theta) * float(d.predicted_step_seconds)
        uniform = int(d.budget) >= full
        t = self.uniform_step_time(num_req) if uniform and self.uniform_step_time is not None else None
        if t is None:
            t = float(self.local_model.predict_step_time(num_req, num_req + int(d.budget)))
        if not (t > 0 and math.isfinite(t)):
            return
        theta = tokens / t
        if self.admission is not None:
            theta = admitted_theta(theta, t, num_req=num_req, factor=self.admission.factor(uniform=uniform))
        self._pending_theta = theta
        self._note_expected(survival, num_req, full, int(d.budget), tokens, t)

    def _local_plan(self, survival: np.ndarray, num_req: int, full: int, *,
                    recheck: bool = True) -> tuple:
        """(the best ragged budget on the local profile, the decision after the uniform
        gate and the zero-budget rule); ``recheck``: a near tie may run a boundary re-check
        (:meth:`_uniform_if_better`)."""
        planned = self._ragged_plan(survival, num_req)
        self._checked_uniform = None
        d = self._uniform_if_better(planned, survival, num_req, full, admitted=True, recheck=recheck)
        return planned, self._uniform_over_off(d, planned, survival, num_req, full)

    def _ragged_plan(self, survival: np.ndarray, num_req: int) -> Decision:
        """The best ragged budget on the local profile (:meth:`_admitted_argmax`)."""
        return self._admitted_argmax(survival, self.local_model.sps_function(num_req))

    def _admitted_argmax(self, survival: np.ndarray, sps: Any, max_tokens: Optional[int] = None) -> Decision:
        """The best ragged budget of at most ``max_tokens`` (None: any) on the curve ``sps``
        (the local profile's, or the fleet's for a controller-planned step).  With the
        admission gain on, K is chosen on the survival scaled by what planned ragged steps
        realised over what they predicted (:class:`.strategies.AdmissionGain`; clipped at
        1): SGLang admits a budget's drafts by their live confidences, so the K it admits
        accept more than the lagged forecast's top K, most of all at the margin, where the
        plan trades one more draft against its cost.  The plan keeps the unscaled
        forecast's price (what the gain compares realised drafts with, and what the uniform
        gate and the votes scale by it).  docs/worker.md ("Where budgets come from", source
        4) has the simulator figures."""
        g = 1.0 if self.admission is None else self.admission.factor(uniform=False)
        if g == 1.0:
            return self._argmax(survival, sps, max_tokens=max_tokens)
        d = self._argmax(np.minimum(survival * g, 1.0), sps, max_tokens=max_tokens)
        st = d.predicted_step_seconds
        if not st:
            return d
        num_req = int(survival.shape[0])
        top = float(np.sort(clean_survival(survival), axis=None)[::-1][:int(d.budget)].sum())
        return Decision(budget=d.budget, predicted_step_seconds=st, predicted_theta=(num_req + top) / st)

    def _gate_verdict(self, d: Decision, planned: Decision, survival: np.ndarray, num_req: int,
                      full: int) -> bool:
        """The local plan ``d`` (``planned`` before the uniform gate) and the gate: the
        survival the policy knows (:meth:`_know`), the plan's verdict on plain decoding, and
        either a vote (:meth:`_vote`) or True: run this step at the full budget first
        (:meth:`_measure_full_first`)."""
        known = self.last_known
        if known is None or known.any():
            self._know((survival if known is None else survival[known]).mean(axis=0))
        prices = self._prices(d, planned, num_req, full)
        # a boundary re-check runs the ragged plan to measure its cell; the verdict on
        # plain decoding is the uniform path's, which the policy would otherwise run
        vote_d = self._checked_uniform if d is planned and self._checked_uniform is not None else d
        if vote_d is not d:
            prices = (self.realised_theta(num_req, vote_d.predicted_theta, vote_d.predicted_step_seconds,
                                          uniform=int(vote_d.budget) >= full),
                      prices[1])
        verdict = (int(vote_d.budget), *prices)
        if self.gate is not None and not self.gate.off:     # a vote on stopping drafting
            verdict = (*self.stop_price(prices[0], int(vote_d.budget), num_req), prices[1])
        if self._measure_full_first(vote_d, verdict, num_req, full):
            return True
        self._vote(verdict, num_req)
        return False

    def _uniform_if_better(self, d: Decision, survival: np.ndarray, num_req: int, full: int,
                           theta: Optional[float] = None, admitted: bool = False,
                           recheck: bool = True) -> Decision:
        """Verify everything (the uniform path) when its measured step time gives more expected
        tokens per second than the best ragged budget ``d`` (priced at ``theta`` when given,
        else at its own prediction); ``d`` otherwise.  A ``d`` of the full budget runs on the
        uniform path too: it is priced on that path's measured time (the ragged profile's
        price of the full budget describes a layout that does not run).  ``admitted``: each
        side's expected drafts are scaled by what such steps realised, and the ragged plan's
        profile-predicted time by what the ragged plans' steps at this R took
        (:class:`RaggedTime`), so both sides are priced on measured time (local plans only:
        their step time is the local profile's).  ``recheck=False`` prices a plan rather
        than choosing a step's: by price alone (no boundary re-check, no RNG draw)."""
        theta = d.predicted_theta if theta is None else theta
        if self.uniform_step_time is None or theta is None:
            return d
        t_u, theta_u = self._uniform_theta(survival, num_req, admitted=admitted)
        uniform_d = (None if theta_u is None
                     else Decision(budget=full, predicted_step_seconds=float(t_u), predicted_theta=theta_u))
        if d.budget >= full:
            # the full budget runs on the uniform path: priced on that path's measured time
            return d if uniform_d is None else uniform_d
        if admitted and self.admission is not None:
            theta = admitted_theta(theta, d.predicted_step_seconds, num_req=num_req,
                                   factor=self.admission.factor(uniform=False))
        if admitted and self.ragged_time is not None:
            theta = theta * self.ragged_time.factor(num_req)
        if not recheck:
            return uniform_d if theta_u is not None and theta_u >= float(theta) else d
        uniform, checked = prefer_uniform(theta_u, theta, model=self.local_model,
                                          num_req=num_req, budget=d.budget, rng=self._rng)
        self.boundary_checks += int(checked)
        self._checked_uniform = uniform_d if checked else None
        return uniform_d if uniform else d

    def _row_decided(self, survival: np.ndarray, num_req: int) -> bool:
        """Exploring this step's row cannot change its decision: the uniform path's measured
        price beats every ragged budget's by the boundary rule
        (:func:`.strategies.uniform_settled`; the step's survival, no admission correction
        on either side)."""
        if self.uniform_step_time is None:
            return False
        theta_u = uniform_throughput(survival, num_req=num_req, uniform_step_s=self.uniform_step_time(num_req))
        return uniform_settled(theta_u, survival, num_req=num_req, model=self.local_model)

    def _uniform_theta(self, survival: np.ndarray, num_req: int, *, admitted: bool) -> tuple:
        """(the uniform path's measured step seconds at ``num_req``, its expected tokens/s on
        ``survival``, drafts scaled by the uniform steps' admission gain when ``admitted``);
        either None when not measured.  Call only with a ``uniform_step_time``."""
        t_u = self.uniform_step_time(num_req)
        theta_u = uniform_throughput(survival, num_req=num_req, uniform_step_s=t_u)
        if admitted and self.admission is not None:
            theta_u = admitted_theta(theta_u, t_u, num_req=num_req, factor=self.admission.factor(uniform=True))
        return t_u, theta_u

    def _uniform_over_off(self, d: Decision, planned: Decision, survival: np.ndarray, num_req: int,
                          full: int) -> Decision:
        """Where no-draft steps run, a plan whose best budget is 0 stands for a no-draft step
        (a zero budget decodes the same tokens and pays the draft on top), so the uniform
        path is compared with the no-draft steps' time measured at this R
        (:meth:`OffTimes.measured`), not with the profile's price of a zero budget: ``d``,
        or the uniform decision when it beats that (no boundary re-check of the zero-budget
        cell, :func:`prefer_uniform`: off beats a zero budget wherever it runs).  A young
        profile that prices a zero budget low (its per-R term shrunk towards the other
        loads') would otherwise make every step's best budget 0, a vote for off by rule,
        where verifying every draft pays."""
        if d is not planned or int(planned.budget) != 0 or self.gate is None or self.uniform_step_time is None:
            return d
        if not self.off_times.measured(num_req):
            return d
        t_off = self.off_times.get(num_req)
        if t_off is None or not t_off > 0:
            return d
        t_u, theta_u = self._uniform_theta(survival, num_req, admitted=True)
        if theta_u is None or theta_u < float(num_req) / float(t_off):
            return d
        return Decision(budget=full, predicted_step_seconds=float(t_u), predicted_theta=theta_u)

    def _from_controller(self, d: Any, survival: np.ndarray, num_req: int, full: int) -> Optional[Decision]:
        # the fleet's learned curve is planned here with this step's calibrated survival
        r = budget_from_controller(d, num_req=num_req, full=full, rng=self._rng,
                                   plan=lambda sps, floor, cap: (
                                       self._admitted_argmax(survival, sps, max_tokens=cap) if floor is None
                                       else self._argmax(survival, sps, sla_floor=floor, max_tokens=cap)),
                                   fleet=self.fleet_model() if self.fleet_model is not None else None)
        if r is None:
            return None
        k, planned = r
        if planned is None:
            return Decision(budget=k)
        out = Decision(budget=k, predicted_step_seconds=planned.predicted_step_seconds,
                       predicted_theta=planned.predicted_theta)
        # the fleet's curve is one monotone curve in B too: this engine's measured uniform
        # path may still beat its best ragged budget; both sides of that comparison are
        # priced by this engine's own measurements (local_theta)
        if controller_allows_uniform(d):
            theta = local_theta(out.predicted_theta, out.predicted_step_seconds,
                                model=self.local_model, num_req=num_req, budget=k)
            return self._uniform_if_better(out, survival, num_req, full, theta=theta)
        return out

    @staticmethod
    def _argmax(survival: np.ndarray, sps: Any, sla_floor: Optional[float] = None,
                max_tokens: Optional[int] = None) -> Decision:
        if sla_floor is None:   # the hot path: same K as compute_lagged_budget, fewer host ops
            k, theta, s = lagged_budget_fast(clean_survival(survival), sps, max_tokens=max_tokens)
            return Decision(budget=k, predicted_step_seconds=(1.0 / s) if s > 0 else None, predicted_theta=theta)
        lb = compute_lagged_budget(survival_to_confidences(survival), sps, sla_floor=sla_floor,
                                   max_tokens=max_tokens)
        s = float(sps(lb.batch_tokens)) if lb.batch_tokens else 0.0
        return Decision(budget=int(lb.budget_tokens), predicted_step_seconds=(1.0 / s) if s > 0 else None,
                        predicted_theta=float(lb.predicted_throughput))

    def note(self, source: str) -> None:
        """Count a step whose K someone else chose (forced, an A/B arm, SGLang's fallback)."""
        self.sources[source] += 1
        self.last_source = source

    def _note(self, source: str, d: Decision) -> Decision:
        self.note(source)
        return d

    # ------------------------------------------------------------------ observe
    def observe_step(self, *, survival: Optional[np.ndarray], accepted: Optional[Sequence[int]],
                     verified: Optional[Sequence[int]], pred_drafts: Optional[float], uniform: bool,
                     step_s: Optional[float] = None, pred_ragged_s: Optional[float] = None,
                     source: Optional[str] = None) -> None:
        """What a finished step realised: ``survival`` the raw lagged survival its decision
        used (:attr:`last_survival` at the time), per request the accepted and verified
        draft tokens, ``pred_drafts`` the drafts its plan expected (None: neither a local plan
        nor a controller-planned step, :meth:`_expect`), ``step_s`` its measured seconds (a
        plan's step also teaches the gate what drafting realises) and ``pred_ragged_s`` the
        seconds a ragged plan's local profile predicted (:attr:`last_pred_ragged_s` at the
        time; :class:`RaggedTime`); ``source`` who chose its budget (:attr:`last_source` at
        the time): a controller-planned step teaches the gate's realised rate and, when
        ragged, the ragged admission gain (its K is chosen on it too), not the uniform
        path's gain or the ragged-time correction, which correct the local plans."""
        if pred_drafts is not None and accepted is not None and step_s and step_s > 0 and len(accepted):
            self._observe_realised(len(accepted), len(accepted) + int(sum(accepted)), float(step_s), bool(uniform))
            if self.ragged_time is not None and not uniform and source != "controller":
                self.ragged_time.observe(len(accepted), pred_ragged_s, float(step_s))
        if (survival is not None and accepted is not None and verified is not None
                and self.calibrator is not None):
            self.calibrator.observe(survival, accepted, verified)
        if pred_drafts is not None and accepted is not None and self.admission is not None \
                and (source != "controller" or not uniform):
            self.admission.observe(pred_drafts, float(sum(accepted)), uniform=uniform)
