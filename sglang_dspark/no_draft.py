"""No-draft decode steps: a decode step that runs no draft forward.

When the policy decides that a step is better decoded without drafts
(:meth:`dspark_controller.core.policy.BudgetPolicy.draft_step`), the worker runs SGLang's
own decode step with :class:`NullProposer` in place of the draft proposer, for that one
step, and a verify budget of 0:

* no draft forward runs: the proposal is the anchor (the last committed token) and
  placeholder draft tokens that no verify window reaches;
* the target verifies only the anchor of each request, samples the next token from the
  target's own distribution, and commits it.  Compact mode: one token per request, run
  as SGLang's ordinary decode forward on CPU (:class:`DecodeForward`), else as a ragged
  verify of one token per request (in the target's verify graphs where captured);
  cap-accept mode verifies its fixed window with acceptance capped at 0;
* the anchor's target hidden state goes into the draft's context KV, as SGLang's commit
  writes it after any zero-budget step, batched over a run of no-draft steps and written
  before the next drafted step or prefill (:class:`AnchorCommit`), so the next drafted step
  drafts exactly what it would have drafted after a zero-budget step on the same context;
* no confidences are published: the lag relay keeps the last drafted ones.

Lossless by construction: whether a step drafts is decided before the step from earlier
steps only, and a verify that admits no draft token emits the target's own sample.  The
placeholder drafts are the anchor repeated, with a one-hot draft distribution
(``greedy_draft``): were a graph-tier alignment ever to admit one, speculative sampling
would still accept it with the target's probability, exactly.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from sglang.srt.speculative.dspark_components.dspark_draft import (
    DraftBlockResult,
    DraftProposal,
    make_next_draft_input,
    resolve_draft_params,
)
from sglang.srt.speculative.dspark_components.dspark_verify import verify_logits_adjustments_are_noop

__all__ = ["NullProposer", "AnchorCommit", "DecodeForward", "PlainDecodeStep", "anchor_slots_mapped",
           "publish_without_confidence", "no_draft_refusal"]

logger = logging.getLogger(__name__)


class NullProposer:
    """Stands in for SGLang's ``DraftBlockProposer`` during one no-draft step: same
    ``propose`` contract, no draft forward.  Every other attribute is the real proposer's."""

    is_null = True      # per-step recorders of drafts skip its steps (sglang_dspark.capture)

    def __init__(self, inner) -> None:
        self.inner = inner
        self.steps = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, *, batch, draft_input, verify_window, bs, device, target_model,
                sampling_info, anchor_prepared: bool = False) -> DraftProposal:
        del batch, verify_window, target_model
        inner = self.inner
        gamma = int(inner.gamma)
        if anchor_prepared:      # SGLang already wrote the anchors into column 0
            ids = inner.draft_block_ids_view(bs=bs, device=device)
        else:
            ids = torch.full((bs, int(inner.query_token_num)), int(inner._mask_token_id),
                             dtype=torch.long, device=device)
            ids[:, 0] = draft_input.bonus_tokens.view(-1).to(torch.long)
        params = resolve_draft_params(sampling_info=sampling_info, bs=bs, device=device)
        block = DraftBlockResult(
            draft_tokens=ids[:, :1].expand(bs, gamma).contiguous(),
            corrected_logits=None, greedy_mask=params.greedy_mask,
            temperatures=params.temperatures, greedy_draft=True)
        self.steps += 1
        return DraftProposal(
            draft_block_ids=ids if inner.sample_from_anchor else ids[:, :gamma].contiguous(),
            draft_block=block,
            # zeros: SGLang's budget path needs a confidence; the budget is 0 whatever it says
            confidence=torch.zeros((bs, gamma), dtype=torch.float32, device=device),
            confidence_raw=None, folded=False, verify_ids=None)


class AnchorCommit:
    """The draft-context commit of no-draft steps: the anchors only, batched.

    SGLang's compact commit (``TargetHiddenKvInjector.inject_ragged``) projects every row
    of the strided verify window (``R x (gamma + 1)``) through the draft's context
    projection and gates the write by the commit lengths; a no-draft step commits one row
    per request, its anchor.  This keeps those ``R`` rows (a copy of the anchors' target
    hidden states, draft-pool slots and positions) and projects them later, many steps in
    one call (``flush``: the same ``inject_target_hidden`` call SGLang's non-compact commit
    makes): a projection of a few rows costs about what one row costs, and a run of no-draft
    steps pays it once.

    A prefill's rows join them (:meth:`install_prefill`, :meth:`prefill`): at one request a
    projection per request for its prompt and another for the anchors of the off steps
    before it were 1-2.5% of the scheduler's py-spy samples.

    Rule: every pending row lands before anything reads or rewrites the draft's KV.  The
    worker flushes before every drafted step (it drafts from the context) and before any
    forward other than a decode step, prefill or extend; a prefill or extend queues its
    rows behind the pending ones, or, where SGLang must write them at once (too many rows
    among them), flushes first; ``__call__`` flushes once ``max_rows`` rows wait.  A slot
    freed between two no-draft steps (a request finished) and handed to another request
    (its prompt or its next token) appears twice in the pending rows;
    the later row is the live one and is the one written (``_latest``).  The rows depend on
    nothing but their own hidden state and position, so the write is the one the steps would
    have made.  Installed on the verify executor for each no-draft step; the pools whose
    commit SGLang routes elsewhere (the MLA/SWA radix path, SWA rings) and the non-compact
    verify keep SGLang's own commit, at once."""

    def __init__(self, executor, injector, max_rows: int = 256) -> None:
        if max_rows < 1:
            raise ValueError(f"AnchorCommit max_rows={max_rows}: must be >= 1")
        self.original = executor.commit_hidden
        self.injector = injector
        self.max_rows = int(max_rows)
        self._supported = None    # read at the first step: the draft's KV pool exists by then
        self._pending: list[tuple] = []
        self._rows = 0
        self.steps = 0
        self.prefills = 0
        self.flushes = 0

    @property
    def supported(self) -> bool:
        if self._supported is None:
            pool = self.injector.draft_model_runner.token_to_kv_pool
            self._supported = (self.injector.swa_ring_size is None
                               and not hasattr(pool, "set_swa_key_buffer_radix_fused_norm_rope"))
        return self._supported

    @property
    def pending_rows(self) -> int:
        return self._rows

    def __call__(self, *, batch, layout, hidden_strided, verify_window, logits_output, commit_lens, bs,
                 run_compact):
        if not (self.supported and run_compact and hidden_strided is not None):
            self.flush()
            return self.original(batch=batch, layout=layout, hidden_strided=hidden_strided,
                                 verify_window=verify_window, logits_output=logits_output,
                                 commit_lens=commit_lens, bs=bs, run_compact=run_compact)
        stride = int(verify_window.verify_cache_loc_2d.shape[1])
        self.keep(hidden_strided.view(bs, stride, -1)[:, 0], verify_window)

    def install_prefill(self) -> None:
        """Route SGLang's prefill write into the draft's context KV (``inject_prefill`` of the
        injector, for this worker's injector only) through :meth:`prefill`."""
        injector = self.injector
        original = type(injector).inject_prefill

        def inject_prefill(placement, *, target_hidden, token_indices, target_hidden_is_projected):
            if not self.prefill(placement, target_hidden=target_hidden, token_indices=token_indices,
                                target_hidden_is_projected=target_hidden_is_projected):
                self.flush()
                original(injector, placement, target_hidden=target_hidden, token_indices=token_indices,
                         target_hidden_is_projected=target_hidden_is_projected)

        injector.inject_prefill = inject_prefill

    def prefill(self, placement, *, target_hidden, token_indices, target_hidden_is_projected) -> bool:
        """Keep a prefill's rows with the pending ones (the same rule: they land before
        anything reads the draft's KV), or return False, keeping nothing, where SGLang must
        write them now: a pool this does not support, a placement with SWA ring state or SWA
        rows, rows already projected, or more rows than ``max_rows`` with the pending ones."""
        if (not self.supported or target_hidden_is_projected or placement.state_slot is not None
                or placement.final_pos is not None or placement.swa_loc is not None):
            return False
        if token_indices is not None:
            placement = placement.select(token_indices)
        n = int(placement.positions.shape[0])
        if self._rows + n > self.max_rows:
            return False
        if n:
            self._queue(target_hidden[:n], placement.cache_loc, placement.positions)
            self.prefills += 1
        return True

    def _queue(self, hidden: torch.Tensor, cache_loc: torch.Tensor, positions: torch.Tensor) -> None:
        """Append rows (copies: the step's buffers are rewritten by the next step; slots and
        positions as int64, so rows of both kinds concatenate)."""
        self._pending.append((hidden.clone(), cache_loc.to(torch.int64).clone(), positions.to(torch.int64).clone()))
        self._rows += int(hidden.shape[0])

    def keep(self, hidden: torch.Tensor, verify_window) -> None:
        """Keep one no-draft step's anchor rows: ``hidden`` (one target hidden row per
        request) and the first column of ``verify_window`` (the anchors' slots and
        positions); flush once ``max_rows`` wait."""
        bs = int(hidden.shape[0])
        stride = int(verify_window.verify_cache_loc_2d.shape[1])
        cache_loc = self.injector.ids_for(verify_window.kv_loc_plan).view(bs, stride)[:, 0]
        self._queue(hidden, cache_loc, verify_window.positions_2d[:, 0])
        self.steps += 1
        if self._rows >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        """Project and write every pending row (one call), then forget them."""
        if not self._pending:
            return
        pending, self._pending, self._rows = self._pending, [], 0
        if len(pending) == 1:
            hidden, cache_loc, positions = pending[0]
        else:
            hidden, cache_loc, positions = (torch.cat(x) for x in zip(*pending))
            keep = _latest(cache_loc)
            if keep is not None:
                hidden, cache_loc, positions = hidden[keep], cache_loc[keep], positions[keep]
        self.injector.inject_target_hidden(target_hidden=hidden, cache_loc=cache_loc, positions=positions)
        self.flushes += 1


def _latest(slots: torch.Tensor) -> Optional[torch.Tensor]:
    """Indices that keep only the last occurrence of each slot in ``slots`` (in order), or
    None when every slot occurs once."""
    n = int(slots.shape[0])
    order = torch.arange(n, device=slots.device)
    last = torch.full((int(slots.max()) + 1,), -1, dtype=order.dtype, device=slots.device)
    last.scatter_reduce_(0, slots.long(), order, reduce="amax")
    keep = last[slots.long()] == order
    return None if bool(keep.all()) else keep.nonzero().view(-1)


def publish_without_confidence(on_publish):
    """SGLang's publish callback minus the confidence: a no-draft step's placeholder
    confidences must never reach the overlap scheduler's relay."""
    if on_publish is None:
        return None

    def publish(new_seq_lens, confidence=None):
        del confidence
        return on_publish(new_seq_lens)

    return publish


def no_draft_refusal() -> str:
    """Why no-draft steps cannot run on this server, or "".

    * DP attention: the attention-DP ranks agree on each step's verify tier and join the
      draft's collectives together, and whether a step drafts is decided per rank;
    * SGLang's draft-quality recorders (block-accept estimate, STS collection) would
      record the placeholder drafts."""
    from sglang.srt.environ import envs
    from sglang.srt.runtime_context import get_parallel

    if get_parallel().attn_dp_enabled:
        return "DP attention is on (every rank must draft or not together; not coordinated yet)"
    on = [name for name in ("SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH", "SGLANG_DSPARK_STS_COLLECT_PATH")
          if getattr(envs, name).get()]
    return f"{', '.join(on)} set (it records drafts)" if on else ""


def anchor_slots_mapped(req_to_token, req_pool_indices, seq_lens, cache_loc) -> bool:
    """Whether each request's next position (``seq_lens``) maps to its anchor's verify slot
    (``cache_loc``) in ``req_to_token``: what a decode-mode forward reads the anchor's KV
    through."""
    rows = req_pool_indices.long()
    got = req_to_token[rows, seq_lens.long()]
    return bool(torch.equal(got.to(cache_loc.dtype), cache_loc))


class DecodeForward:
    """The target forward of a compact no-draft step, run as SGLang's ordinary decode.

    A compact no-draft step verifies one token per request: the anchor, at the request's
    next position, in the first slot of its verify window.  That is a decode step's
    forward, so this runs it in ``ForwardMode.DECODE`` (the attention backend's decode
    kernels and metadata instead of the extend kernels a one-token verify uses) and hands
    SGLang's verify the same logits and hidden states.  Installed on the verify executor
    as ``_run_ragged`` for the step; the rest of the verify (logits adjustments,
    acceptance, the commit into the draft's KV) is SGLang's.

    Only where the target runs eagerly on CPU (:meth:`for_executor`): SGLang captures the
    target's graphs for the verify mode, so on a graph-backed GPU a decode-mode forward
    would run outside them and the graph-replayed one-token verify stays; an eager GPU
    target (``--disable-cuda-graph``) keeps the verify too until the route is verified
    on a GPU's attention backends.  The first step
    checks that each anchor's slot is where a decode forward reads it (SGLang's verify
    window maps the window's slots in ``req_to_token``); if not, the route is dropped for
    good with a warning and SGLang's verify runs (one host read, at the first step only)."""

    def __init__(self, executor) -> None:
        self.executor = executor
        self.steps = 0
        self.dropped = ""       # why the route was dropped at its first step, or ""
        self._checked = False

    @classmethod
    def for_executor(cls, executor) -> tuple[Optional["DecodeForward"], str]:
        """(the route, "") where the target runs eagerly, else (None, why not)."""
        runner = executor.target_worker.model_runner
        if getattr(runner, "decode_cuda_graph_runner", None) is not None:
            return None, "the target replays graphs captured for the verify (a one-token verify stays)"
        if torch.device(runner.device).type != "cpu":
            return None, ("the decode-forward route is verified on CPU only; an eager GPU target "
                          "keeps the one-token verify")
        return cls(executor), ""

    def usable(self, batch, cache_loc) -> bool:
        """False once the first step found the anchors' slots (``cache_loc``, one per
        request) unmapped in ``req_to_token`` (checked once)."""
        if not self._checked:
            self._checked = True
            runner = self.executor.target_worker.model_runner
            if not anchor_slots_mapped(runner.req_to_token_pool.req_to_token, batch.req_pool_indices,
                                       batch.seq_lens, cache_loc):
                self.dropped = "req_to_token does not map the anchors' verify slots"
                logger.warning("sglang-dspark: no-draft steps verify one token per request instead of "
                               "a decode forward: %s", self.dropped)
        return not self.dropped

    def __call__(self, *, batch, layout, ragged_window, sampling_info, kv_loc_plan):
        """The verify executor's ``_run_ragged`` for one no-draft step."""
        from sglang.srt.speculative.dspark_components.dspark_verify import TargetVerifyResult

        if not self.usable(batch, ragged_window.verify_cache_loc):     # SGLang's one-token verify
            return type(self.executor)._run_ragged(self.executor, batch=batch, layout=layout,
                                                   ragged_window=ragged_window,
                                                   sampling_info=sampling_info, kv_loc_plan=kv_loc_plan)
        out = self.forward(batch, ids=ragged_window.verify_ids, cache_loc=ragged_window.verify_cache_loc,
                           kv_loc_plan=kv_loc_plan, write_cols=ragged_window.window_index, sample=False)
        return TargetVerifyResult(logits_output=out.logits_output, can_run_cuda_graph=False)

    def forward(self, batch, *, ids, cache_loc, kv_loc_plan, write_cols, sample: bool):
        """SGLang's decode forward of ``ids`` (one token per request, written at
        ``cache_loc``: the ``write_cols`` of ``kv_loc_plan``), target hidden states
        captured; with ``sample`` SGLang's ordinary sampler also draws ``next_token_ids``.
        ``batch`` is left as it was."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        runner = self.executor.target_worker.model_runner
        fields = ("input_ids", "spec_info", "forward_mode", "out_cache_loc", "seq_lens",
                  "seq_lens_cpu", "seq_lens_sum")
        saved = [getattr(batch, f) for f in fields]
        try:
            bs = int(batch.seq_lens.shape[0])
            batch.input_ids = ids
            batch.out_cache_loc = cache_loc
            batch.forward_mode = ForwardMode.DECODE
            batch.spec_info = None
            batch.seq_lens = batch.seq_lens + 1               # a decode step's lengths count its token
            if batch.seq_lens_cpu is not None:
                batch.seq_lens_cpu = batch.seq_lens_cpu + 1
            if batch.seq_lens_sum is not None:
                batch.seq_lens_sum = int(batch.seq_lens_sum) + bs
            forward_batch = ForwardBatch.init_new(
                batch, runner, capture_hidden_mode=CaptureHiddenMode.FULL,
                return_hidden_states_before_norm=False, kv_loc_plan=kv_loc_plan,
                write_cols=write_cols)
            out = self.executor.target_worker.forward_batch_generation(
                batch=None, forward_batch=forward_batch, is_verify=not sample)
        finally:
            for f, v in zip(fields, saved):
                setattr(batch, f, v)
        self.steps += 1
        return out


class PlainDecodeStep:
    """A whole compact no-draft step as plain decoding, without SGLang's verify.

    Where :class:`DecodeForward` runs (an eager CPU target) a compact no-draft step is a
    decode step: SGLang's decode forward of the anchors and SGLang's ordinary sampler (the
    one non-speculative decoding runs: same logits, same temperature / top-k / top-p /
    min-p handling), so the token committed is the target's own sample, as a verify that
    admits no draft emits.  What remains of SGLang's speculative step is what the next
    step needs: the verify window's slots and positions (``alloc_verify_window``: the
    anchor is written where the verify would write it), the anchors' hidden rows kept for
    :class:`AnchorCommit`, the published lengths, and a result of one token per request
    (``accept_lens`` 1, output stride 1) with the next draft input.  SGLang's proposer,
    verify layout, compact-to-strided scatter and acceptance do not run.

    Steps that need SGLang's verify keep the verify route (:meth:`usable`): a grammar,
    logprobs, hidden states returned, logits adjustments (penalties, logit bias, custom
    processors), a draft pool whose commit SGLang routes elsewhere; and, for the server's
    life (:meth:`for_worker`), a target with mamba/KDA states or an n-gram embedding
    (their verify commits), simulated acceptance."""

    def __init__(self, worker, decode_forward: DecodeForward, anchor_commit: AnchorCommit) -> None:
        self.worker = worker
        self.decode_forward = decode_forward
        self.anchor_commit = anchor_commit
        self.steps = 0

    @classmethod
    def for_worker(cls, worker) -> tuple[Optional["PlainDecodeStep"], str]:
        """(the step, "") where every no-draft step of ``worker`` may run as plain
        decoding, else (None, why not)."""
        forward, commit = worker._decode_forward, worker._anchor_commit
        if forward is None or commit is None:
            return None, "no decode-forward route (a graph-backed or GPU target keeps the verify)"
        if worker._need_mamba_verify_commit:
            return None, "the target keeps mamba/KDA states (SGLang's verify commits them)"
        ngram = getattr(worker.model_runner, "ngram_embedding_manager", None)
        if getattr(ngram, "engram_hasher", None) is not None:
            return None, "the target has an n-gram embedding (SGLang's verify commits its history)"
        if worker._simulate_acc_greedy or worker._sim_draw_ahead:
            return None, "simulated acceptance is on"
        return cls(worker, forward, commit), ""

    def usable(self, batch) -> bool:
        """Whether this batch's no-draft step may run as plain decoding (host flags only)."""
        return (batch.spec_info is not None and self.anchor_commit.supported
                and not self.decode_forward.dropped
                and not batch.has_grammar and not batch.return_logprob
                and not getattr(batch, "return_hidden_states", False)
                and verify_logits_adjustments_are_noop(batch.sampling_info))

    def __call__(self, batch, on_publish):
        """Run the step and return SGLang's ``GenerationBatchResult`` for it, or None
        (nothing run) when the first step finds the anchors' slots unmapped
        (:meth:`DecodeForward.usable`)."""
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.dspark_components.dspark_planner import alloc_verify_window

        w = self.worker
        draft_input = batch.spec_info
        bs = int(batch.seq_lens.shape[0])
        width = int(w.verify_num_draft_tokens)
        window = alloc_verify_window(
            batch=batch, bs=bs, device=w.device, verify_num_draft_tokens=width,
            block_pos_offsets=w._block_pos_offsets, model_runner=w.model_runner,
            seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu)
        cache_loc = window.verify_cache_loc_2d[:, 0]
        if not self.decode_forward.usable(batch, cache_loc):
            return None     # found at the first step; SGLang's verify runs from now on
        # SGLang's budget resolution, as a verify step makes it (without overlap scheduling
        # the planner decides here: a no-draft step, budget 0)
        w._verify_planner.resolve_verify_token_budget(
            draft_input=draft_input,
            confidence=torch.zeros((bs, width - 1), dtype=torch.float32, device=batch.seq_lens.device),
            prefix_lens=batch.seq_lens, req_pool_indices=batch.req_pool_indices)
        out = self.decode_forward.forward(
            batch, ids=draft_input.bonus_tokens.view(-1), cache_loc=cache_loc,
            kv_loc_plan=window.kv_loc_plan, write_cols=slice(0, 1), sample=True)
        logits_output, tokens = out.logits_output, out.next_token_ids
        new_seq_lens = batch.seq_lens + 1
        if on_publish is not None:
            on_publish(new_seq_lens)
        self.anchor_commit.keep(logits_output.hidden_states, window)
        logits_output.hidden_states = None
        ones = torch.ones((bs,), dtype=torch.int32, device=tokens.device)
        self.steps += 1
        return GenerationBatchResult(
            logits_output=logits_output, next_token_ids=tokens, accept_lens=ones,
            block_accept_lens=ones, cap_lens=ones, can_run_cuda_graph=False,
            next_draft_input=make_next_draft_input(bonus_tokens=tokens, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=width, speculative_output_stride=1,
            new_seq_lens=new_seq_lens)
