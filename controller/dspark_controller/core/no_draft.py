"""No-draft steps: the policy's choice between drafting and plain decoding (pure numpy).

A zero budget still pays for the whole draft block, so "budget 0" is never the cheapest
way to decode a step: a *no-draft* step runs no draft forward and the target decodes one
token per request, at the time of a plain decode step.  Same expected tokens (one per
request) as a zero budget, less time: whenever the plan's best budget is 0, off wins.
Past that, off wins when ``R / t_off(R)`` beats the best drafted plan's expected tokens
per second, ``t_off(R)`` being the measured time of this engine's no-draft steps
(:class:`OffTimes`).

:class:`DraftGate` turns those per-step votes into a state with hysteresis, so the
choice never flaps (the failure of a batch-size-keyed switch, vLLM #49548):

* on -> off after ``confirm`` consecutive votes for off, at least ``min_dwell`` steps
  after the last switch; a vote counts when off wins by ``off_margin`` (or the best
  budget is 0); the dwell is waived when the last vote's off wins by ``clear_loss``
  (drafting, priced by what its steps realised, clearly loses: each further drafted step
  costs several plain ones, and coming back on still waits for the dwell);
* off -> on when the drafted plan, priced on what the policy last knew of the drafts
  (their survival over the last drafted steps, averaged: a re-draft step's own
  confidences count as one more sample), wins by ``on_margin``, after ``min_dwell``,
  against a no-draft time measured at this load (``OffTimes.EARLY_SAMPLES`` off steps or
  more: a clear win needs no more; a vote for off needs ``OffTimes.MIN_SAMPLES``), not
  one read from a neighbouring load (the off steps after a re-draft burst measure it);
* on -> off at once, without votes, when the load moves (a step at another R than the
  last) to where the policy already knows drafting loses (``known_loss``, below), once
  the dwell is over or waived: a load rise into a known loss pays no drafted steps to
  find it again;
* the dwell is waived once the load has left the band ``[load_drop, 1 / load_drop]``
  times the load at the last switch: that switch was decided for another load;
* while off, a *re-draft* burst of ``redraft_len`` drafted steps after ``redraft_every``
  off steps, the interval doubling after each burst that kept drafting off (up to
  ``redraft_max``), and at once when the load falls below ``load_drop`` of the load at
  which drafting stopped (or of the last burst's): fresh confidences and acceptance, so
  the estimate does not go stale, at a cost that fades while the load stays where
  drafting does not pay.  A load-drop burst is skipped, or ended early once the load has
  moved again, where the policy already knows the answer (``known_loss``: drafted steps
  realised at the step's load, its no-draft time is measured there, and drafting priced
  there more than ``redraft_skip_margin`` below no-draft steps); the schedule's bursts
  still run.

The gate is asked before a step starts and sees only earlier steps (votes, measured
times, the last known survival), so a no-draft step is lossless by construction: no
draft token exists to depend on.  :class:`dspark_controller.core.policy.BudgetPolicy`
prices the options and owns a gate; the worker and the simulator ask the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from dspark_controller.core.strategies import UNIFORM_EMA, UniformTimes

__all__ = ["GateConfig", "DraftGate", "OffTimes", "StepGaps", "off_wins", "per_period"]


@dataclass(frozen=True)
class GateConfig:
    """The gate's constants (see the module docstring for the rule)."""

    off_margin: float = 0.03      # off must beat drafting by this much to vote off
    on_margin: float = 0.05       # ... and drafting must beat off by this much to come back
    confirm: int = 2              # consecutive off votes before drafting stops
    min_dwell: int = 16           # steps in a state before the next switch
    redraft_every: int = 64       # off steps before the first re-draft burst
    redraft_max: int = 1024       # ... the interval doubles after each burst, up to this
    redraft_len: int = 3          # drafted steps per burst (the confidence relay lags a step)
    load_drop: float = 0.75       # re-draft at once when R falls below this share of R at the switch
    redraft_skip_margin: float = 0.10   # ... unless drafting is known to lose there by more than this
    clear_loss: float = 0.15      # off winning by this much stops drafting within the dwell

    def __post_init__(self) -> None:
        for name in ("off_margin", "on_margin", "redraft_skip_margin", "clear_loss"):
            v = float(getattr(self, name))
            if not 0.0 <= v < 1.0:
                raise ValueError(f"GateConfig.{name} must be in [0, 1), got {v!r}")
        for name in ("confirm", "min_dwell", "redraft_every", "redraft_max", "redraft_len"):
            v = getattr(self, name)
            if int(v) < 1:
                raise ValueError(f"GateConfig.{name} must be >= 1, got {v!r}")
        if not 0.0 < float(self.load_drop) <= 1.0:
            raise ValueError(f"GateConfig.load_drop must be in (0, 1], got {self.load_drop!r}")


def off_wins(theta_on: Optional[float], theta_off: Optional[float], *, best_budget: int,
             margin: float) -> bool:
    """One step's vote: plain decoding beats the best drafted plan.

    ``best_budget == 0`` always votes off (a zero budget decodes the same tokens as a
    no-draft step and pays the draft on top); otherwise off must give ``margin`` more
    expected tokens per second than the plan (``theta_on``), priced with the measured
    no-draft time (``theta_off``; None: not measured yet, so no vote)."""
    if int(best_budget) <= 0:
        return True
    if theta_on is None or theta_off is None or not math.isfinite(theta_off):
        return False
    return float(theta_off) > float(theta_on) * (1.0 + float(margin))


class OffTimes(UniformTimes):
    """Per-R time of no-draft steps, on the profile's drift clock.

    A sample is stored as seconds over the profile's drift factor and read back times
    today's (:class:`~dspark_controller.core.strategies.UniformTimes`), not relative to the
    profile's prediction for a zero-budget step: that cell is a drafted step's, a young
    profile's refit moves it (on ``deep-weak`` one moved the 1-request cell from 85 to
    48 ms), and a stored ratio moved every measured no-draft time with it.  An ``R``
    never measured is read from the nearest measured ``R``'s time times the profile's
    ratio of predictions at ``(R, R)`` and ``(near, near)`` (the shape across loads,
    nothing else).  An ``R``'s value is the mean of its samples until
    ``UNIFORM_EMA`` weighs more, then that moving average, so its first samples do not
    outweigh the rest.  A time taken while the profile had a quarter of its steps
    (``STALE_GROWTH``) or fewer is stale and reads as unmeasured, so the policy's off
    probes measure it again; one taken before the profile was ready is plain seconds (no
    drift clock yet) and is never stale.  An ``R`` counts as measured (:meth:`measured`)
    from ``MIN_SAMPLES`` fresh samples on; :meth:`fresh_samples` counts them before that."""

    STALE_GROWTH = 4
    MIN_SAMPLES = 8
    EARLY_SAMPLES = 2      # a measurement that already answers may stop here; drafting may come back on

    def __init__(self, model=None) -> None:
        super().__init__(model)
        self._steps_at: dict[int, int] = {}     # R -> the profile's step count at the last sample

    def observe_off(self, num_req: int, step_s: float) -> None:
        r = int(num_req)
        if not step_s > 0:
            return
        if r in self.base and not self._fresh(r):
            del self.base[r]          # a stale ratio is replaced, not averaged in
        self.observe(r, step_s, batch_tokens=r)
        self._steps_at[r] = self._model_steps()

    def _encode(self, num_req: int, step_s: float, batch_tokens: int) -> tuple:
        """UniformTimes' (seconds over the drift factor, True) once the profile is ready,
        else (seconds, False)."""
        if self._pred(num_req, num_req) is None:
            return float(step_s), False
        return super()._encode(num_req, step_s, batch_tokens)

    def _decode(self, num_req: int, entry: list) -> Optional[float]:
        return super()._decode(num_req, entry) if entry[2] else entry[0]

    def _weight(self, n: int) -> float:
        return max(1.0 / n, UNIFORM_EMA)    # the mean of the first samples, then the moving average

    def _model_steps(self) -> int:
        return int(getattr(self.model, "steps", 0) or 0)

    def _fresh(self, r: int) -> bool:
        e = self.base.get(r)
        if e is None:
            return False
        if not e[2]:
            return True
        return self._model_steps() < self.STALE_GROWTH * max(self._steps_at.get(r, 0), 1)

    def fresh_samples(self, num_req: int) -> int:
        """Samples in ``num_req``'s own no-draft time (0 when it has none, or a stale one)."""
        r = int(num_req)
        return self.samples.get(r, 0) if self._fresh(r) else 0

    def measured_here(self, num_req: int) -> bool:
        """Whether ``num_req`` has a no-draft time of its own from ``EARLY_SAMPLES`` samples or
        more: enough for drafting to come back on against it (the gate's ``on_margin`` asks
        drafting to win clearly), not to vote drafting off (:meth:`measured`)."""
        return self.fresh_samples(num_req) >= self.EARLY_SAMPLES

    def measured(self, num_req: int) -> bool:
        """Whether ``num_req`` has a no-draft time of its own from ``MIN_SAMPLES`` samples
        or more (not read from a neighbour's time, not stale)."""
        return self.fresh_samples(num_req) >= self.MIN_SAMPLES

    def get(self, num_req: int) -> Optional[float]:
        r = int(num_req)
        if self._fresh(r):
            return super().get(r)
        measured = [(abs(k - r), k) for k, e in self.base.items() if e[2] and k != r and self._fresh(k)]
        if not measured:
            return None
        near = min(measured)[1]
        pred, pred_near = self._pred(r, r), self._pred(near, near)
        if pred is None or pred_near is None:
            return None
        return super().get(near) * pred / pred_near


class StepGaps:
    """The host time between a decode step's end and the next step's start, per kind of
    step (drafted or not) and R: the scheduler's own per-step work (result processing,
    batch preparation), which a step's measured time leaves out.

    The options are priced per *period* (step plus gap): the gap is paid once per step
    whatever the step yields, so it favours the option with more tokens per step.  Each
    ``(kind, R)`` keeps the median of its last ``window`` gaps (robust to the prefill a
    gap sometimes contains); an unseen ``R`` reads the nearest one of its kind, then of
    the other kind.  Engines whose step times come from device events (GPU, where the
    host work overlaps the device's) feed none, and every gap reads 0."""

    def __init__(self, window: int = 31) -> None:
        if int(window) < 1:
            raise ValueError(f"StepGaps window must be >= 1, got {window!r}")
        self.window = int(window)
        self._gaps: dict[tuple[bool, int], list] = {}
        self._median: dict[tuple[bool, int], float] = {}

    def observe(self, num_req: int, drafted: bool, gap_s: float) -> None:
        if not (gap_s >= 0.0 and math.isfinite(gap_s)) or int(num_req) <= 0:
            return
        key = (bool(drafted), int(num_req))
        g = self._gaps.setdefault(key, [])
        g.append(float(gap_s))
        if len(g) > self.window:
            del g[0]
        self._median[key] = float(sorted(g)[len(g) // 2])

    def get(self, num_req: int, drafted: bool) -> float:
        """Seconds of host work per step at ``num_req`` (0.0: none measured)."""
        r = int(num_req)
        for kind in (bool(drafted), not drafted):
            m = self._median.get((kind, r))
            if m is not None:
                return m
            near = [(abs(k - r), k) for (d, k) in self._median if d == kind]
            if near:
                return self._median[(kind, min(near)[1])]
        return 0.0

    def summary(self) -> dict:
        return {("drafted" if d else "no_draft") + f"@{r}": round(1000 * v, 3)
                for (d, r), v in sorted(self._median.items())}


def per_period(theta: Optional[float], step_s: Optional[float], gap_s: float) -> Optional[float]:
    """Tokens/s ``theta`` of steps of ``step_s`` seconds, spread over step plus ``gap_s``."""
    if theta is None or not gap_s > 0 or step_s is None or not step_s > 0:
        return theta
    return float(theta) * float(step_s) / (float(step_s) + float(gap_s))


class DraftGate:
    """The drafting state machine: votes in, "draft this step?" out (rule: module docstring).

    Call order per step: :meth:`draft` before the step (True: draft); after a drafted step
    whose plan was priced, :meth:`vote`; after a no-draft step, :meth:`vote_back` with the
    drafted plan re-priced on the last known survival."""

    def __init__(self, config: GateConfig = GateConfig()) -> None:
        self.config = config
        self.off = False
        self.since_switch = 1 << 30      # steps since the last switch
        self.off_votes = 0               # consecutive votes for off
        self.off_steps = 0               # off steps since the last re-draft burst
        self.redraft_interval = config.redraft_every   # off steps before the next burst
        self.redraft_left = 0            # drafted steps left in the current burst
        self.drop_burst = False          # the current burst was started by a load drop
        self.off_at_requests = 0         # R when drafting stopped
        self.switch_at_requests = 0      # R at the last switch (0: none yet)
        self.pinned: Optional[bool] = None   # an operator's "draft" (True) / "no draft" (False)
        # R -> drafting is known to lose at this load by more than redraft_skip_margin (the
        # policy's pricing; the default knows nothing, so every load drop re-drafts)
        self.known_loss: Callable[[int], bool] = lambda num_req: False
        self.skipped_redrafts = 0        # load-drop bursts skipped by known_loss
        self._loss_checked_at = 0        # the R at which drafting last asked known_loss
        self.dwell_waived = 0            # on -> off switches made within the dwell (clear_loss)
        # the latest switch: to which state, at which load, why ("votes", "clear_loss",
        # "zero_budget", "known_loss" off; "drafting_wins" on), at which step, and the two
        # prices it weighed (None for "known_loss": the policy's verdict, not a vote)
        self.last_switch: Optional[dict] = None
        # counters (observability)
        self.switches = {"off": 0, "on": 0}
        self.steps = {"drafted": 0, "no_draft": 0, "redraft": 0}
        self.last_kind = "drafted"       # the key of ``steps`` the last :meth:`draft` counted

    def draft(self, num_req: int) -> bool:
        """Whether the coming step drafts (False: a no-draft step)."""
        self.since_switch += 1
        if self.pinned is not None:
            return self._count(self.pinned, redraft=False)
        if not self.off:
            r = int(num_req)
            moved, self._loss_checked_at = r != self._loss_checked_at, r
            if not (moved and self.known_loss(r) and self.may_switch(r)):
                return self._count(True, redraft=False)
            self._switch(True, r, why="known_loss", theta_on=None, theta_off=None)   # an off step, below
        cfg = self.config
        if self.redraft_left > 0:
            if self.drop_burst and self.known_loss(int(num_req)):
                # the load moved on, to where the answer is known: the rest measures nothing
                self.redraft_left, self.off_at_requests = 0, int(num_req)
                self.skipped_redrafts += 1
            else:
                self.redraft_left -= 1
                return self._count(True, redraft=True)
        dropped = int(num_req) < cfg.load_drop * self.off_at_requests
        if dropped and self.known_loss(int(num_req)):
            self.off_at_requests, dropped = int(num_req), False   # nothing to re-measure here
            self.skipped_redrafts += 1
        if dropped or self.off_steps >= self.redraft_interval:
            if not dropped:      # the last burst kept drafting off: wait longer next time
                self.redraft_interval = min(2 * self.redraft_interval, max(cfg.redraft_max, cfg.redraft_every))
            self.off_steps = 0
            self.off_at_requests = int(num_req)
            self.redraft_left = cfg.redraft_len - 1
            self.drop_burst = dropped
            return self._count(True, redraft=True)
        self.off_steps += 1
        return self._count(False, redraft=False)

    def _count(self, drafting: bool, *, redraft: bool) -> bool:
        self.last_kind = "redraft" if redraft else ("drafted" if drafting else "no_draft")
        self.steps[self.last_kind] += 1
        return drafting

    def recount_as_off(self) -> None:
        """The step :meth:`draft` let draft runs without drafts after all (the policy's
        probe of the no-draft time): count it as such."""
        self.steps[self.last_kind] -= 1
        self.last_kind = "no_draft"
        self.steps["no_draft"] += 1

    def may_switch(self, num_req: int) -> bool:
        """A vote may switch now: the dwell since the last switch is over, or the load has
        moved past ``load_drop`` of (or above ``1 / load_drop`` times) the load at that
        switch, which was decided for another load."""
        if self.since_switch >= self.config.min_dwell:
            return True
        at, r, f = self.switch_at_requests, int(num_req), self.config.load_drop
        return at > 0 and f < 1.0 and (r < f * at or r * f > at)

    def vote(self, *, theta_on: Optional[float], theta_off: Optional[float], best_budget: int,
             num_req: int) -> None:
        """A drafted step's plan, priced: ``theta_on`` its expected tokens/s, ``best_budget``
        its K, ``theta_off`` the no-draft throughput at its ``num_req`` (None: unknown)."""
        cfg = self.config
        if self.off:        # a re-draft step: back on only when drafting clearly pays
            if int(best_budget) > 0:
                self.vote_back(theta_on, theta_off, num_req)
            return
        off_better = off_wins(theta_on, theta_off, best_budget=best_budget, margin=cfg.off_margin)
        self.off_votes = self.off_votes + 1 if off_better else 0
        if self.off_votes >= cfg.confirm and (
                self.may_switch(num_req)
                or off_wins(theta_on, theta_off, best_budget=best_budget, margin=cfg.clear_loss)):
            waived = not self.may_switch(num_req)
            self.dwell_waived += int(waived)
            why = "zero_budget" if int(best_budget) <= 0 else ("clear_loss" if waived else "votes")
            self._switch(True, num_req, why=why, theta_on=theta_on, theta_off=theta_off)

    def abstain(self) -> None:
        """A drafted step that casts no vote (its verdict waits for a measured no-draft
        time): the run of consecutive off votes starts again."""
        self.off_votes = 0

    def vote_back(self, theta_on: Optional[float], theta_off: Optional[float], num_req: int) -> None:
        """While off: come back when drafting (priced on the last known survival) beats the
        no-draft throughput by ``on_margin``."""
        if not self.off or theta_on is None or theta_off is None:
            return
        if self.drafting_wins(theta_on, theta_off) and self.may_switch(num_req):
            self._switch(False, num_req, why="drafting_wins", theta_on=theta_on, theta_off=theta_off)

    def drafting_wins(self, theta_on: float, theta_off: float) -> bool:
        """Drafting's tokens/s ``theta_on`` beats the no-draft ``theta_off`` by ``on_margin``:
        the verdict that brings drafting back on."""
        return float(theta_on) > float(theta_off) * (1.0 + self.config.on_margin)

    def _switch(self, off: bool, num_req: int, *, why: str, theta_on: Optional[float],
                theta_off: Optional[float]) -> None:
        """Switch drafting off (``off``) or on; :attr:`last_switch` records the verdict."""
        self.last_switch = {"to": "no_draft" if off else "drafting", "num_requests": int(num_req), "why": why,
                            "step": sum(self.steps.values()),
                            "drafting_tok_s": None if theta_on is None else round(float(theta_on), 2),
                            "no_draft_tok_s": None if theta_off is None else round(float(theta_off), 2)}
        self.off = bool(off)
        self.since_switch = 0
        self.off_votes = 0
        self.off_steps = 0
        self.redraft_left = 0
        self.redraft_interval = self.config.redraft_every
        self.off_at_requests = int(num_req) if off else 0
        self.switch_at_requests = int(num_req)
        self.switches["off" if off else "on"] += 1

    def summary(self) -> dict:
        return {"state": ("pinned " if self.pinned is not None else "")
                + ("drafting" if (self.pinned if self.pinned is not None else not self.off) else "no_draft"),
                "switches": dict(self.switches), "steps": dict(self.steps),
                "skipped_redrafts": self.skipped_redrafts, "dwell_waived": self.dwell_waived,
                "last_switch": self.last_switch}
