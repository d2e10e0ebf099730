"""Measuring decode steps without stalling them.

:class:`StepClock` times a step the way the device sees it: on CUDA with a pair of
events whose elapsed time is read on a *later* step once ``query()`` says they are
done (never a synchronize in the decode loop); on CPU with ``perf_counter`` (the
step's work is synchronous there).  :class:`StepStats` keeps bounded rolling
summaries for ``/server_info`` and the periodic log line.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class StepRecord:
    num_requests: int
    verify_tokens: int
    budget_tokens: Optional[int]
    accepted_lens: Optional[list]
    verify_lens: Optional[list]
    context_min: int
    context_mean: float
    context_max: int
    predicted_step_s: Optional[float]
    step_time_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    # the planner's raw lagged survival [R, gamma] for this step (local use only, never sent)
    survival: Optional[object] = None
    # ran on SGLang's uniform verify path (a full-budget step, SGLANG_DSPARK_FULL_BUDGET_STATIC)
    uniform: bool = False
    # the operator pinned the budget (dspark_force_budget_frac) for this step
    forced: bool = False
    # the A/B arm this step ran (SGLANG_DSPARK_AB_ARMS; None: no A/B or no budget decision)
    arm: Optional[str] = None
    # the plan's expected accepted drafts (None: neither a local nor a controller-planned step)
    pred_drafts: Optional[float] = None
    # a ragged plan's predicted step seconds on the local profile (RaggedTime; None: not one)
    pred_ragged_s: Optional[float] = None
    # who planned the step: local | controller (None: no plan; BudgetPolicy.observe_step)
    plan_source: Optional[str] = None
    # False: a no-draft step (sglang_dspark.no_draft): no draft forward, one token per request
    drafted: bool = True
    # who chose drafting or not: gate | redraft | probe | operator | controller (None: no gate)
    draft_reason: Optional[str] = None


class StepClock:
    """A decode step's time: host clock on CPU, device events on CUDA.  On the host clock
    it also measures :attr:`gap_s`, the time from the previous step's stop to this step's
    start (the scheduler's work between steps; None on CUDA, where that work overlaps
    the device's, and before a first step)."""

    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._pending: deque = deque()
        self._t0 = 0.0
        self._events = None
        self._last_stop: Optional[float] = None
        self.gap_s: Optional[float] = None

    def start(self) -> None:
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            self._events = (s, e)
        else:
            self._t0 = time.perf_counter()
            self.gap_s = None if self._last_stop is None else self._t0 - self._last_stop

    def stop(self, record: StepRecord) -> list[StepRecord]:
        """Finish timing ``record``; return every record whose time is now known."""
        if not self.cuda:
            self._last_stop = time.perf_counter()
            record.step_time_s = self._last_stop - self._t0
            return [record]
        s, e = self._events
        e.record()
        self._pending.append((s, e, record))
        done = []
        while self._pending and self._pending[0][1].query():
            s0, e0, rec = self._pending.popleft()
            rec.step_time_s = s0.elapsed_time(e0) / 1000.0
            done.append(rec)
        while len(self._pending) > 64:  # never grow without bound
            self._pending.popleft()
        return done


class StepStats:
    def __init__(self, window: int = 256) -> None:
        self.steps = 0
        self.predicted_steps = 0        # steps that had a profile prediction
        self._recent: deque = deque(maxlen=window)
        self.last_log = 0.0

    @property
    def last_record(self) -> Optional[StepRecord]:
        return self._recent[-1][0] if self._recent else None

    def add(self, rec: StepRecord, model_pred: Optional[float]) -> None:
        self.steps += 1
        err = None
        if model_pred is not None and model_pred > 0 and rec.step_time_s > 0:
            err = abs(model_pred - rec.step_time_s) / rec.step_time_s
            self.predicted_steps += 1
        self._recent.append((rec, err))

    def median_error(self) -> Optional[float]:
        """Median relative error (a fraction) of the recent window's predicted steps."""
        errs = sorted(e for _, e in self._recent if e is not None)
        return errs[len(errs) // 2] if errs else None

    def summary(self) -> dict:
        recs = [r for r, _ in self._recent]
        err = self.median_error()
        if not recs:
            return {"steps": self.steps}
        acc = [sum(r.accepted_lens) / len(r.accepted_lens) for r in recs if r.accepted_lens]
        bud = [r.budget_tokens / (r.num_requests or 1) for r in recs if r.budget_tokens is not None]
        return {
            "steps": self.steps,
            "window": len(recs),
            "mean_running_requests": round(sum(r.num_requests for r in recs) / len(recs), 3),
            "mean_verify_tokens": round(sum(r.verify_tokens for r in recs) / len(recs), 3),
            "mean_budget_per_request": round(sum(bud) / len(bud), 3) if bud else None,
            "mean_accepted_drafts": round(sum(acc) / len(acc), 3) if acc else None,
            "mean_step_ms": round(1000 * sum(r.step_time_s for r in recs) / len(recs), 3),
            "profile_rel_error_median": round(err, 4) if err is not None else None,
        }


class NoiseWatch:
    """Warns once when step times stop describing this engine's load.

    Two rules, each logged at most once per process:

    * **bimodal**: among the last ``window`` steps of one shape (request count, verify
      tokens), once ``min_samples`` are seen, the 90th percentile exceeds ``spread`` times
      the 10th;
    * **unexplained**: after ``min_steps`` predicted steps, the median relative error of the
      profile's prediction over the recent window stays above ``max_error`` (a fraction).

    Either usually means another busy process shares these cores (on CPU SGLang pins its
    OpenMP threads to cores 0..n-1, so two servers on one small machine slow each other by
    up to 100x on small ops); the profile then learns noise."""

    HINT = ("another busy process probably shares these cores (on CPU, SGLang pins its OpenMP "
            "threads to cores 0..n-1: run one SGLang server per set of cores, or pin them apart "
            "with taskset); budgets learned from such steps are noise")

    def __init__(self, *, window: int = 64, min_samples: int = 32, spread: float = 3.0,
                 min_steps: int = 512, max_error: float = 0.5) -> None:
        self.window, self.min_samples, self.spread = window, min_samples, spread
        self.min_steps, self.max_error = min_steps, max_error
        self._by_shape: dict = {}
        self.warned: dict = {}          # rule -> the message it logged

    def observe(self, *, num_requests: int, verify_tokens: int, step_s: float) -> Optional[str]:
        """Add a step; returns the bimodal warning the first time the rule fires."""
        if "bimodal" in self.warned or step_s <= 0:
            return None
        q = self._by_shape.setdefault((int(num_requests), int(verify_tokens)), deque(maxlen=self.window))
        q.append(float(step_s))
        if len(q) < self.min_samples:
            return None
        xs = sorted(q)
        p10, p90 = xs[len(xs) // 10], xs[(9 * len(xs)) // 10]
        if p90 <= self.spread * p10:
            return None
        msg = (f"step times are bimodal: at {num_requests} requests and {verify_tokens} verify "
               f"tokens the 90th percentile is {p90 / p10:.1f}x the 10th ({1e3 * p10:.2f} vs "
               f"{1e3 * p90:.2f} ms over {len(xs)} steps); {self.HINT}")
        self.warned["bimodal"] = msg
        return msg

    def check_error(self, *, predicted_steps: int, median_rel_error: Optional[float]) -> Optional[str]:
        """The unexplained-error rule; returns its warning the first time it fires."""
        if ("unexplained" in self.warned or median_rel_error is None
                or predicted_steps < self.min_steps or median_rel_error <= self.max_error):
            return None
        msg = (f"the step-time profile's median prediction error is {100 * median_rel_error:.0f}% "
               f"after {predicted_steps} steps (a well-measured engine stays under "
               f"{100 * self.max_error:.0f}%); {self.HINT}")
        self.warned["unexplained"] = msg
        return msg
