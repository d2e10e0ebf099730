"""Every SGLang seam sglang-dspark touches, in one place.

An SGLang upgrade is a review of this file: each entry names the SGLang symbol it
relies on, why, and whether it applies to all devices or only to CPU runs.  Every
target is resolved eagerly by :func:`verify_targets`, so a moved symbol fails at
start-up with a message naming the pinned SGLang version instead of silently
doing nothing (``HookRegistry.apply_hooks`` only logs failures).

Seams used
----------
Entry points:
  * ``sglang.srt.plugins: dspark`` -> :func:`sglang_dspark.plugin.load` (this file),
    distribution ``sglang-dspark`` (pyproject.toml).
  * ``sglang.srt.platforms: dspark_cpu_boot`` -> :func:`sglang_dspark.cpu.boot.activate`
    (early CPU bootstrap: ``SGLANG_USE_CPU_ENGINE``, ``sgl_kernel`` CPU ops), distribution
    ``sglang-dspark-cpu-boot`` (packaging/cpu-boot): a platform entry point in our own
    distribution would let ``SGLANG_PLATFORM`` skip our general plugin.

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
import inspect
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


def names_dspark(algorithm) -> bool:
    """A ``--speculative-algorithm`` value names DSPARK (SGLang reads it upper-cased, and
    reserves the name: no alias or registered algorithm takes it)."""
    return str(algorithm or "").upper() == "DSPARK"


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
    from sglang_dspark.settings import read

    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and read("SGLANG_DSPARK_CPU")


def all_seams() -> list[Seam]:
    from sglang_dspark.cpu import patches as cpu
    from sglang_dspark import worker

    seams = [
        Seam("sglang.srt.arg_groups.speculative_hook._handle_dspark", "after",
             "validate the DSpark draft checkpoint against the target; fail at start-up "
             "with a clear message", cpu_only=False, hook=_validate_draft_hook),
        Seam("sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding", "before",
             "refuse a DSPARK draft path that does not exist (and is no hub repo id) in one "
             "line, before SGLang reads its config as a hub repo (checkpoint.check_draft_path)",
             cpu_only=False, hook=_check_draft_path_hook),
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
        "/set_internal_state keys dspark_unpin_budget (lift a pinned budget fraction, which "
        "SGLang's HTTP type cannot: null is not a number) and dspark_draft (pin drafting on or "
        "off, or lift that; every refusal decided in validate, since SGLang calls apply "
        "unguarded) (internal_state.py)", cpu_only=False,
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
        Seam("sglang.srt.speculative.dspark_components.dspark_sps.is_uninitialized_sps_table", "requires",
             "whether SGLang has an SPS table: names warm-up / verify-all steps and the start-up "
             "line (budget.py, worker.py)", cpu_only=False),
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
    _worker_v2 = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"
    seams += [
        Seam(f"{_worker_v2}._forward_decode", "requires",
             "DSparkControlledWorker._forward_decode overrides it with the same parameters and "
             "forwards every one (SGLang passes coordination_plan= under DP-attention prefill "
             "coordination); install() compares the signatures (check_override_signatures)",
             cpu_only=False),
        Seam(f"{_worker_v2}.forward_batch_generation", "requires",
             "DSparkControlledWorker.forward_batch_generation flushes the no-draft steps' pending "
             "draft-context rows before a prefill or extend (no_draft.AnchorCommit) and forwards "
             "every argument (check_override_signatures)", cpu_only=False),
        Seam("sglang.srt.runtime_context.get_parallel", "requires",
             "the engine id's tp_rank and dp_rank (the DP replica index) come from SGLang's "
             "published ranks (link.engine_ranks)", cpu_only=False),
        Seam(f"{_planner}.uniform_ragged_layout", "requires",
             "a full budget gets SGLang's verify-all layout, whose lengths are on the host "
             "(budget.HostLengthLayouts)", cpu_only=False),
        Seam("sglang.srt.speculative.ragged_verify.RaggedVerifyLayout", "requires",
             "a zero budget's layout gets host lengths (fields verify_lens_cpu, "
             "total_verify_tokens); planner attributes _schedule_cfg, "
             "_align_verify_tokens_to_graph_tier, verify_num_draft_tokens, model_runner "
             "(budget.HostLengthLayouts)", cpu_only=False),
        Seam(f"{_planner}.DSparkVerifyPlanner.is_verify_all", "requires",
             "SGLang's simulated-acceptance guard, re-applied after our flip of _is_verify_all "
             "(worker._refuse_simulated_acceptance; reads the worker's _simulate_acc_len)",
             cpu_only=False),
    ]
    # no-draft steps (no_draft.py, worker._forward_no_draft)
    _draft = "sglang.srt.speculative.dspark_components.dspark_draft"
    _verify = "sglang.srt.speculative.dspark_components.dspark_verify"
    seams += [
        Seam(f"{_draft}.DraftBlockProposer.propose", "requires",
             "a no-draft step swaps the worker's _proposer for NullProposer, which keeps propose()'s "
             "contract and reads the proposer's gamma, query_token_num, sample_from_anchor, "
             "_mask_token_id and draft_block_ids_view", cpu_only=False),
        Seam(f"{_draft}.DraftProposal", "requires",
             "NullProposer's result (draft_block_ids, draft_block, confidence, folded, verify_ids)",
             cpu_only=False),
        Seam(f"{_draft}.DraftBlockResult", "requires",
             "NullProposer's placeholder block (greedy_draft: a one-hot draft distribution)",
             cpu_only=False),
        Seam(f"{_draft}.resolve_draft_params", "requires",
             "NullProposer's temperatures and greedy mask, as SGLang's sampler resolves them",
             cpu_only=False),
        Seam(f"{_worker_v2}._deferred_commit", "requires",
             "a pending deferred context-KV commit (its pending, flush) lands before a no-draft "
             "step; the step sets the draft input's verify_token_budget to 0 (overlap "
             "scheduling prepared it)", cpu_only=False),
        Seam(f"{_verify}.TargetVerifyExecutor._run_ragged", "requires",
             "a compact no-draft step replaces the executor's _run_ragged (keywords batch, layout, "
             "ragged_window, sampling_info, kv_loc_plan; returns TargetVerifyResult) with "
             "no_draft.DecodeForward, a decode-mode forward, on CPU targets (no "
             "decode_cuda_graph_runner); and its commit_hidden with AnchorCommit", cpu_only=False),
        Seam("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new", "requires",
             "DecodeForward builds the decode-mode ForwardBatch (capture_hidden_mode, kv_loc_plan, "
             "write_cols) and reads req_to_token_pool.req_to_token at the first step",
             cpu_only=False),
        Seam(f"{_planner}.alloc_verify_window", "requires",
             "a no-draft step run as plain decoding (no_draft.PlainDecodeStep) takes the verify "
             "window's first column (slots, positions, kv_loc_plan) for its anchors; reads the "
             "worker's verify_num_draft_tokens, _block_pos_offsets, model_runner, device",
             cpu_only=False),
        Seam("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation", "requires",
             "PlainDecodeStep: is_verify=False on a decode ForwardBatch samples with SGLang's "
             "ordinary sampler (next_token_ids)", cpu_only=False),
        Seam("sglang.srt.managers.utils.GenerationBatchResult", "requires",
             "PlainDecodeStep's result: one token per request (accept_lens, block_accept_lens, "
             "cap_lens 1; speculative_output_stride 1), next_draft_input, new_seq_lens",
             cpu_only=False),
        Seam(f"{_draft}.make_next_draft_input", "requires",
             "PlainDecodeStep's next draft input (the sampled tokens as the next anchors)",
             cpu_only=False),
        Seam(f"{_verify}.verify_logits_adjustments_are_noop", "requires",
             "PlainDecodeStep leaves steps with logits adjustments to SGLang's verify; it also "
             "reads the worker's _need_mamba_verify_commit, _simulate_acc_greedy, _sim_draw_ahead, "
             "model_runner.ngram_embedding_manager.engram_hasher, _verify_planner."
             "resolve_verify_token_budget", cpu_only=False),
        Seam("sglang.srt.environ.Envs.SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH", "requires",
             "no-draft steps are off while SGLang's draft recorders run (no_draft.no_draft_refusal, "
             "also SGLANG_DSPARK_STS_COLLECT_PATH)", cpu_only=False),
    ]
    # req_to_token rows that hold DSpark's decode reserve at page size 1 (kv_headroom.py)
    from sglang_dspark import kv_headroom

    _sizing = "get_req_to_token_extra_context_len"
    seams += [
        Seam(f"sglang.srt.mem_cache.kv_cache_configurator.{_sizing}", "after",
             "the req_to_token row headroom the scheduler's pool is built with (imported by name "
             "there): at least DSpark's decode reserve, 2 x num_draft_tokens + page_size - 1, "
             "which SGLang applies only at page size > 1 (kv_headroom.py)", cpu_only=False,
             hook=kv_headroom.widen_for_dspark),
        Seam(f"sglang.srt.mem_cache.allocation_sizing.{_sizing}", "after",
             "the same rule where the function is defined, for any caller through the module",
             cpu_only=False, hook=kv_headroom.widen_for_dspark),
        Seam("sglang.srt.speculative.dflash_info_v2.DFlashDraftInputV2.prepare_for_decode", "requires",
             "rule mirrored: DSpark's decode step reserves committed + 2 x "
             "speculative_num_draft_tokens slots per request, page-aligned (kv_headroom.py)",
             cpu_only=False),
        Seam("sglang.srt.mem_cache.allocation_sizing.get_alloc_page_size", "requires",
             "the page size the reserve is rounded to (kv_headroom.py)", cpu_only=False),
        Seam("sglang.srt.runtime_context.get_spec", "requires",
             "the speculative algorithm and num_draft_tokens (kv_headroom.py)", cpu_only=False),
    ]
    # sampling penalties under DSPARK (penalties.py)
    from sglang_dspark import penalties

    seams += [
        Seam("sglang.srt.speculative.dflash_info_v2.DFlashDraftInputV2.prepare_for_decode", "after",
             "feed the penalizers each step's last committed token per request, as SGLang's plain "
             "decode preparation does and its DSpark one does not (DSPARK only; penalties.py)",
             cpu_only=False, hook=penalties.feed_committed),
        Seam(f"{_verify}.apply_logits_adjustments_strided", "around",
             "the ragged verify's logits adjustments: plain decoding's penalties on every position "
             "first, then SGLang's adjustment without them, then min_p (reads the sampling "
             "info's min_ps, temperatures, need_min_p_sampling; penalties.py)", cpu_only=False,
             hook=penalties.adjust_strided),
        Seam(f"{_verify}.apply_dflash_verify_logits_adjustments", "around",
             "the uniform verify's logits adjustments, the same rule (penalties.py)", cpu_only=False,
             hook=penalties.adjust_dflash),
        Seam("sglang.srt.speculative.dflash_utils.build_speculative_verify_target_probs", "around",
             "the verify's target probabilities (keywords next_token_logits, sampling_info, "
             "draft_token_num, bs, max_top_k; [bs, width, vocab] after top-k and top-p): under "
             "DSPARK, plain decoding's joint top-k/top-p rule, and min_p for requests with top_p "
             "below 1 (HookRegistry carries the patch to dspark_accept's import; penalties.py)",
             cpu_only=False, hook=penalties.verify_target_probs),
        Seam(f"{_verify}.accept_draft_tokens", "around",
             "every eager verify accept (keywords target_logits [bs * width, vocab], "
             "sampling_info, verify_num_draft_tokens), after SGLang's grammar mask: min_p for a "
             "batch with a grammar (sampling_info.grammars; penalties.min_p_after_grammar)",
             cpu_only=False, hook=penalties.min_p_after_grammar),
        Seam("sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch", "requires",
             "rule mirrored: plain decoding keeps a token whose rank is below top_k, whose "
             "probability ranked above it is at most top_p, and whose probability is at least "
             "min_p times the most likely token's, on the unfiltered probabilities at the "
             "request's temperature (penalties._mask_below_min_p, _renorm_below_min_p, "
             "_joint_top_k_top_p; the unit tests compare)",
             cpu_only=False),
        Seam("sglang.srt.managers.schedule_batch.ScheduleBatch.cumulate_penalty_output_tokens", "requires",
             "feeds the last output token per request to the penalizers (penalties.py)", cpu_only=False),
        Seam("sglang.srt.sampling.penaltylib.min_new_tokens.BatchedMinNewTokensPenalizer", "requires",
             "found in BatchedPenalizerOrchestrator.penalizers (a dict keyed by penalizer class); "
             "its len_output_tokens ([bs, 1]) is the generated-token count its mask compares with "
             "min_new_tokens ([bs, 1]), stop_token_penalties ([bs, vocab], -inf at stop tokens) "
             "the mask (penalties.py raises the count to the committed output length and masks "
             "each verify position)", cpu_only=False),
        Seam("sglang.srt.sampling.penaltylib.repetition_penalty.apply_scaling_penalties", "requires",
             "the overlap scheduler's scaling penalties applied as plain decoding applies them "
             "(penalties.py)", cpu_only=False),
        Seam("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.copy_for_forward", "around",
             "the forward's copy of the sampling info carries min_new_tokens per request "
             "(count, minimum, stop tokens) and the other additive penalties without it, so "
             "the verify masks each block position as plain decoding masks that token "
             "(DSPARK only; penalties.py). Rule mirrored: the worker's sampling info is this "
             "copy (the scheduler makes it for every forward, overlap or not): it carries "
             "acc_additive_penalties / acc_scaling_penalties and no penalizer_orchestrator "
             "(dataclasses.replace clears them for SGLang's adjustment)", cpu_only=False,
             hook=penalties.stash_min_new_tokens),
    ]
    # requests SGLang would accept and then die on (request_guard.py)
    from sglang_dspark import request_guard

    seams.append(Seam(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request", "before",
        "refuse input_ids that are empty or hold an id outside [0, vocab_size), and "
        "top_logprobs_num above vocab_size, with ValueError (HTTP 400) on a DSPARK server: "
        "SGLang 0.5.23 accepts them and its scheduler dies (request_guard.py; reads the "
        "manager's server_args.speculative_algorithm and model_config.vocab_size, the "
        "request's return_logprob, top_logprobs_num and image/video/audio_data)",
        cpu_only=False, hook=request_guard.refuse_fatal_request))
    seams.append(Seam(
        "sglang.srt.server_args.ServerArgs.enable_deterministic_inference", "requires",
        "the worker warns at start that DSPARK's verify samples without per-request seeds "
        "(worker.unseeded_sampling_warning)", cpu_only=False))
    # plugin discovery: the CPU bootstrap's own distribution (plugin.skip_reason, cpu/boot.py)
    seams += [
        Seam("sglang.srt.plugins._get_excluded_dists", "requires",
             "rule: SGLANG_PLATFORM skips every distribution that ships an unselected platform "
             "entry point, so sglang-dspark ships none (plugin.skip_reason states the rule)",
             cpu_only=False),
        Seam("sglang.srt.plugins.load_plugins_by_group", "requires",
             "rule: SGLANG_PLUGINS is a whitelist of entry-point names (plugin.skip_reason)",
             cpu_only=False),
        Seam("sglang.srt.platforms.cpu.CpuSRTPlatform", "requires",
             "the platform class cpu.boot.activate returns when SGLANG_PLATFORM names "
             "dspark_cpu_boot (SGLang then requires one)", cpu_only=True),
    ]
    # the draft validator reads the draft the way SGLang does (checkpoint.py)
    _dspark_cfg = "sglang.srt.speculative.dspark_components.dspark_config"
    seams += [
        Seam("sglang.srt.utils.hf_transformers_utils.get_config", "requires",
             "the draft's and target's config objects as SGLang builds them (checkpoint.py calls "
             "its undecorated __wrapped__: the memoised one would read an edited directory stale)",
             cpu_only=False),
        Seam("sglang.srt.utils.hf_transformers_utils.get_hf_text_config", "requires",
             "the target's text config: layer count, vocab_size, padded_vocab_size (checkpoint.py)",
             cpu_only=False),
        Seam("sglang.srt.speculative.dflash_utils.parse_dflash_draft_config", "requires",
             "block_size, target_layer_ids, mask_token_id, num_target_layers, dflash_config first "
             "(checkpoint.py); DFlashDraftConfig.resolve_target_layer_ids sizes the fc",
             cpu_only=False),
        Seam("sglang.srt.speculative.dflash_utils.is_nemotron_35_draft_config", "requires",
             "Nemotron 3.5 drafts (quantised, own vocab modules) are left to SGLang's loader "
             "(checkpoint.py)", cpu_only=False),
        Seam(f"{_dspark_cfg}.parse_dspark_draft_config", "requires",
             "dspark_* keys, dspark_config, text_config: gamma, capture layers, mask, Markov "
             "rank/type as the worker reads them (checkpoint.py)", cpu_only=False),
        Seam(f"{_dspark_cfg}.resolve_runtime_config", "requires",
             "the worker's start-up checks (mask below the target's embedding rows, gamma) "
             "run by the validator (checkpoint.py)", cpu_only=False),
        Seam(f"{_dspark_cfg}.DEFAULT_DSPARK_GAMMA", "requires",
             "the gamma _handle_dspark uses when the draft sets none (checkpoint.py)", cpu_only=False),
        Seam("sglang.srt.speculative.ragged_verify.read_ragged_verify_mode", "requires",
             "the confidence head is built (and its tensors required) only outside static mode "
             "(checkpoint.py)", cpu_only=False),
        Seam("sglang.srt.models.dspark.build_markov_head", "requires",
             "rule mirrored: the Markov head is built from the TOP-LEVEL markov_rank and "
             "markov_head_type (checkpoint.py)", cpu_only=False),
        Seam("sglang.srt.models.dspark.build_confidence_head", "requires",
             "rule mirrored: built in every non-static mode whatever enable_confidence_head says, "
             "width hidden + top-level markov_rank (checkpoint.py)", cpu_only=False),
        Seam("sglang.srt.models.dspark.DSparkDraftMixin.load_weights", "requires",
             "rule mirrored: confidence_head.* routed by the raw name, lm_head/rotary_emb/"
             "embed_tokens skipped, unknown markov_head.* refused (checkpoint.py)", cpu_only=False),
        Seam("sglang.srt.models.dflash.DFlashDraftModel.load_weights", "requires",
             "rule mirrored: optional model. prefix and its local _VENDOR_ENCODER_ALIASES "
             "(checkpoint.VENDOR_ENCODER_ALIASES, compared with its source by the unit tests)",
             cpu_only=False),
        Seam("sglang.srt.arg_groups.overrides.resolving_view", "requires",
             "the server args as resolved so far, in the draft checks (checkpoint.py)",
             cpu_only=False),
    ]
    seams += cpu.seams()
    return seams


# (our class, method): overrides whose parameters must stay SGLang's (the class it overrides
# is found through the MRO, so a REPLACE hook on SGLang's module name cannot hide it)
OVERRIDES = [("sglang_dspark.worker.DSparkControlledWorker", "_forward_decode"),
             ("sglang_dspark.worker.DSparkControlledWorker", "forward_batch_generation")]
# callables installed on an SGLang object in place of one of its methods, for one step
# (ours, SGLang's): SGLang calls ours with the arguments of its own
STAND_INS = [
    ("sglang_dspark.no_draft.DecodeForward.__call__",
     "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor._run_ragged"),
    ("sglang_dspark.no_draft.AnchorCommit.__call__",
     "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor.commit_hidden"),
]


def _params(fn) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def check_override_signatures(overrides=None) -> None:
    """Every override in ``overrides`` (default :data:`OVERRIDES`; a class or its dotted
    path, and a method name) takes exactly the parameters (names, order, kinds, defaults)
    of the SGLang method it overrides, so SGLang never calls it with an argument it drops;
    with the defaults, so does every stand-in of :data:`STAND_INS`."""
    bad = []
    if overrides is None:       # the defaults: the stand-ins too
        for ours, theirs in STAND_INS:
            a, b = pkgutil.resolve_name(ours), pkgutil.resolve_name(theirs)
            if _params(a) != _params(b):
                bad.append(f"{ours}{inspect.signature(a)} stands in for {theirs}{inspect.signature(b)}")
    for cls, name in OVERRIDES if overrides is None else overrides:
        cls = pkgutil.resolve_name(cls) if isinstance(cls, str) else cls
        base = next((b for b in cls.__mro__[1:] if name in vars(b)), None)
        if base is None:
            bad.append(f"{cls.__qualname__}.{name} overrides nothing")
        elif _params(vars(cls)[name]) != _params(vars(base)[name]):
            bad.append(f"{cls.__qualname__}.{name}{inspect.signature(vars(cls)[name])} != "
                       f"{base.__module__}.{base.__qualname__}.{name}"
                       f"{inspect.signature(vars(base)[name])}")
    if bad:
        raise SeamError(
            f"sglang-dspark {__import__('sglang_dspark').__version__} supports SGLang "
            f"{SGLANG_PINNED}, but the installed SGLang {sglang_version()} changed an overridden "
            "method's parameters: " + "; ".join(bad)
            + f". Install sglang=={SGLANG_PINNED} (pip install 'sglang=={SGLANG_PINNED}').")


def _validate_draft_hook(result, server_args, *args, **kwargs):
    from sglang_dspark.checkpoint import validate_from_server_args

    validate_from_server_args(server_args)
    return result


def _check_draft_path_hook(server_args, *args, **kwargs):
    from sglang_dspark.checkpoint import check_draft_path_from_server_args

    check_draft_path_from_server_args(server_args)
    return None


def install() -> list[Seam]:
    """Register every hook (called once per SGLang process by the plugin)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    kinds = {"before": HookType.BEFORE, "after": HookType.AFTER,
             "around": HookType.AROUND, "replace": HookType.REPLACE}
    seams = [s for s in all_seams() if is_cpu_run() or not s.cpu_only]
    verify_targets(seams)
    check_override_signatures()
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
