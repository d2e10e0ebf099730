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
import time
from typing import Optional

import numpy as np
from dspark_controller.core.strategies import UniformTimes, learn_step_time
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

import sglang_dspark
from sglang_dspark.penalties import needs_plain_decoding

logger = logging.getLogger(__name__)


class DSparkControlledWorker(DSparkWorkerV2):
    """DSparkWorkerV2 plus live step telemetry and controller-driven budgets."""

    _anchor_commit = None     # no_draft.AnchorCommit, once no-draft steps can run (set in __init__)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._dspark_ready = False
        self._telemetry_time_s = 0.0
        self._telemetry_calls = 0
        self._forced_unlearned = 0
        if not getattr(self, "_hosts_draft", False):
            return
        from sglang_dspark.settings import Settings

        settings = self._settings = Settings.from_env()   # validated at plugin load already
        from sglang_dspark.capture import install as install_capture

        self._capture = install_capture(self, path=settings.capture,
                                        max_rows=settings.capture_max_rows)
        from dspark_controller.core.policy import BudgetPolicy

        from sglang_dspark.budget import AbBudgetPlanner, OnlineBudgetPlanner, policy_config
        from sglang_dspark.link import ControllerLink, local_model_for
        from sglang_dspark.telemetry import NoiseWatch, StepClock, StepStats

        sa = self.server_args
        self._tp_size = int(getattr(sa, "tp_size", 1) or 1)
        self._log_interval = settings.log_interval_s
        self._learn_forced = settings.learn_forced
        self._clock = StepClock(self.device)
        self._gap_prev = None   # (R, drafted, step seconds) of the last timed decode step
        self._stats = StepStats()
        self._noise = NoiseWatch()
        online = settings.online
        seeds = unseeded_sampling_warning(sa)
        if seeds:
            logger.warning("sglang-dspark: %s", seeds)
        if self._tp_size > 1 and online:
            logger.warning("sglang-dspark: tp_size=%d: budgets must agree across TP ranks without a "
                           "collective, so online/controller budgets are off; SGLang's static "
                           "table decides.", self._tp_size)
            online = False
        max_req = int(getattr(sa, "max_running_requests", None) or 48)
        self._local_model = local_model_for(
            max_requests=max_req, max_batch_tokens=max_req * int(self.verify_num_draft_tokens),
            table_path=getattr(sa, "speculative_dspark_sps_table_path", None),
            profile=settings.profile)
        self._link = ControllerLink.from_settings(settings, worker=self) if online else None
        # uniform-path step seconds per R, on the local profile's clock (planner.UniformTimes)
        self._uniform_s = UniformTimes(self._local_model)
        self._policy = BudgetPolicy(
            local_model=self._local_model if online else None,
            config=policy_config(settings),
            latest_decision=self._link.latest_decision if self._link else None,
            enabled=online, uniform_step_time=self._uniform_s.get,
            fleet_model=self._link.fleet_model if self._link else None)
        planner = self._verify_planner
        self._online_planner = None
        self._ab_ledger = None   # SGLANG_DSPARK_AB_ARMS (sglang_dspark.ab): per-arm totals
        self._ab_unlearned = 0
        from sglang_dspark.ab import AbConfig, ArmLedger, ArmRotation

        ab = AbConfig.from_settings(settings)
        if ab is not None and (planner._budget_planner is None or not online):
            raise ValueError("SGLANG_DSPARK_AB_ARMS needs SGLang's budget planner and online planning: "
                             "set SGLANG_RAGGED_VERIFY_MODE=compact (or cap-accept), leave "
                             "SGLANG_DSPARK_ONLINE unset, and run with tp_size 1")
        if planner._budget_planner is not None:
            base = planner._budget_planner
            if ab is None:
                self._online_planner = OnlineBudgetPlanner(base=base, policy=self._policy)
            else:
                self._online_planner = AbBudgetPlanner(base=base, policy=self._policy,
                                                       rotation=ArmRotation(ab.arms, seed=ab.seed))
                self._ab_ledger = ArmLedger(ab.arms)
                logger.warning("sglang-dspark: A/B of verify budgets on (%s): every arm runs in turn, "
                               "which costs throughput; a benchmark/canary setting",
                               ",".join(a.name for a in ab.arms))
            planner._budget_planner = self._online_planner
            if online:
                # our budgets replace SGLang's verify-all (compact mode without an SPS table)
                planner._is_verify_all = False
                _refuse_simulated_acceptance(self._simulate_acc_len, planner)
        self._host_layouts = None   # budget.HostLengthLayouts: no device read of decided lengths
        if self._online_planner is not None and planner.is_compact_mode and online:
            from sglang_dspark.budget import HostLengthLayouts

            self._host_layouts = HostLengthLayouts(planner)
            planner.schedule_layout = self._host_layouts
        self._full_budget_layout = None   # the schedule_layout wrapper, when installed
        if (self._online_planner is not None and planner.is_compact_mode and online
                and _full_budget_static(settings.full_budget_static, self.device)):
            self._full_budget_layout = _FullBudgetStatic(
                planner.schedule_layout, gamma=int(self.verify_num_draft_tokens) - 1)
            planner.schedule_layout = self._full_budget_layout
        from sglang_dspark.metrics import worker_metrics

        self._metrics = worker_metrics(sa)
        self._compact = planner.is_compact_mode
        self._online = online
        # no-draft steps (sglang_dspark.no_draft): the policy's gate, or an A/B ``off`` arm
        self._null_proposer = None
        self._anchor_commit = None
        self._decode_forward = None
        self._plain_step = None     # no_draft.PlainDecodeStep: an off step without SGLang's verify
        self._no_draft_off_reason = ""
        ab_off = ab is not None and any(a.kind == "off" for a in ab.arms)     # an A/B arm of no-draft steps
        if self._online_planner is not None and online:
            from sglang_dspark.no_draft import AnchorCommit, NullProposer, no_draft_refusal

            self._no_draft_off_reason = no_draft_refusal()
            if self._no_draft_off_reason and self._policy.gate is not None:
                logger.warning("sglang-dspark: no-draft steps are off: %s", self._no_draft_off_reason)
                self._policy.gate = None
            if not self._no_draft_off_reason:
                self._null_proposer = NullProposer(self._proposer)
                self._anchor_commit = AnchorCommit(self._verify_executor, self._kv_injector)
                if self._policy.gate is not None or ab_off:
                    # no-draft steps can run: a prompt's rows wait with theirs
                    self._anchor_commit.install_prefill()
                if planner.is_compact_mode:
                    from sglang_dspark.no_draft import DecodeForward

                    self._decode_forward, why = DecodeForward.for_executor(self._verify_executor)
                    if why:
                        logger.info("sglang-dspark: no-draft steps verify one token per request: %s", why)
                    from sglang_dspark.no_draft import PlainDecodeStep

                    self._plain_step, why = PlainDecodeStep.for_worker(self)
                    if why and self._decode_forward is not None:
                        logger.info("sglang-dspark: no-draft steps run inside SGLang's verify: %s", why)
            elif ab_off:
                raise ValueError(f"SGLANG_DSPARK_AB_ARMS has an 'off' arm, but no-draft steps cannot run: "
                                 f"{self._no_draft_off_reason}")
        self._seen_decision_at = 0.0
        self._switches_logged = 0     # gate switches already logged (_log_switch)
        self._observers_list = self._step_observers()
        self._dspark_ready = True
        logger.info("sglang-dspark %s: DSparkControlledWorker active (mode=%s); %s",
                    sglang_dspark.__version__, planner.mode_value, self._who_decides(online))

    def _who_decides(self, online: bool) -> str:
        """The start-up sentence that says which rule chooses verify budgets (it answers
        SGLang's "SPS table is uninitialized" warning when our profile decides)."""
        p = self._online_planner
        if p is None:
            return ("verify budgets: SGLang's own rule (static mode verifies every draft; "
                    "set SGLANG_RAGGED_VERIFY_MODE=compact for scheduled budgets)")
        table = p.has_table
        fallback = "SGLang's SPS table" if table else "verify-all (SGLang has no SPS table)"
        if not online:
            return f"verify budgets: {fallback} (SGLANG_DSPARK_ONLINE is off)"
        who = (f"the controller at {self._link.address}, else this engine's online profile"
               if self._link else "this engine's online step-time profile")
        note = ("" if table else "; SGLang's warning that its SPS table is uninitialized does not "
                "apply: our profile needs no table")
        return (f"verify budgets: {who}, learned from measured steps (until it is ready, "
                f"warm-up steps use {fallback}){note}")

    # ------------------------------------------------------------------ decode step
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, *,
                                 pp_proxy_tensors=None):
        # SGLang's signature; a prefill or extend queues its draft-context rows behind the
        # no-draft steps' pending ones (AnchorCommit.prefill); any other forward but a
        # decode step lands them first (AnchorCommit's rule)
        mode = batch.forward_mode
        if self._anchor_commit is not None and not (mode.is_decode() or mode.is_extend()):
            self._anchor_commit.flush()
        if not mode.is_decode():
            self._gap_prev = None    # the gap after the last decode step holds this forward
        return super().forward_batch_generation(batch, on_publish, grammar_barrier,
                                                pp_proxy_tensors=pp_proxy_tensors)

    def _forward_decode(self, batch, on_publish, grammar_barrier=None, coordination_plan=None):
        # SGLang's signature, every argument forwarded: its DP-attention prefill
        # coordination calls this with coordination_plan= (seams.py checks the signature)
        if not self._dspark_ready or batch.forward_mode.is_idle():
            return super()._forward_decode(batch, on_publish, grammar_barrier,
                                           coordination_plan=coordination_plan)
        planner = self._online_planner
        drafting = True
        if planner is not None and self._null_proposer is not None:
            plain = needs_plain_decoding(batch.sampling_info)   # a sampling penalty (penalties.py)
            drafting = planner.step_draft(len(batch.reqs), plain)
            if drafting and plain and self._policy.gate is not None:
                drafting = False    # SGLang's budget preparation asked before this batch was known
                self._policy.last_draft_reason = "penalties"
        if drafting and self._anchor_commit is not None:
            # the draft reads the context the off steps built; outside this step's clock,
            # so it is priced with the off steps (the gap after them), not this step
            self._anchor_commit.flush()
        self._clock.start()
        self._feed_gap()
        try:
            if drafting:
                result = super()._forward_decode(batch, on_publish, grammar_barrier,
                                                 coordination_plan=coordination_plan)
            else:
                result = self._forward_no_draft(batch, on_publish, grammar_barrier, coordination_plan)
        finally:
            if planner is not None:
                planner.end_step()
        t0 = time.perf_counter()
        self._after_step(batch, result, drafted=drafting)
        self._telemetry_time_s += time.perf_counter() - t0
        self._telemetry_calls += 1
        return result

    def _forward_no_draft(self, batch, on_publish, grammar_barrier, coordination_plan):
        """A decode step with no draft forward (:mod:`sglang_dspark.no_draft`).  Where it
        may (``PlainDecodeStep``: compact mode on an eager CPU target, no grammar, logprobs
        or logits adjustments), plain decoding: SGLang's decode forward and sampler, without
        its verify.  Else SGLang's decode step: the null proposer stands in for this step,
        the budget is 0 (the planner answers 0 for a no-draft step), the target's forward
        is a decode step's on CPU targets (compact mode, ``DecodeForward``), and the
        publish callback drops the placeholder confidences.  Either way the draft-context
        commit keeps the anchors for a batched write (``AnchorCommit``)."""
        from sglang_dspark.no_draft import publish_without_confidence

        commit = self._deferred_commit()
        if commit is not None and commit.pending:
            commit.flush("no-draft step")     # a staged draft-KV write lands before this verify
        if batch.spec_info is not None:
            batch.spec_info.verify_token_budget = 0     # overlap scheduling prepared it already
        if self._plain_step is not None and self._plain_step.usable(batch):
            result = self._plain_step(batch, on_publish)
            if result is not None:
                return result
        proposer, self._proposer = self._proposer, self._null_proposer
        executor = self._verify_executor
        executor.commit_hidden = self._anchor_commit     # this step's commit: the anchors only
        if self._decode_forward is not None:
            executor._run_ragged = self._decode_forward  # the target's forward: a decode step's
        try:
            result = super()._forward_decode(batch, publish_without_confidence(on_publish), grammar_barrier,
                                             coordination_plan=coordination_plan)
        finally:
            self._proposer = proposer
            del executor.commit_hidden
            executor.__dict__.pop("_run_ragged", None)
        return result

    GAP_MAX_STEPS = 4.0   # a longer gap held an idle spell, not per-step work

    def _feed_gap(self) -> None:
        """The scheduler's time between the previous decode step and this one (host-timed
        engines only), priced by the policy per step kind and R (StepGaps).  Not a gap that
        held another forward (a prefill or extend, :meth:`forward_batch_generation` forgets
        the previous step) nor one over ``GAP_MAX_STEPS`` times the step before it."""
        gap, prev = self._clock.gap_s, self._gap_prev
        self._gap_prev = None
        if gap is not None and prev is not None and gap <= self.GAP_MAX_STEPS * prev[2]:
            self._policy.observe_gap(prev[0], prev[1], gap)

    def _step_budget(self):
        """The budget this step ran with: the planner's latest decision, if it made one
        since the previous step (SGLang decides either inside the step or just before)."""
        planner = self._online_planner
        if planner is None or planner.last_decided_at == self._seen_decision_at:
            return None
        self._seen_decision_at = planner.last_decided_at
        return planner.last_budget

    def _after_step(self, batch, result, drafted: bool = True) -> None:
        from sglang_dspark.telemetry import StepRecord

        try:
            num_req = int(len(batch.reqs))
            budget = self._step_budget()
            gamma = int(self.verify_num_draft_tokens) - 1
            if not drafted:
                verify_tokens = num_req if self._compact else num_req * (gamma + 1)
            elif self._compact and budget is not None:
                verify_tokens = num_req + int(budget)
            else:
                verify_tokens = num_req * (gamma + 1)
            seq = batch.seq_lens_cpu.tolist() if batch.seq_lens_cpu is not None else [0]
            uniform = self._full_budget_layout is not None and self._full_budget_layout.last_static
            pred = None
            if not drafted:
                pred = self._policy.off_times.get(num_req)
            elif self._local_model is not None and self._local_model.ready:
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
            rec.drafted = bool(drafted)
            rec.draft_reason = self._policy.last_draft_reason if self._null_proposer is not None else None
            rec.forced = budget is not None and self._policy.last_source == "forced"
            rec.arm = self._online_planner.last_arm if budget is not None else None
            # a plan's step (local, or the controller's priced locally): what it expected
            planned = drafted and budget is not None and self._policy.last_source in ("local", "controller")
            rec.pred_drafts = self._policy.last_pred_drafts if planned else None
            rec.pred_ragged_s = self._policy.last_pred_ragged_s if planned else None
            rec.plan_source = self._policy.last_source if planned else None
            # on the uniform path every draft is verified (cap lens are not per-request there):
            # it calibrates the survival like a ragged step whose windows hold every draft
            if self._compact and drafted:
                if not uniform:
                    rec.verify_lens = self._host(getattr(result, "cap_lens", None))
                if budget is not None and self._online_planner is not None:
                    rec.survival = self._policy.last_survival   # what this step's decision read
            self._policy.last_survival = None
            for done in self._clock.stop(rec):
                self._observe(done)
        except Exception:  # telemetry must never fail a request
            logger.exception("sglang-dspark: step telemetry failed (ignored)")

    def _host(self, t):
        if t is None:
            return None
        return t.to("cpu", non_blocking=True) if t.device.type == "cuda" else t

    def _observe(self, rec) -> None:
        """A finished step (its times known): normalise its lengths, then hand it to each
        of the per-step observers in turn (:meth:`_step_observers`)."""
        if rec.accepted_lens is not None:
            rec.accepted_lens = [max(int(x) - 1, 0) for x in rec.accepted_lens.tolist()]
        if rec.verify_lens is not None:
            lens = rec.verify_lens.tolist()
            rec.verify_tokens = int(sum(lens))
            rec.verify_lens = [max(int(x) - 1, 0) for x in lens]
        for observe in self._observers_list:
            observe(rec)
        rec.survival = None
        self._gap_prev = (rec.num_requests, rec.drafted, rec.step_time_s)

    def _step_observers(self) -> list:
        """The per-step observers, in order; the optional ones are present only when on."""
        obs = [self._feed_policy, self._feed_stats, self._feed_noise]
        if self._ab_ledger is not None:
            obs.append(self._feed_ab)
        obs.append(self._learn)
        if self._policy.gate is not None:
            obs.append(self._log_switch)
        if self._metrics is not None:
            obs.append(self._feed_metrics)
        if self._log_interval > 0:
            obs.append(self._log_state)
        return obs

    def _feed_policy(self, rec) -> None:
        """The policy's calibration and admission gain, or a no-draft step's time (policy
        steps only)."""
        if rec.arm not in (None, "policy"):
            return
        if not rec.drafted:
            self._policy.observe_off_step(rec.num_requests, rec.step_time_s)
        else:
            verified = rec.verify_lens
            if verified is None and rec.uniform and rec.accepted_lens is not None:
                verified = [int(self.verify_num_draft_tokens) - 1] * len(rec.accepted_lens)
            self._policy.observe_step(survival=rec.survival, accepted=rec.accepted_lens,
                                      verified=verified, pred_drafts=rec.pred_drafts, uniform=rec.uniform,
                                      step_s=rec.step_time_s, pred_ragged_s=rec.pred_ragged_s,
                                      source=rec.plan_source)

    def _feed_stats(self, rec) -> None:
        self._stats.add(rec, rec.predicted_step_s)

    def _feed_noise(self, rec) -> None:
        """One warning when step times stop describing the load (telemetry.NoiseWatch);
        no-draft steps are another kind of step, not noise."""
        if not rec.drafted:
            return
        noise = self._noise.observe(num_requests=rec.num_requests, verify_tokens=rec.verify_tokens,
                                    step_s=rec.step_time_s)
        if noise is None and self._stats.steps % 64 == 0:
            noise = self._noise.check_error(predicted_steps=self._stats.predicted_steps,
                                            median_rel_error=self._stats.median_error())
        if noise is not None:
            logger.warning("sglang-dspark: %s", noise)

    def _feed_ab(self, rec) -> None:
        if rec.arm is not None and rec.accepted_lens is not None:
            self._ab_ledger.observe(rec.arm, num_requests=rec.num_requests, step_s=rec.step_time_s,
                                    accepted_drafts=rec.accepted_lens,
                                    verified_drafts=(0 if not rec.drafted else sum(rec.verify_lens)
                                                     if rec.verify_lens is not None
                                                     else rec.num_requests * (int(self.verify_num_draft_tokens) - 1)),
                                    uniform=rec.uniform)

    def _learn(self, rec) -> None:
        """The step time teaches the local profile and the controller, unless the step ran
        an A/B arm other than the policy (measured, never learned: sglang_dspark.ab) or a
        pinned budget with ``SGLANG_DSPARK_LEARN_FORCED=0`` (an experiment on a live server:
        the policy that runs after it is the one that ran before it)."""
        if not rec.drafted:
            return      # its time went to the policy's no-draft times (_feed_policy)
        if rec.arm is not None and rec.arm != "policy":
            self._ab_unlearned += 1
        elif rec.forced and not self._learn_forced:
            self._forced_unlearned += 1
        else:
            # uniform-path steps keep their own per-R time (BudgetPolicy._uniform_if_better) and
            # feed the profile only until it is ready, or it would learn only from exploration
            learn_step_time(self._local_model, self._uniform_s, self._policy, num_req=rec.num_requests,
                            batch_tokens=rec.verify_tokens, step_s=rec.step_time_s, uniform=rec.uniform)
            if self._link is not None:
                self._link.publish(rec)

    def _feed_metrics(self, rec) -> None:
        self._metrics.observe(rec, sources=self._policy.sources,
                              link_state=self._link.client.link_state if self._link else None,
                              switches=None if self._policy.gate is None else self._policy.gate.switches)

    def _log_switch(self, rec) -> None:
        """One log line per switch of the drafting gate: where, why, the two prices it
        weighed, and how much the policy had measured (the profile's steps, this load's
        no-draft samples).  The gate's hysteresis bounds how often it fires."""
        gate = self._policy.gate
        n = sum(gate.switches.values())
        if n == self._switches_logged:
            return
        self._switches_logged = n
        sw = gate.last_switch or {}
        r = int(sw.get("num_requests", 0))
        logger.info("sglang-dspark: drafting %s at %d requests (%s, step %s): drafting %s tok/s, no-draft %s tok/s; "
                    "profile %d steps, %d no-draft samples at this load",
                    "off" if sw.get("to") == "no_draft" else "on", r, sw.get("why"), sw.get("step"),
                    *("n/a" if sw.get(k) is None else sw[k] for k in ("drafting_tok_s", "no_draft_tok_s")),
                    int(getattr(self._local_model, "steps", 0) or 0), self._policy.off_times.fresh_samples(r))

    def _log_state(self, rec) -> None:
        now = time.monotonic()
        if now - self._stats.last_log >= self._log_interval:
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
                "online": self._online,
                "budget_sources": dict(self._policy.sources),
                "boundary_checks": self._policy.boundary_checks,
                "admission": None if self._policy.admission is None else self._policy.admission.summary(),
                "ragged_time": None if self._policy.ragged_time is None else self._policy.ragged_time.summary(),
                "forced_steps_not_learned": self._forced_unlearned,
                "ab": None if self._ab_ledger is None else {
                    "arms": list(self._ab_ledger.totals), "totals": self._ab_ledger.snapshot(),
                    "steps_not_learned": self._ab_unlearned},
                "last_budget_source": self._policy.last_source,
                "telemetry": self._stats.summary(),
                "noise_warnings": dict(self._noise.warned),
                "local_profile": None if model is None else {
                    "ready": model.ready, "samples": model.steps,
                    "heldout_error": model.heldout_error().to_dict() if model.steps else None,
                    "prior": model.prior_description,
                    "curve_at_last_load": self._curve_at_last_load()},
                "controller": None if self._link is None else self._link.state(),
                "host_overhead": self._overhead(),
                "full_budget_static_steps": (None if self._full_budget_layout is None
                                             else self._full_budget_layout.static_steps),
                "host_layouts": None if self._host_layouts is None else self._host_layouts.summary(),
                "survival_calibration": (None if self._policy.calibrator is None
                                         else self._policy.calibrator.summary()),
                # planned rows whose relayed confidences were not the request's own yet
                # (budget.RelayedRows: planned on what the policy knows instead)
                "survival_unknown_rows": (None if self._online_planner is None
                                          else self._online_planner.relayed.unknown_rows),
                "no_draft": self._no_draft_state(),
            })
        return state

    def set_dspark_draft_pin(self, pin: Optional[bool]) -> None:
        """The operator's runtime switch (``/set_internal_state`` key ``dspark_draft``,
        :mod:`sglang_dspark.internal_state`): True drafts every step, False runs no-draft
        steps only, None lifts the pin (the policy's gate decides again).  Call
        :meth:`draft_pin_refusal` first."""
        why = self.draft_pin_refusal()
        if why:
            raise ValueError(why)
        self._policy.operator_pin = pin
        logger.info("sglang-dspark: drafting %s by the operator",
                    "lifted: the policy decides" if pin is None else ("pinned on" if pin else "pinned off"))

    def draft_pin_refusal(self) -> str:
        """Why the operator cannot pin drafting on this server, or ""."""
        if not getattr(self, "_dspark_ready", False) or getattr(self, "_null_proposer", None) is None:
            return ("no-draft steps are unavailable on this server: "
                    + (getattr(self, "_no_draft_off_reason", "") or "they need online planning (tp_size 1) "
                       "in compact or cap-accept mode (SGLANG_RAGGED_VERIFY_MODE)"))
        if self._policy.gate is None:
            return "no-draft steps are off on this server (SGLANG_DSPARK_NO_DRAFT=0)"
        return ""

    def _no_draft_state(self) -> dict:
        """No-draft steps: how many ran, the gate's state and switches, and the measured
        no-draft step time next to the drafted plan's at the latest load."""
        pol, last = self._policy, self._stats.last_record
        commit, null = self._anchor_commit, self._null_proposer
        plain = self._plain_step
        state = {"steps": (0 if null is None else null.steps) + (0 if plain is None else plain.steps),
                 # of them, run as plain decoding (PlainDecodeStep; None: that route is off)
                 "plain_decode_steps": None if plain is None else plain.steps,
                 "off_probes": pol.off_probes,
                 "operator_pin": pol.operator_pin, "last_reason": pol.last_draft_reason,
                 "anchor_only_commits": None if commit is None else commit.steps,
                 "anchor_commit_flushes": None if commit is None else commit.flushes,
                 "prefill_commits_batched": None if commit is None else commit.prefills,
                 "decode_forwards": None if self._decode_forward is None else self._decode_forward.steps,
                 "decode_forward_dropped": None if self._decode_forward is None else (self._decode_forward.dropped or None),
                 "gate": None if pol.gate is None else pol.gate.summary(),
                 "unavailable": self._no_draft_off_reason or None}
        if last is not None and last.num_requests:
            r = int(last.num_requests)
            t = pol.off_times.get(r)
            theta_on = pol.known_theta(r)
            theta_off = pol.off_throughput(r)
            # tokens/s per period: a step plus the scheduler's gap after it (what the gate compares)
            state["at_last_load"] = {"num_requests": r,
                                     "no_draft_step_ms": None if t is None else round(1e3 * t, 3),
                                     "no_draft_tok_s": None if theta_off is None else round(theta_off, 2),
                                     "drafting_tok_s": None if theta_on is None else round(theta_on, 2),
                                     "gap_ms": {"drafted": round(1e3 * pol.step_gaps.get(r, drafted=True), 3),
                                                "no_draft": round(1e3 * pol.step_gaps.get(r, drafted=False), 3)}}
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
        dumped = dict(super().dump_info_records() or {})
        try:
            dumped["sglang_dspark"] = self.plugin_state()
        except Exception as exc:  # a status read must never take the scheduler down
            logger.exception("sglang-dspark: plugin state for /server_info failed (reported there)")
            dumped["sglang_dspark"] = {"error": f"{type(exc).__name__}: {exc}"}
        # the whole record: SGLang's per-step records carry our decisions' predictions too,
        # and /server_info must never fail on a non-finite float
        return _json_safe(dumped)


def unseeded_sampling_warning(server_args) -> str:
    """What a server with ``--enable-deterministic-inference`` should be told, or "": SGLang
    0.5.23's DSpark verify samples (rejection, bonus tokens) without the per-request seeds
    that make plain decoding's sampled output reproducible (``sampling_seed``)."""
    if not getattr(server_args, "enable_deterministic_inference", False):
        return ""
    return ("--enable-deterministic-inference: DSPARK's verify samples without per-request "
            "seeds (sampling_params.sampling_seed), so a sampled request's output is not "
            "reproducible run to run as it is without speculation; greedy requests are "
            "unaffected. Drop --speculative-algorithm DSPARK where seeded sampling must repeat.")


def _refuse_simulated_acceptance(simulate_acc_len: float, planner) -> None:
    """SGLang's start-up guard against simulated acceptance with trimmed budgets
    (``DSparkWorkerV2.__init__``: ``SGLANG_SIMULATE_ACC_LEN`` other than 0 and 1.0 needs a
    verify-all schedule), applied again after our flip of ``planner._is_verify_all``:
    SGLang ran it inside ``super().__init__``, while the planner still verified all."""
    acc = float(simulate_acc_len)
    if acc > 0 and acc != 1.0 and not planner.is_verify_all:
        raise ValueError(
            f"SGLANG_SIMULATE_ACC_LEN={acc} needs a verify-all schedule, and sglang-dspark's "
            f"online budgets trim verify windows (mode={planner.mode_value!r}): a constant "
            "simulated correct_len can exceed a trimmed request's budget and break SGLang's "
            "cutoff/cap accounting. Set SGLANG_DSPARK_ONLINE=0 (SGLang's verify-all), or "
            "SGLANG_RAGGED_VERIFY_MODE=static, or SGLANG_SIMULATE_ACC_LEN=1.0 (safe in any mode).")


def _full_budget_static(setting: Optional[bool], device) -> bool:
    """``SGLANG_DSPARK_FULL_BUDGET_STATIC`` (None = auto): on for CPU devices, off
    elsewhere until a GPU measurement says so (docs/worker.md: the A/B behind it)."""
    import torch

    return torch.device(device).type == "cpu" if setting is None else bool(setting)


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
