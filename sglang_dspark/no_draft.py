"""No-draft decode steps: a decode step that runs no draft forward.

When the policy decides that a step is better decoded without drafts
(:meth:`dspark_controller.core.policy.BudgetPolicy.draft_step`), the worker runs SGLang's
own decode step with :class:`NullProposer` in place of the draft proposer, for that one
step, and a verify budget of 0:

* no draft forward runs: the proposal is the anchor (the last committed token) and
  placeholder draft tokens that no verify window reaches;
* the target verifies only the anchor of each request (compact mode: a ragged layout of
  one token per request; cap-accept mode verifies its fixed window with acceptance capped
  at 0), samples the next token from the target's own distribution, and commits it;
* SGLang's commit writes the anchor's target hidden state into the draft's context KV,
  as after any zero-budget step, so the next drafted step drafts exactly what it would
  have drafted after a zero-budget step on the same context;
* no confidences are published: the lag relay keeps the last drafted ones.

Lossless by construction: whether a step drafts is decided before the step from earlier
steps only, and a verify that admits no draft token emits the target's own sample.  The
placeholder drafts are the anchor repeated, with a one-hot draft distribution
(``greedy_draft``): were a graph-tier alignment ever to admit one, speculative sampling
would still accept it with the target's probability, exactly.
"""

from __future__ import annotations

import torch
from sglang.srt.speculative.dspark_components.dspark_draft import (
    DraftBlockResult,
    DraftProposal,
    resolve_draft_params,
)

__all__ = ["NullProposer", "AnchorCommit", "publish_without_confidence", "no_draft_refusal"]


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
    """The draft-context commit of a no-draft step, projecting only what it commits.

    SGLang's compact commit (``TargetHiddenKvInjector.inject_ragged``) projects every row
    of the strided verify window (``R x (gamma + 1)``) through the draft's context
    projection and gates the write by the commit lengths; a no-draft step commits one row
    per request, its anchor.  This projects and writes those ``R`` rows only (the same
    ``inject_target_hidden`` call SGLang's non-compact commit makes, at the anchors'
    positions and cache slots).  Installed on the verify executor for the step; the pools
    whose commit SGLang routes elsewhere (the MLA/SWA radix path, SWA rings) and the
    non-compact verify keep SGLang's own commit."""

    def __init__(self, executor, injector) -> None:
        self.original = executor.commit_hidden
        self.injector = injector
        self._supported = None    # read at the first step: the draft's KV pool exists by then
        self.steps = 0

    @property
    def supported(self) -> bool:
        if self._supported is None:
            pool = self.injector.draft_model_runner.token_to_kv_pool
            self._supported = (self.injector.swa_ring_size is None
                               and not hasattr(pool, "set_swa_key_buffer_radix_fused_norm_rope"))
        return self._supported

    def __call__(self, *, batch, layout, hidden_strided, verify_window, logits_output, commit_lens, bs,
                 run_compact):
        if not (self.supported and run_compact and hidden_strided is not None):
            return self.original(batch=batch, layout=layout, hidden_strided=hidden_strided,
                                 verify_window=verify_window, logits_output=logits_output,
                                 commit_lens=commit_lens, bs=bs, run_compact=run_compact)
        stride = int(verify_window.verify_cache_loc_2d.shape[1])
        hidden = hidden_strided.view(bs, stride, -1)[:, 0]
        cache_loc = self.injector.ids_for(verify_window.kv_loc_plan).view(bs, stride)[:, 0]
        self.injector.inject_target_hidden(target_hidden=hidden.contiguous(), cache_loc=cache_loc.contiguous(),
                                           positions=verify_window.positions_2d[:, 0].contiguous())
        self.steps += 1


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
