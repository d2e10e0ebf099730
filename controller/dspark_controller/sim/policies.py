"""Budget policies for the fleet simulator, run through the production code.

Every DSpark policy chooses a draft-token budget K per step from *lagged* survival rows
(confidences two steps old; requests too young for that get all-ones rows, exactly as
SGLang's ``HostConfidenceBudgetPlanner._two_steps_prior_survival``), and the step then
verifies the global top-K of the live survival products.

K comes from the worker's own policy object, :class:`dspark_controller.core.policy.BudgetPolicy`
(the one the worker's ``OnlineBudgetPlanner`` calls: exploration, controller decision,
local online :class:`SpsModel`, probes, the uniform-path gate with admission gain, survival
calibration), fed back after each step as the worker feeds it (``observe_step`` and
``learn_step_time``).  Two "backends" differ only in SGLang's own pieces:

``worker``
    SGLang 0.5.23's ``compute_verify_token_budget`` with an ``SpsCostTable`` for
    ``upstream``, and SGLang's ``schedule_verify_lens_topk_from_survival`` for the live
    top-K admission. Importing them imports SGLang (10-25 s).
``planner``
    no SGLang import: :func:`dspark_controller.core.method.compute_lagged_budget` over the
    table for ``upstream`` and :func:`~dspark_controller.core.method.plan_lagged` for the top-K.

The ``controller`` and ``sla`` policies run the real
:class:`dspark_controller.service.server.Controller` in-process (no sockets): simulated steps go
through ``Controller._on_step`` as ``StepTelemetry`` (the fields the worker's
``ControllerLink.publish`` sends), decisions come from ``Controller.decide`` every
``decision_interval_s`` of simulated time after R changed (``decision_refresh_s`` while it
has not, as the controller's event loop), and the worker side applies them through
``BudgetPolicy`` (``_from_controller``).

No-draft steps: before every decode step the simulator asks :meth:`Policy.draft` (our
policies: ``BudgetPolicy.draft_step(R)``, as the worker asks it); False runs a plain decode
step (no draft forward, one token per request, the cost model's ``nospec`` step) and
reports it through :meth:`Policy.observe_off` (``BudgetPolicy.observe_off_step``) instead of
``observe``: such a step feeds neither the SPS profile, the calibration, the admission
gain nor the controller's telemetry.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable, Optional

import numpy as np

from dspark_controller.core.method import (compute_lagged_budget, plan_lagged, sps_from_pairs, survival_to_confidences)
from dspark_controller.core.strategies import UniformTimes, learn_step_time
from dspark_controller.core.policy import BudgetPolicy, PolicyConfig

__all__ = ["Backend", "make_policy", "POLICY_NAMES", "SimController", "resolve_backend"]

POLICY_NAMES = ("nospec", "mtp1", "verify_all", "upstream", "online", "controller", "sla", "oracle")


# ------------------------------------------------------------------ backends
class Backend:
    """Where budgets and admissions are computed (see the module docstring)."""

    def __init__(self, name: str) -> None:
        if name not in ("worker", "planner"):
            raise ValueError(f"unknown budget backend {name!r}; use worker, planner or auto")
        self.name = name
        if name == "worker":
            import torch
            from sglang.kernels.ops.speculative.dspark.dspark_schedule import \
                schedule_verify_lens_topk_from_survival
            from sglang.srt.speculative.dspark_components.dspark_planner import (DSparkScheduleConfig,
                                                                                 compute_verify_token_budget)
            from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable

            self._torch = torch
            self._topk = schedule_verify_lens_topk_from_survival
            self._cfg_cls = DSparkScheduleConfig
            self._sglang_budget = compute_verify_token_budget
            self._table_cls = SpsCostTable

    # ---- K from a lagged survival array [R, gamma]: the worker's policy object, either backend
    @staticmethod
    def brain(*, local_model: Any, config: PolicyConfig, latest_decision: Any = None,
              uniform_step_time: Any = None, fleet_model: Any = None) -> BudgetPolicy:
        return BudgetPolicy(local_model=local_model, config=config, latest_decision=latest_decision,
                            uniform_step_time=uniform_step_time, fleet_model=fleet_model)

    @staticmethod
    def brain_decide(brain: BudgetPolicy, survival: np.ndarray, gamma: int) -> Optional[int]:
        # float32, as SGLang's planner hands the worker its survival
        d = brain.decide(np.asarray(survival, dtype=np.float32), max_len=gamma + 1)
        return None if d is None else int(d.budget)

    def upstream_table(self, table: dict) -> Any:
        if "bias_seconds" in table:  # SGLang's SpsAdditiveCostTable (what its profiler writes)
            from sglang.srt.speculative.dspark_components.dspark_sps import SpsAdditiveCostTable

            import json as _json

            return SpsAdditiveCostTable.from_json(_json.dumps(table))
        if self.name == "worker":
            return self._table_cls(sample_batch_tokens=[int(x) for x in table["sample_batch_tokens"]],
                                   sample_steps_per_sec=[float(x) for x in table["sample_steps_per_sec"]],
                                   max_batch_tokens=int(table["max_batch_tokens"]))
        return sps_from_pairs(list(zip(table["sample_batch_tokens"], table["sample_steps_per_sec"])))

    def upstream_budget(self, table_obj: Any, survival: np.ndarray, gamma: int) -> int:
        """SGLang's ``compute_verify_token_budget`` (worker) or ``compute_lagged_budget`` over the
        table's floor lookup (planner): the same argmax of (R + top-k survival) * SPS(R + k)."""
        if self.name == "worker":
            cfg = self._cfg_cls(gamma=gamma)
            surv = self._torch.from_numpy(np.ascontiguousarray(survival, dtype=np.float32))
            return int(self._sglang_budget(history_survival_probs=surv, sps_table=table_obj, cfg=cfg).budget)
        conf = survival_to_confidences(survival.astype(np.float32))
        if hasattr(table_obj, "step_time"):  # additive table: SPS(B) at this step's R
            R = int(conf.shape[0])

            def sps(b: Any, _t=table_obj, _r=R) -> Any:
                arr = np.atleast_1d(np.asarray(b, dtype=np.int64))
                out = np.asarray([1.0 / max(_t.step_time(num_reqs=_r, budget=max(int(x) - _r, 0)), 1e-9)
                                  for x in arr])
                return out if np.ndim(b) else float(out[0])

            return compute_lagged_budget(conf, sps).budget_tokens
        return compute_lagged_budget(conf, table_obj).budget_tokens

    # ---- live admission: global top-K of the live survival products
    def admit(self, live_conf: np.ndarray, K: int, gamma: int) -> np.ndarray:
        R = live_conf.shape[0]
        if K >= R * gamma:
            return np.full(R, gamma, dtype=np.int64)
        if K <= 0:
            return np.zeros(R, dtype=np.int64)
        if self.name == "worker":
            surv = self._torch.cumprod(self._torch.from_numpy(np.ascontiguousarray(live_conf, dtype=np.float32)), dim=1)
            lens = self._topk(survival_probs=surv, budget=int(K), cfg=self._cfg_cls(gamma=gamma))
            return lens.numpy().astype(np.int64) - 1          # SGLang counts the anchor
        p = plan_lagged(live_conf, _unit_sps, budget=int(K))
        return np.asarray(p.lengths, dtype=np.int64)


def _unit_sps(b: Any) -> Any:
    return 1.0 if np.isscalar(b) else np.ones(np.shape(b))


def resolve_backend(name: str) -> Backend:
    """``auto``: the worker's code when SGLang imports, else the planner path."""
    if name == "auto":
        try:
            return Backend("worker")
        except Exception:
            return Backend("planner")
    return Backend(name)


# ------------------------------------------------------------------ controller in-process
class SimController:
    """The real :class:`~dspark_controller.service.server.Controller`, driven without sockets.

    One instance per policy run, shared by all simulated engines (one profile, as engines
    with the same fingerprint share one in production). ``send_verify_lens`` adds the
    per-request verify lengths to the telemetry, as the worker's ``ControllerLink.publish``
    sends them (default True; False simulates telemetry without them, where the controller
    counts a request its budget stopped as a rejection).
    """

    def __init__(self, *, gamma: int, mode: str = "throughput", floor: Optional[float] = None,
                 explore: float = 0.0, decision_interval_s: float = 0.1, send_verify_lens: bool = True,
                 max_requests: int = 1024, max_batch_tokens: int = 8192) -> None:
        import logging

        from dspark_controller.service.protocol import EngineFingerprint, PolicySpec
        from dspark_controller.service.server import Controller, ControllerConfig, _Engine
        from dspark_controller.core.sps_model import SpsModelConfig

        logging.getLogger("dspark_controller.service.server").setLevel(logging.WARNING)
        mbt = 1 << max(6, int(np.ceil(np.log2(max(max_batch_tokens, 64)))))
        cfg = ControllerConfig(bind="ipc:///nonexistent/dspark-sim", profiles_dir=None, max_learn_steps_per_s=0,
                               policy=PolicySpec(mode=mode, floor_tok_s=floor, explore_prob=explore),
                               decision_interval_s=decision_interval_s,
                               model=SpsModelConfig(max_batch_tokens=mbt, max_requests=max(max_requests, 1)))
        self.ctrl = Controller(config=cfg)
        self.gamma = gamma
        self.interval = decision_interval_s
        self.refresh = cfg.stale_refresh_s
        self.send_verify_lens = send_verify_lens
        self._fp = EngineFingerprint(target_model="sim-target", draft_model="sim-draft", gamma=gamma,
                                     device_name="sim")
        self._engine_cls = _Engine
        self.engines: dict[int, Any] = {}
        self.decisions: dict[int, tuple[float, Any]] = {}
        self._seq: dict[int, int] = {}
        self._table_at: dict[int, float] = {}    # simulated time of the last curve sent, per engine

    def _engine(self, idx: int) -> Any:
        eng = self.engines.get(idx)
        if eng is None:
            prof = self.ctrl._profile_for(self._fp)
            g = self.gamma
            eng = self._engine_cls(engine_id=f"sim-{idx}", worker_id=f"w{idx}", client_nonce="n", fingerprint=self._fp,
                                   profile_key=prof.key, identity=b"", last_seen=0.0, registered_at=0.0, gamma=g,
                                   acc_trials=np.zeros(g), acc_succ=np.zeros(g))
            self.ctrl.engines[eng.engine_id] = eng
            prof.engines.add(eng.engine_id)
            self.engines[idx] = eng
            self._seq[idx] = 0
        return eng

    @property
    def model(self) -> Any:
        return self.ctrl.profiles[self._fp.profile_key()].model if self.ctrl.profiles else None

    def observe(self, idx: int, now: float, R: int, B: int, t: float, accepted: np.ndarray,
                lengths: np.ndarray, uniform: bool = False) -> None:
        from dspark_controller.service.protocol import StepTelemetry

        eng = self._engine(idx)
        self._seq[idx] += 1
        kw: dict[str, Any] = {"uniform": True} if uniform else {}
        if self.send_verify_lens:
            kw["verify_lens"] = [int(x) for x in lengths]
        step = StepTelemetry(seq=self._seq[idx], num_running_requests=int(R), verify_tokens=int(B),
                             step_time_s=float(t), accepted_lens=[min(int(x), 1024) for x in accepted], **kw)
        self.ctrl._on_step(eng, step, now)

    def latest(self, idx: int, now: float, R: int) -> Optional[Any]:
        """The decision the worker holds at ``now``: a new one ``interval`` after the last when
        R changed since, ``stale_refresh_s`` after it when not (the controller's cadence,
        ``Controller._tick``, with telemetry every step)."""
        from dspark_controller.service.client import carry_curve

        eng = self._engine(idx)
        last = self.decisions.get(idx)
        if last is None or now - last[0] >= (self.interval if last[1].num_requests != R else self.refresh):
            eng.num_requests = int(R)
            # Controller.decide attaches its curve when R or the profile changed, else once per
            # profile_publish_s on the host's clock (time.monotonic()); here that period runs on
            # simulated time, so what a seeded run decides cannot depend on how fast the host is
            sent = self._table_at.get(idx)
            due = sent is None or now - sent >= self.ctrl.config.profile_publish_s
            eng.table_sent_at = -math.inf if due else math.inf
            d = self.ctrl.decide(eng)
            if d.sps_table is not None:
                self._table_at[idx] = now
            eng.decision_seq = d.seq
            eng.last_decision = d
            # the worker's client carries the last curve forward, exactly so
            d = carry_curve(None if last is None else last[1], d)
            self.decisions[idx] = (now, d)
            last = self.decisions[idx]
        return last[1]


# ------------------------------------------------------------------ policies
class Policy:
    """One policy instance per engine and run. ``budget`` returns K or None (verify all)."""

    name = "policy"
    kind = "dspark"          # nospec | mtp1 | dspark | static (verify-all in SGLang's static mode)

    def __init__(self) -> None:
        self.sources: Counter = Counter()

    def budget(self, *, now: float, R: int, gamma: int, lagged_survival: np.ndarray,
               true_sps: Callable[[Any], Any]) -> Optional[int]:
        return None

    def observe(self, *, now: float, R: int, B: int, t: float, accepted: np.ndarray, lengths: np.ndarray,
                uniform: bool = False) -> None:
        """One finished step; ``uniform``: it ran on SGLang's uniform verify path (see
        ``Scenario.full_budget_static``)."""

    def draft(self, *, now: float, R: int) -> bool:
        """Before a decode step: draft it (True) or run a no-draft step (False)."""
        return True

    def observe_off(self, *, now: float, R: int, t: float) -> None:
        """A finished no-draft step of ``R`` requests that took ``t`` seconds."""

    def gate_summary(self) -> Optional[dict]:
        """The drafting gate's state and counters (None: the policy has no gate)."""
        return None

    def state(self) -> dict[str, Any]:
        return {"sources": dict(self.sources)}


class _Fixed(Policy):
    def __init__(self, name: str, kind: str) -> None:
        super().__init__()
        self.name, self.kind = name, kind


class UpstreamPolicy(Policy):
    """SGLang's lagged planner with a static SPS table fixed at start (SGLang's behaviour)."""

    name = "upstream"

    def __init__(self, backend: Backend, table: dict) -> None:
        super().__init__()
        self.backend = backend
        self.table = table
        self._obj = backend.upstream_table(table)

    def budget(self, *, now, R, gamma, lagged_survival, true_sps):
        self.sources["table"] += 1
        return self.backend.upstream_budget(self._obj, lagged_survival, gamma)


class OnlinePolicy(Policy):
    """Our worker without a controller: ``BudgetPolicy`` over its own online ``SpsModel``."""

    worker_brain = True      # our worker's planning path (Scenario.full_budget_static applies)

    name = "online"

    @property
    def decision_model(self) -> Any:
        return self.model

    def __init__(self, backend: Backend, model: Any, config: PolicyConfig) -> None:
        super().__init__()
        self.backend = backend
        self.model = model
        self.uniform_s = UniformTimes(model)
        self.brain = backend.brain(local_model=model, config=config, uniform_step_time=self.uniform_s.get)
        self._last: Optional[tuple] = None      # (survival used, expected drafts, ragged seconds) of the last decision

    def budget(self, *, now, R, gamma, lagged_survival, true_sps):
        k = self.backend.brain_decide(self.brain, lagged_survival, gamma)
        if k is None:
            self.sources["verify_all"] += 1
        # as the worker: the survival its decision read (also when the fallback verified all)
        self._last = (self.brain.last_survival, self.brain.last_pred_drafts, self.brain.last_pred_ragged_s,
                      self.brain.last_source)
        return k

    def observe(self, *, now, R, B, t, accepted, lengths, uniform=False):
        self._learn(R, B, t, accepted, lengths, uniform)

    def draft(self, *, now, R):
        return self.brain.draft_step(int(R))

    def observe_off(self, *, now, R, t):
        # the worker's call after a no-draft step: the off-step time per R and the gate's
        # check; nothing reaches the profile, the calibration or the admission gain
        self.brain.observe_off_step(int(R), float(t))

    def gate_summary(self):
        g = self.brain.gate
        if g is None:
            return None
        out = g.summary()
        out["off_probes"] = int(self.brain.off_probes)
        return out

    def _learn(self, R: int, B: int, t: float, accepted: np.ndarray, lengths: np.ndarray, uniform: bool) -> None:
        """What the worker's telemetry hook does with a finished step (the same calls): the
        policy's calibration and admission gain (a uniform-path step verifies every draft),
        then the step time."""
        survival, pred, ragged_s, source = self._last if self._last is not None else (None, None, None, None)
        self.brain.observe_step(survival=survival, accepted=[int(x) for x in accepted],
                                verified=[int(x) for x in lengths], pred_drafts=pred, uniform=uniform,
                                step_s=t, pred_ragged_s=ragged_s, source=source)
        learn_step_time(self.model, self.uniform_s, self.brain, num_req=R, batch_tokens=B, step_s=t,
                        uniform=uniform)

    def state(self) -> dict[str, Any]:
        return {"sources": dict(self.brain.sources) | ({"verify_all": self.sources["verify_all"]}
                                                        if self.sources["verify_all"] else {}),
                "model_steps": int(self.model.steps), "model_ready": bool(self.model.ready)}


class ControllerPolicy(OnlinePolicy):
    """Our worker with the controller: decisions from the in-process ``Controller``."""

    def __init__(self, backend: Backend, model: Any, config: PolicyConfig, ctrl: SimController, engine_idx: int,
                 name: str) -> None:
        Policy.__init__(self)
        self.name = name
        self.backend = backend
        self.model = model
        self.ctrl = ctrl
        self.idx = engine_idx
        self._now = 0.0
        self._R = 0
        self.uniform_s = UniformTimes(model)
        # the worker's client rebuilds the controller's whole profile from its ProfileUpdates;
        # here the controller object is at hand (its model, not a published snapshot)
        self.brain = backend.brain(local_model=model, config=config, latest_decision=self._latest,
                                   uniform_step_time=self.uniform_s.get, fleet_model=lambda: self.ctrl.model)
        self._last = None

    @property
    def decision_model(self) -> Any:
        """The profile the decisions come from: the controller's (shared) model."""
        return self.ctrl.model

    def _latest(self, max_age_s: float) -> Any:
        d = self.ctrl.latest(self.idx, self._now, self._R)
        return d

    def budget(self, *, now, R, gamma, lagged_survival, true_sps):
        self._now, self._R = now, R
        return super().budget(now=now, R=R, gamma=gamma, lagged_survival=lagged_survival, true_sps=true_sps)

    def draft(self, *, now, R):
        self._now, self._R = now, R     # draft_step reads the controller's latest decision
        return super().draft(now=now, R=R)

    def observe(self, *, now, R, B, t, accepted, lengths, uniform=False):
        self._learn(R, B, t, accepted, lengths, uniform)
        self.ctrl.observe(self.idx, now, R, B, t, accepted, lengths, uniform=uniform)


class OraclePolicy(Policy):
    """Reference: the lagged planner over the *true* current curve (no learning error)."""

    name = "oracle"

    def budget(self, *, now, R, gamma, lagged_survival, true_sps):
        conf = survival_to_confidences(lagged_survival)
        return compute_lagged_budget(conf, true_sps).budget_tokens


def make_policy(name: str, *, backend: Backend, gamma: int, engine_idx: int, shared: dict,
                upstream_table: Optional[dict], max_running: int, seed: int, sla_floor: Optional[float],
                controller_explore: float, send_verify_lens: bool = True,
                brain_config: Optional[PolicyConfig] = None) -> Policy:
    """Build one engine's policy; ``shared`` holds per-run objects shared across engines."""
    if name == "nospec":
        return _Fixed("nospec", "nospec")
    if name == "mtp1":
        return _Fixed("mtp1", "mtp1")
    if name == "verify_all":
        return _Fixed("verify_all", "static")
    if name == "oracle":
        return OraclePolicy()
    if name == "upstream":
        if upstream_table is None:
            raise ValueError("policy 'upstream' needs a static table")
        return UpstreamPolicy(backend, upstream_table)
    cfg = brain_config or PolicyConfig(seed=seed + engine_idx)
    from sglang_dspark.link import local_model_for

    model = local_model_for(max_requests=max_running, max_batch_tokens=max_running * (gamma + 1))
    if name == "online":
        return OnlinePolicy(backend, model, cfg)
    if name in ("controller", "sla"):
        key = f"ctrl-{name}"
        if key not in shared:
            if name == "sla" and not sla_floor:
                raise ValueError("policy 'sla' needs an SLA floor (tokens/s per user)")
            shared[key] = SimController(gamma=gamma, mode="sla" if name == "sla" else "throughput",
                                        floor=sla_floor if name == "sla" else None, explore=controller_explore,
                                        send_verify_lens=send_verify_lens, max_requests=max_running,
                                        max_batch_tokens=2 * max_running * (gamma + 1))
        return ControllerPolicy(backend, model, cfg, shared[key], engine_idx, name)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
