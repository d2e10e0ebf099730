"""Prometheus metrics from the worker, served by SGLang's own ``/metrics``.

SGLang runs prometheus_client in multiprocess mode when started with
``--enable-metrics``; metrics created in the scheduler process land in the same
``PROMETHEUS_MULTIPROC_DIR`` and appear on ``/metrics`` next to ``sglang:*``.
Without ``--enable-metrics`` nothing is created.
"""

from __future__ import annotations

from typing import Optional


class WorkerMetrics:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        g = dict(multiprocess_mode="mostrecent")
        self.budget = Gauge("sglang_dspark:verify_budget_tokens",
                            "Draft-token verify budget K of the latest decode step", **g)
        self.verify_tokens = Gauge("sglang_dspark:verify_tokens",
                                   "Tokens verified in the latest decode step (anchors + K)", **g)
        self.running = Gauge("sglang_dspark:running_requests",
                             "Requests in the latest decode step", **g)
        self.accepted = Gauge("sglang_dspark:accepted_drafts_mean",
                              "Mean accepted draft tokens per request, latest step", **g)
        self.step_seconds = Gauge("sglang_dspark:step_seconds", "Latest decode step time", **g)
        self.profile_error = Gauge("sglang_dspark:profile_rel_error",
                                   "Relative error of the profile's prediction, latest step (a fraction: 0.05 = 5%)", **g)
        self.controller_connected = Gauge("sglang_dspark:controller_connected",
                                          "1 if the controller link is connected", **g)
        self.decisions = Counter("sglang_dspark:budget_decisions",
                                 "Budget decisions by source", ["source"])
        self.drafting = Gauge("sglang_dspark:drafting",
                              "1 if the latest decode step drafted, 0 if it was a no-draft step", **g)
        self.no_draft_steps = Counter("sglang_dspark:no_draft_steps",
                                      "No-draft decode steps by reason (gate, probe, operator, controller, penalties, ab)",
                                      ["reason"])
        self.no_draft_seconds = Counter("sglang_dspark:no_draft_step_seconds",
                                        "Measured seconds of no-draft decode steps")
        self.no_draft_predicted_seconds = Counter(
            "sglang_dspark:no_draft_step_predicted_seconds",
            "Predicted seconds of the no-draft steps that had a prediction (the policy's per-R times)")
        self.switches = Counter("sglang_dspark:draft_gate_switches",
                                "Drafting switched off / on by the policy's gate", ["to"])
        self._seen: dict[str, int] = {}
        self._seen_switches: dict[str, int] = {}

    def observe(self, rec, *, sources: dict, link_state: Optional[str], switches: Optional[dict] = None) -> None:
        self.drafting.set(1 if rec.drafted else 0)
        if not rec.drafted:
            reason = "ab" if rec.arm not in (None, "policy") else (rec.draft_reason or "gate")
            self.no_draft_steps.labels(reason=reason).inc()
            self.no_draft_seconds.inc(rec.step_time_s)
            if rec.predicted_step_s:
                self.no_draft_predicted_seconds.inc(rec.predicted_step_s)
        for to, n in (switches or {}).items():
            delta = n - self._seen_switches.get(to, 0)
            if delta > 0:
                self.switches.labels(to=to).inc(delta)
                self._seen_switches[to] = n
        if rec.budget_tokens is not None:
            self.budget.set(rec.budget_tokens)
        self.verify_tokens.set(rec.verify_tokens)
        self.running.set(rec.num_requests)
        self.step_seconds.set(rec.step_time_s)
        if rec.accepted_lens:
            self.accepted.set(sum(rec.accepted_lens) / len(rec.accepted_lens))
        if rec.predicted_step_s and rec.step_time_s > 0:
            self.profile_error.set(abs(rec.predicted_step_s - rec.step_time_s) / rec.step_time_s)
        self.controller_connected.set(1 if link_state == "connected" else 0)
        for src, n in sources.items():
            delta = n - self._seen.get(src, 0)
            if delta > 0:
                self.decisions.labels(source=src).inc(delta)
                self._seen[src] = n


def worker_metrics(server_args) -> Optional[WorkerMetrics]:
    if not getattr(server_args, "enable_metrics", False):
        return None
    try:
        return WorkerMetrics()
    except Exception:  # metrics must never stop serving
        import logging

        logging.getLogger(__name__).exception("sglang-dspark: metrics disabled")
        return None
