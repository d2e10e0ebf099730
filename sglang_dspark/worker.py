"""Our DSpark worker: SGLang's DSparkWorkerV2, extended (never copied).

Installed through ``HookRegistry`` (class REPLACE of ``DSparkWorkerV2``, see
:mod:`sglang_dspark.seams`), so ``--speculative-algorithm DSPARK`` runs it on every
device.  On top of SGLang's worker it

* measures every decode step (:mod:`sglang_dspark.telemetry`) and feeds a local
  online SPS model, so budgets beat verify-all at load with no table and no
  controller (:mod:`sglang_dspark.budget`);
* streams telemetry to the controller and applies its decisions when
  ``SGLANG_DSPARK_CONTROLLER`` is set (:mod:`sglang_dspark.link`), falling back to
  the local model when the controller is away or its decision is stale;
* reports its state in ``/server_info`` (``internal_states[0].dspark_info_record
  .sglang_dspark``) and in a log line at most every ``SGLANG_DSPARK_LOG_INTERVAL_S``.

Environment (all optional): ``SGLANG_DSPARK_ONLINE=0`` disables local online
planning; ``SGLANG_DSPARK_PROFILE=FILE`` seeds the local model from a profile file;
see :mod:`sglang_dspark.link` for the controller variables.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

import numpy as np
from dspark_controller.planner import AdmissionGain, UniformTimes, learn_step_time
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

import sglang_dspark

logger = logging.getLogger(__name__)


_ON, _OFF = ("1", "true", "on"), ("0", "false", "off")


def _env_switch(name: str, default: Optional[bool], *, auto: bool = False) -> Optional[bool]:
    """An on/off environment variable: 1|true|on, 0|false|off, or (``auto``) the word
    ``auto`` -> None; unset -> ``default``."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    if auto and v == "auto":
        return None
    raise ValueError(f"{name} must be 1, 0{' or auto' if auto else ''}, got {raw!r}")


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        raise ValueError(f"{name} must be a number, got {os.environ.get(name)!r}") from None


class DSparkControlledWorker(DSparkWorkerV2):
    """DSparkWorkerV2 plus live step telemetry and controller-driven budgets."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._dspark_ready = False
        self._telemetry_time_s = 0.0
        self._telemetry_calls = 0
        self._forced_unlearned = 0
        if not getattr(self, "_hosts_draft", False):
            return
        from sglang_dspark.capture import install as install_capture  # SGLANG_DSPARK_CAPTURE
        self._capture = install_capture(self)
        from sglang_dspark.budget import BudgetBrain, BudgetConfig, OnlineBudgetPlanner
        from sglang_dspark.link import ControllerLink, local_model_for
        from sglang_dspark.telemetry import StepClock, StepStats

        sa = self.server_args
        self._tp_size = int(getattr(sa, "tp_size", 1) or 1)
        self._log_interval = _env_float("SGLANG_DSPARK_LOG_INTERVAL_S", 30.0)
        self._learn_forced = _env_switch("SGLANG_DSPARK_LEARN_FORCED", True)
        self._clock = StepClock(self.device)
        self._stats = StepStats()
        online = os.environ.get("SGLANG_DSPARK_ONLINE", "1") != "0"
        if self._tp_size > 1 and online:
            logger.warning("sglang-dspark: tp_size=%d: budgets must agree across TP ranks without a "
                           "collective, so online/controller budgets are off; SGLang's static "
                           "table decides.", self._tp_size)
            online = False
        max_req = int(getattr(sa, "max_running_requests", None) or 48)
        self._local_model = local_model_for(
            max_requests=max_req, max_batch_tokens=max_req * int(self.verify_num_draft_tokens),
            table_path=getattr(sa, "speculative_dspark_sps_table_path", None))
        self._link = ControllerLink.from_env(worker=self) if online else None
        # uniform-path step seconds per R, on the local profile's clock (planner.UniformTimes)
        self._uniform_s = UniformTimes(self._local_model)
        self._brain = BudgetBrain(
            local_model=self._local_model if online else None,
            config=BudgetConfig.from_env(),
            latest_decision=self._link.latest_decision if self._link else None,
            enabled=online, uniform_step_time=self._uniform_s.get,
            fleet_model=self._link.fleet_model if self._link else None,
            admission=AdmissionGain())
        planner = self._verify_planner
        self._online_planner = None
        self._ab_ledger = None   # SGLANG_DSPARK_AB_ARMS (sglang_dspark.ab): per-arm totals
        self._ab_unlearned = 0
        from sglang_dspark.ab import AbConfig, ArmLedger, ArmRotation

        ab = AbConfig.from_env()
        if ab is not None and (planner._budget_planner is None or not online):
            raise ValueError("SGLANG_DSPARK_AB_ARMS needs SGLang's budget planner and online planning: "
                             "set SGLANG_RAGGED_VERIFY_MODE=compact (or cap-accept), leave "
                             "SGLANG_DSPARK_ONLINE unset, and run with tp_size 1")
        if planner._budget_planner is not None:
            rotation = None
            if ab is not None:
                rotation = ArmRotation(ab.arms, seed=ab.seed)
                self._ab_ledger = ArmLedger(ab.arms)
                logger.warning("sglang-dspark: A/B of verify budgets on (%s): every arm runs in turn, "
                               "which costs throughput; a benchmark/canary setting",
                               ",".join(a.name for a in ab.arms))
            self._online_planner = OnlineBudgetPlanner(base=planner._budget_planner, brain=self._brain,
                                                       rotation=rotation)
            planner._budget_planner = self._online_planner
            if online:
                planner._is_verify_all = False
        self._full_budget_layout = None   # the schedule_layout wrapper, when installed
        if (self._online_planner is not None and planner.is_compact_mode and online
                and _full_budget_static_default(self.device)):
            self._full_budget_layout = _FullBudgetStatic(
                planner.schedule_layout, gamma=int(self.verify_num_draft_tokens) - 1)
            planner.schedule_layout = self._full_budget_layout
        from sglang_dspark.metrics import worker_metrics

        self._metrics = worker_metrics(sa)
        self._compact = planner.is_compact_mode
        self._seen_decision_at = 0.0
        self._dspark_ready = True
        logger.info("sglang-dspark %s: DSparkControlledWorker active (mode=%s, online=%s, "
                    "controller=%s)", sglang_dspark.__version__, planner.mode_value, online,
                    self._link.address if self._link else None)

    # ------------------------------------------------------------------ decode step
    def _forward_decode(self, batch, on_publish, grammar_barrier):
        if not self._dspark_ready or batch.forward_mode.is_idle():
            return super()._forward_decode(batch, on_publish, grammar_barrier)
        self._clock.start()
        result = super()._forward_decode(batch, on_publish, grammar_barrier)
        t0 = time.perf_counter()
        self._after_step(batch, result)
        self._telemetry_time_s += time.perf_counter() - t0
        self._telemetry_calls += 1
        return result

    def _step_budget(self):
        """The budget this step ran with: the planner's latest decision, if it made one
        since the previous step (SGLang decides either inside the step or just before)."""
        planner = self._online_planner
        if planner is None or planner.last_decided_at == self._seen_decision_at:
            return None
        self._seen_decision_at = planner.last_decided_at
        return planner.last_budget

    def _after_step(self, batch, result) -> None:
        from sglang_dspark.telemetry import StepRecord

        try:
            num_req = int(len(batch.reqs))
            budget = self._step_budget()
            gamma = int(self.verify_num_draft_tokens) - 1
            if self._compact and budget is not None:
                verify_tokens = num_req + int(budget)
            else:
                verify_tokens = num_req * (gamma + 1)
            seq = batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else [0]
            uniform = self._full_budget_layout is not None and self._full_budget_layout.last_static
            pred = None
            if self._local_model is not None and self._local_model.ready:
                # a uniform-path step is predicted by its own per-R time, as the planner
                # prices it (the ragged profile does not describe that layout)
                pred = self._uniform_s.get(num_req) if uniform else None
                if pred is None:
                    pred = float(self._local_model.predict_step_time(num_req, verify_tokens))
            rec = StepRecord(num_requests=num_req, verify_tokens=verify_tokens,
                             budget_tokens=budget, accepted_lens=None, verify_lens=None,
                             context_min=int(min(seq)), context_mean=float(sum(seq) / len(seq)),
                             context_max=int(max(seq)),
                             predicted_step_s=pred if pred == pred else None)
            # commit lens include the bonus token; cap lens include the anchor.  On GPU
            # the copies are queued before the step's end event and read once it fired.
            rec.accepted_lens = self._host(getattr(result, "accept_lens", None))
            rec.uniform = bool(uniform)
            rec.forced = budget is not None and self._brain.last_source == "forced"
            rec.arm = self._online_planner.last_arm if budget is not None else None
            rec.pred_drafts = (self._brain.last_pred_drafts
                               if budget is not None and self._brain.last_source == "local" else None)
            # on the uniform path every draft is verified (cap lens are not per-request there)
            if self._compact and not uniform:
                rec.verify_lens = self._host(getattr(result, "cap_lens", None))
                if budget is not None and self._online_planner is not None:
                    rec.survival = self._online_planner.last_survival
                    self._online_planner.last_survival = None
            for done in self._clock.stop(rec):
                self._observe(done)
        except Exception:  # telemetry must never fail a request
            logger.exception("sglang-dspark: step telemetry failed (ignored)")

    def _host(self, t):
        if t is None:
            return None
        return t.to("cpu", non_blocking=True) if t.device.type == "cuda" else t

    def _observe(self, rec) -> None:
        if rec.accepted_lens is not None:
            rec.accepted_lens = [max(int(x) - 1, 0) for x in rec.accepted_lens.tolist()]
        if rec.verify_lens is not None:
            lens = rec.verify_lens.tolist()
            rec.verify_tokens = int(sum(lens))
            rec.verify_lens = [max(int(x) - 1, 0) for x in lens]
        if (rec.survival is not None and rec.accepted_lens is not None and rec.verify_lens is not None
                and self._online_planner is not None and self._online_planner.calibrator is not None):
            self._online_planner.calibrator.observe(rec.survival, rec.accepted_lens, rec.verify_lens)
        rec.survival = None
        self._stats.add(rec, rec.predicted_step_s)
        if self._ab_ledger is not None and rec.arm is not None and rec.accepted_lens is not None:
            self._ab_ledger.observe(rec.arm, num_requests=rec.num_requests, step_s=rec.step_time_s,
                                    accepted_drafts=rec.accepted_lens,
                                    verified_drafts=(sum(rec.verify_lens) if rec.verify_lens is not None
                                                     else rec.num_requests * (int(self.verify_num_draft_tokens) - 1)),
                                    uniform=rec.uniform)
        if (rec.pred_drafts is not None and rec.accepted_lens is not None and self._brain.admission is not None
                and rec.arm in (None, "policy")):
            self._brain.admission.observe(rec.pred_drafts, float(sum(rec.accepted_lens)), uniform=rec.uniform)
        if rec.arm is not None and rec.arm != "policy":
            # an A/B arm other than the server's policy: measured, never learned (sglang_dspark.ab)
            self._ab_unlearned += 1
        elif rec.forced and not self._learn_forced:
            # SGLANG_DSPARK_LEARN_FORCED=0: a pinned budget is an experiment on a live server
            # (the benchmark's fixed budgets); it teaches neither the local profile nor the
            # controller, so the policy that runs after it is the one that ran before it
            self._forced_unlearned += 1
        else:
            # uniform-path steps keep their own per-R time (BudgetBrain._uniform_if_better) and
            # feed the profile only until it is ready, or it would learn only from exploration
            learn_step_time(self._local_model, self._uniform_s, self._brain, num_req=rec.num_requests,
                            batch_tokens=rec.verify_tokens, step_s=rec.step_time_s, uniform=rec.uniform)
            if self._link is not None:
                self._link.publish(rec)
        if self._metrics is not None:
            self._metrics.observe(rec, sources=self._brain.sources,
                                  link_state=self._link.client.link_state if self._link else None)
        now = time.monotonic()
        if self._log_interval > 0 and now - self._stats.last_log >= self._log_interval:
            self._stats.last_log = now
            logger.info("sglang-dspark: %s", self.plugin_state())

    # ------------------------------------------------------------------ observability
    def plugin_state(self) -> dict:
        from sglang_dspark.seq_head import last_backend

        state = {"worker": f"{type(self).__module__}.{type(self).__qualname__}",
                 "version": sglang_dspark.__version__,
                 "seq_head_backend": last_backend()}
        if getattr(self, "_dspark_ready", False):
            model = self._local_model
            state.update({
                "budget_sources": dict(self._brain.sources),
                "boundary_checks": self._brain.boundary_checks,
                "admission": None if self._brain.admission is None else self._brain.admission.summary(),
                "forced_steps_not_learned": self._forced_unlearned,
                "ab": None if self._ab_ledger is None else {
                    "arms": list(self._ab_ledger.totals), "totals": self._ab_ledger.snapshot(),
                    "steps_not_learned": self._ab_unlearned},
                "last_budget_source": self._brain.last_source,
                "telemetry": self._stats.summary(),
                "local_profile": None if model is None else {
                    "ready": model.ready, "samples": model.steps,
                    "heldout_error": model.heldout_error().to_dict() if model.steps else None,
                    "prior": model.prior_description,
                    "curve_at_last_load": self._curve_at_last_load()},
                "controller": None if self._link is None else self._link.state(),
                "host_overhead": self._overhead(),
                "full_budget_static_steps": (None if self._full_budget_layout is None
                                             else self._full_budget_layout.static_steps),
                "survival_calibration": (None if self._online_planner is None
                                         or self._online_planner.calibrator is None
                                         else self._online_planner.calibrator.summary()),
            })
        return state

    def _curve_at_last_load(self) -> Optional[dict]:
        """The local profile's predicted step time at the latest step's request count, for
        budgets of 0, 1/4, ... all of the draft tokens, and the uniform path's measured time:
        what the planner trades against."""
        model, last = self._local_model, self._stats.last_record
        if model is None or not model.ready or last is None or not last.num_requests:
            return None
        r, gamma = int(last.num_requests), int(self.verify_num_draft_tokens) - 1
        bs = [r + (r * gamma * q) // 4 for q in range(5)]
        u = self._uniform_s.get(r)
        return {"num_requests": r, "batch_tokens": bs,
                "predicted_step_ms": [round(1e3 * float(model.predict_step_time(r, b)), 3) for b in bs],
                # a full budget on SGLang's uniform path, measured (None: not seen at this R)
                "uniform_step_ms": None if u is None else round(1e3 * float(u), 3)}

    def _overhead(self) -> dict:
        """Mean host time per decode step spent in our code: the budget planning call
        (SGLang's lag shift + survival + our decision, or SGLang's table when online
        planning is off) and the step telemetry (record, local model update, publish)."""
        p = self._online_planner
        plan_n = p.plan_calls if p is not None else 0
        return {"plan_calls": plan_n,
                "plan_us_mean": round(1e6 * p.plan_time_s / plan_n, 2) if plan_n else None,
                "plan_us_p50": (round(1e6 * float(np.median(p.recent_plan_s)), 2)
                                if p is not None and p.recent_plan_s else None),
                "plan_us_by_phase": ({k: round(1e6 * v / plan_n, 2) for k, v in p.phase_time_s.items()}
                                     if plan_n else None),
                "telemetry_calls": self._telemetry_calls,
                "telemetry_us_mean": (round(1e6 * self._telemetry_time_s / self._telemetry_calls, 2)
                                      if self._telemetry_calls else None)}

    def dump_info_records(self):
        dumped = super().dump_info_records() or {}
        dumped["sglang_dspark"] = _json_safe(self.plugin_state())
        return dumped


def _full_budget_static_default(device) -> bool:
    """``SGLANG_DSPARK_FULL_BUDGET_STATIC``: 1 | 0 | auto (default auto: on for CPU devices,
    where the interleaved benchmark measured it faster at every level; off elsewhere until
    a GPU measurement says so)."""
    import torch

    v = _env_switch("SGLANG_DSPARK_FULL_BUDGET_STATIC", None, auto=True)
    if v is not None:
        return v
    return torch.device(device).type == "cpu"   # docs/worker.md: the A/B behind this default


class _FullBudgetStatic:
    """Wraps the verify planner's ``schedule_layout``: a step whose budget verifies every
    draft token gets no ragged layout, so SGLang runs it on its uniform (static) verify
    path, as it already does in compact mode when a layout exceeds the captured grid.  On
    CPU that path is cheaper than a full ragged layout (~11% at one request, ~8% at
    16-32).  Same tokens verified, same acceptance rule."""

    def __init__(self, inner, *, gamma: int) -> None:
        self.inner = inner
        self.gamma = int(gamma)
        self.static_steps = 0
        self.last_static = False

    def __call__(self, **kw):
        self.last_static = False
        budget = kw.get("budget")
        rows = kw.get("req_pool_indices")
        if (budget is not None and rows is not None and kw.get("dp_tier_num_tokens") is None
                and kw.get("global_num_reqs") in (None, int(rows.shape[0]))
                and int(budget) >= int(rows.shape[0]) * self.gamma):
            self.static_steps += 1
            self.last_static = True
            return None
        return self.inner(**kw)


def _json_safe(obj):
    """NaN/inf -> None: /server_info is JSON and must never fail because of us."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj
