"""Every SGLang seam sglang-dspark touches, in one place.

An SGLang upgrade is a review of this file: each entry names the SGLang symbol it
relies on, why, and whether it applies to all devices or only to CPU runs.  Every
target is resolved eagerly by :func:`verify_targets`, so a moved symbol fails at
start-up with a message naming the pinned SGLang version instead of silently
doing nothing (``HookRegistry.apply_hooks`` only logs failures).

Seams used
----------
Entry points (pyproject.toml):
  * ``sglang.srt.platforms: dspark_cpu_boot`` -> :func:`sglang_dspark.cpu.boot.activate`
    (early CPU bootstrap: ``SGLANG_USE_CPU_ENGINE``, ``sgl_kernel`` CPU ops).
  * ``sglang.srt.plugins: dspark`` -> :func:`sglang_dspark.plugin.load` (this file).

Registrations:
  * ``attention_registry.register_attention_backend("dspark_cpu")`` + choices:
    SGLang's ``IntelAMXAttnBackend`` under a name that is not silently downgraded to
    ``torch_native`` when AMX weight packing is missing (CPU only).

Hooks (``HookRegistry``), see :func:`all_seams` below for the exact targets, among them
``SchedulerInternalStateController._update_handlers`` (AFTER): our
``/set_internal_state`` key ``dspark_unpin_budget`` (:mod:`sglang_dspark.internal_state`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pkgutil
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)

SGLANG_PINNED = "0.5.23"
CPU_ATTENTION_BACKEND = "dspark_cpu"


@dataclass(frozen=True)
class Seam:
    target: str          # dotted path HookRegistry patches (or a symbol we rely on)
    kind: str            # "before" | "after" | "around" | "replace" | "requires"
    why: str
    cpu_only: bool
    hook: Callable | None = None


class SeamError(RuntimeError):
    pass


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return "unknown"


def verify_targets(seams: list[Seam]) -> None:
    missing = []
    for s in seams:
        try:
            pkgutil.resolve_name(s.target)
        except (ImportError, AttributeError) as e:
            missing.append(f"{s.target} ({type(e).__name__}: {e})")
    if missing:
        raise SeamError(
            f"sglang-dspark {__import__('sglang_dspark').__version__} supports SGLang "
            f"{SGLANG_PINNED}, but the installed SGLang {sglang_version()} lacks: "
            + "; ".join(missing)
            + f". Install sglang=={SGLANG_PINNED} (pip install 'sglang=={SGLANG_PINNED}')."
        )


def is_cpu_run() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and os.environ.get(
        "SGLANG_DSPARK_CPU", "1") != "0"


def all_seams() -> list[Seam]:
    from sglang_dspark.cpu import patches as cpu
    from sglang_dspark import worker

    seams = [
        Seam("sglang.srt.arg_groups.speculative_hook._handle_dspark", "after",
             "validate the DSpark draft checkpoint against the target; fail at start-up "
             "with a clear message", cpu_only=False, hook=_validate_draft_hook),
        Seam("sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2",
             "replace", "run our DSpark worker (subclass) for --speculative-algorithm DSPARK",
             cpu_only=False, hook=worker.DSparkControlledWorker),
    ]
    from sglang_dspark import seq_head

    seams.append(Seam(
        "sglang.srt.speculative.dspark_components.dspark_draft.draft_markov_block", "around",
        "SGLANG_DSPARK_FUSED_SEQ_HEAD: our fused sequential head (torch on CPU by default, "
        "SGLang's kernels on GPU by default)", cpu_only=False,
        hook=seq_head.fused_draft_markov_block))
    from sglang_dspark import internal_state

    seams.append(Seam(
        "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
        "._update_handlers", "after",
        "/set_internal_state key dspark_unpin_budget: lift a pinned budget fraction, which "
        "SGLang's HTTP type cannot (null is not a number) (internal_state.py)", cpu_only=False,
        hook=internal_state.update_handlers_hook))
    seams += [
        Seam("sglang.srt.managers.scheduler_components.internal_state._UpdateHandler", "requires",
             "our /set_internal_state key uses SGLang's handler type (internal_state.py)", cpu_only=False),
        Seam("sglang.srt.managers.scheduler_components.internal_state.UpdateRejected", "requires",
             "our /set_internal_state key rejects bad values as SGLang's do (internal_state.py)",
             cpu_only=False),
        Seam("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
             "._require_dspark_worker", "requires",
             "our /set_internal_state key checks for a DSpark worker as SGLang's do (internal_state.py)",
             cpu_only=False),
    ]
    # internals our subclasses and collaborators rely on (resolved at start-up like the hooks)
    _planner = "sglang.srt.speculative.dspark_components.dspark_planner"
    seams += [
        Seam(f"{_planner}.HostConfidenceBudgetPlanner._shift_to_lag", "requires",
             "OnlineBudgetPlanner keeps SGLang's lagged confidences (budget.py)", cpu_only=False),
        Seam(f"{_planner}.HostConfidenceBudgetPlanner._two_steps_prior_survival", "requires",
             "OnlineBudgetPlanner keeps SGLang's two-steps-prior survival (budget.py)", cpu_only=False),
        Seam(f"{_planner}.compute_verify_token_budget", "requires",
             "fallback to SGLang's static-table budget (budget.py)", cpu_only=False),
        Seam("sglang.srt.speculative.dspark_components.dspark_observability.DsparkStepObservers"
             ".observe_verify_step", "requires",
             "SGLANG_DSPARK_CAPTURE wraps the worker's step observer (capture.py)", cpu_only=False),
        Seam(f"{_planner}.DSparkVerifyPlanner.schedule_layout", "requires",
             "SGLANG_DSPARK_FULL_BUDGET_STATIC wraps it per worker instance: a full-budget step "
             "gets no ragged layout, i.e. SGLang's uniform verify path (worker.py)", cpu_only=False),
        Seam("sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"
             ".set_dspark_forced_budget_frac", "requires",
             "the operator's forced fraction reaches our planner (budget.py)", cpu_only=False),
    ]
    seams += cpu.seams()
    return seams


def _validate_draft_hook(result, server_args, *args, **kwargs):
    from sglang_dspark.checkpoint import validate_from_server_args

    validate_from_server_args(server_args)
    return result


def install() -> list[Seam]:
    """Register every hook (called once per SGLang process by the plugin)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    kinds = {"before": HookType.BEFORE, "after": HookType.AFTER,
             "around": HookType.AROUND, "replace": HookType.REPLACE}
    seams = [s for s in all_seams() if is_cpu_run() or not s.cpu_only]
    verify_targets(seams)
    for s in seams:
        if s.kind in kinds and s.hook is not None:
            HookRegistry.register(s.target, s.hook, kinds[s.kind])
    if is_cpu_run():
        from sglang_dspark.cpu import patches as cpu

        cpu.register_backends()
    logger.info("sglang-dspark: %d SGLang seams installed (cpu=%s)", len(seams), is_cpu_run())
    return seams


def describe() -> list[dict]:
    return [
        {k: v for k, v in dataclasses.asdict(s).items() if k != "hook"}
        for s in all_seams()
    ]
