"""Sampling penalties under DSPARK: repetition, frequency, presence, ``min_new_tokens``;
and the verify's ``min_p``, top-k and top-p.

SGLang 0.5.23's DSpark applies none of them (docs/worker.md, "Sampling penalties"): its
decode preparation never feeds the penalizers a committed token, and its verify adds one
additive vector to every position of a block, applies a multiplicative penalty to zeros,
and reads the overlap scheduler's precomputed penalties under a field name
(``acc_linear_penalties``) that 0.5.23's ``SamplingBatchInfo`` never sets.  The rules here:

* **The penalizers see the committed tokens** (:func:`feed_committed`, an AFTER hook on
  ``DFlashDraftInputV2.prepare_for_decode`` under DSPARK): each decode step feeds the
  batch's last output token per request, as SGLang's plain decode preparation does
  (``ScheduleBatch.cumulate_penalty_output_tokens``).  A step that commits one token per
  request leaves the penalizers exactly as plain decoding would; a drafted step's other
  accepted tokens are not fed (EAGLE's relaxed rule in SGLang), but ``min_new_tokens``
  counts them: its count is raised to the committed output length.
* **The verify penalises as plain decoding does** (:func:`penalised_adjustments`, AROUND
  hooks on both of SGLang's DSpark verify adjustments): every position of the verify
  block gets the precomputed additive and scaling penalties of the forward's copy of the
  sampling info (``SamplingBatchInfo.copy_for_forward``, which SGLang 0.5.23 makes for
  every forward, so its DSpark verify never sees the orchestrator; where one is still
  there, the penalizers' own transform),
  ``min_new_tokens`` position by position (:func:`stash_min_new_tokens`: position k is
  generated token ``count + k``), and SGLang's adjustment then runs without them (its
  custom processors, grammar mask and logit bias).
* **A batch with a penalty decodes without drafts** (:func:`needs_plain_decoding`; the
  worker's no-draft step, reason ``penalties``): position k of a drafted block would need
  the counts of drafts 1..k-1, which no verify here applies, so only one position per
  step is exact.  With it, greedy output with a penalty equals plain decoding's token for
  token in ``compact`` and ``cap-accept`` mode (up to the verify forward's rounding where a
  no-draft step is SGLang's verify: docs/worker.md).  Where a step must draft (SGLang's
  ``static`` mode, no no-draft route) the drafts are verified under the relaxed penalty:
  every position penalised as the block's first.

* **``min_p`` is applied in the verify**: SGLang 0.5.23's DSpark verify ignores it (its
  target distribution applies temperature, top-k and top-p only), so a sampled request
  with ``min_p`` drew tokens plain decoding never draws. Plain decoding's sampler keeps a
  token whose probability is at least ``min_p`` times the most likely token's, a ratio no
  top-k or top-p cut (each keeps the most likely token) or renormalisation changes. So:
  a request with ``top_p`` 1 has its target logits masked below that ratio after every
  other adjustment (:func:`_mask_below_min_p`, in the same hooks, or, in a batch with a
  grammar, after SGLang's grammar mask: :func:`min_p_after_grammar`), which every verify
  route reads and the verify's top-k commutes with; a request with ``top_p`` below 1 has
  the verify's target probabilities masked after its top-k and top-p cuts and
  renormalised (:func:`verify_target_probs`, an AROUND hook on
  ``build_speculative_verify_target_probs``, the only route of a batch with top-p),
  since masking first would move the top-p cut.
* **Top-k with top-p is plain decoding's joint rule** (:func:`verify_target_probs`):
  SGLang's verify renormalises over the top k before its top-p cut, so it kept fewer
  tokens than plain decoding, whose samplers (torch, and FlashInfer's ``joint`` order)
  cut both on the unfiltered probabilities.

Either way the rejection sampler accepts against plain decoding's distribution, drafts
or not.

Nothing here runs for a batch without penalties, ``min_p`` or ``top_p`` beyond a few
attribute checks per step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

__all__ = ["needs_plain_decoding", "feed_committed", "stash_min_new_tokens", "MinNewTokensAhead",
           "penalised_adjustments", "adjust_strided", "adjust_dflash", "verify_target_probs",
           "min_p_after_grammar"]


def needs_plain_decoding(sampling_info: Any) -> bool:
    """The batch has a request with a sampling penalty (the penalizers are required, or,
    under overlap scheduling, their precomputed penalties are set)."""
    if sampling_info is None:
        return False
    orch = getattr(sampling_info, "penalizer_orchestrator", None)
    return bool((orch is not None and orch.is_required)
                or getattr(sampling_info, "acc_additive_penalties", None) is not None
                or getattr(sampling_info, "acc_scaling_penalties", None) is not None)


@functools.lru_cache(maxsize=1)
def _is_dspark() -> bool:
    from sglang.srt.runtime_context import get_spec

    from sglang_dspark.seams import names_dspark

    return names_dspark(get_spec().speculative_algorithm)


def _min_new_tokens(orch: Any) -> Any:
    """The orchestrator's prepared ``min_new_tokens`` penalizer, or None."""
    from sglang.srt.sampling.penaltylib.min_new_tokens import BatchedMinNewTokensPenalizer

    pen = orch.penalizers.get(BatchedMinNewTokensPenalizer)
    return pen if pen is not None and pen.is_prepared() else None


def feed_committed(result: Any, draft_input: Any, batch: Any, *args, **kwargs) -> Any:
    """AFTER hook on ``DFlashDraftInputV2.prepare_for_decode(self, batch)``: feed the
    penalizers the batch's last committed token per request (DSPARK only), and give the
    ``min_new_tokens`` penalizer each request's committed output length where that is
    more than the tokens fed (a drafted step commits several)."""
    orch = getattr(getattr(batch, "sampling_info", None), "penalizer_orchestrator", None)
    if orch is not None and orch.is_required and batch.batch_size() > 0 and _is_dspark():
        batch.cumulate_penalty_output_tokens()
        mnt = _min_new_tokens(orch)
        if mnt is not None:
            import torch

            count = mnt.len_output_tokens
            lens = torch.tensor([len(r.output_ids) for r in batch.reqs], dtype=count.dtype)
            torch.maximum(count, lens.to(count.device, non_blocking=True)[:, None], out=count)
    return result


@dataclasses.dataclass(frozen=True)
class MinNewTokensAhead:
    """``min_new_tokens`` for a verify block, position by position: position k of request
    r is generated token ``count[r] + k``, held back from the stop tokens (``stop``, -inf
    there) while that is below ``minimum[r]``.  ``additive``: the step's other additive
    penalties (SGLang's precomputed sum without this one), or None."""

    count: Any          # [bs, 1] committed output length at the step
    minimum: Any        # [bs, 1]
    stop: Any           # [bs, vocab]
    additive: Any


def stash_min_new_tokens(original: Callable, info: Any, *args, **kwargs) -> Any:
    """AROUND hook on ``SamplingBatchInfo.copy_for_forward(self)`` (DSPARK only): the
    forward's copy carries :class:`MinNewTokensAhead` (attribute ``dspark_min_new``) when a
    request of the batch has ``min_new_tokens``, so the verify can mask each position as
    plain decoding masks that token instead of every position as the block's first."""
    out = original(info, *args, **kwargs)
    orch = info.penalizer_orchestrator
    if orch is None or not orch.is_required or out.acc_additive_penalties is None or not _is_dspark():
        return out
    mnt = _min_new_tokens(orch)
    if mnt is None:
        return out
    additive = None
    others = [p for p in orch.penalizers.values() if p is not mnt and not p.is_multiplicative
              and p.is_prepared()]
    if others:
        additive = out.acc_additive_penalties.new_zeros(out.acc_additive_penalties.shape)
        for pen in others:
            pen.apply(additive)
    out.dspark_min_new = MinNewTokensAhead(count=mnt.len_output_tokens.clone(), minimum=mnt.min_new_tokens,
                                           stop=mnt.stop_token_penalties, additive=additive)
    return out


def _penalise(logits_3d: Any, sampling_info: Any) -> None:
    """Plain decoding's penalties on every position of ``logits_3d`` ([bs, width, vocab])."""
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    orch = getattr(sampling_info, "penalizer_orchestrator", None)
    if orch is not None and orch.is_required:       # without overlap: the penalizers' own transform
        for k in range(logits_3d.shape[1]):
            orch.apply(logits_3d[:, k, :])
        return
    add = getattr(sampling_info, "acc_additive_penalties", None)
    scale = getattr(sampling_info, "acc_scaling_penalties", None)
    ahead = getattr(sampling_info, "dspark_min_new", None)
    if ahead is not None:
        import torch

        add = ahead.additive
        pos = torch.arange(logits_3d.shape[1], device=ahead.count.device, dtype=ahead.count.dtype)
        held = (ahead.count + pos[None, :]) < ahead.minimum                     # [bs, width]
        logits_3d.add_(torch.where(held[:, :, None], ahead.stop[:, None, :], 0.0).to(
            device=logits_3d.device, dtype=logits_3d.dtype))
    if add is not None:
        logits_3d.add_(add.to(device=logits_3d.device, dtype=logits_3d.dtype)[:, None, :])
    if scale is not None:
        apply_scaling_penalties(logits_3d, scale.to(device=logits_3d.device, dtype=logits_3d.dtype)[:, None, :])


def _mask_below_min_p(logits_3d: Any, sampling_info: Any) -> None:
    """Plain decoding's ``min_p`` on every position of ``logits_3d`` ([bs, width, vocab])
    of the requests with ``top_p`` 1: a token whose probability at the request's
    temperature is below ``min_p`` times the position's most likely token's gets ``-inf``
    (``l < l_max + T ln min_p``); other rows are untouched (``min_p`` 0, or ``top_p`` below
    1: :func:`verify_target_probs` masks those after the top-p cut)."""
    import torch

    min_ps = sampling_info.min_ps.to(device=logits_3d.device, dtype=torch.float32).view(-1, 1, 1)
    temps = sampling_info.temperatures.to(device=logits_3d.device, dtype=torch.float32).view(-1, 1, 1)
    top_ps = sampling_info.top_ps.to(device=logits_3d.device).view(-1, 1, 1)
    margin = torch.where((min_ps > 0) & (top_ps >= 1), temps * torch.log(min_ps.clamp(min=1e-30)),
                         torch.full_like(min_ps, float("-inf")))
    threshold = logits_3d.amax(dim=-1, keepdim=True).float() + margin          # [bs, width, 1]
    logits_3d.masked_fill_(logits_3d < threshold, float("-inf"))


def _renorm_below_min_p(probs_3d: Any, sampling_info: Any) -> None:
    """Plain decoding's ``min_p`` on the verify's target probabilities ``probs_3d`` ([bs,
    width, vocab], after top-k and top-p) of the requests with ``min_p`` and ``top_p``
    below 1: a probability below ``min_p`` times the position's largest becomes 0 and the
    row is renormalised; other rows are left bit for bit."""
    import torch

    min_ps = sampling_info.min_ps.to(device=probs_3d.device, dtype=probs_3d.dtype).view(-1, 1, 1)
    top_ps = sampling_info.top_ps.to(device=probs_3d.device).view(-1, 1, 1)
    rows = (min_ps > 0) & (top_ps < 1)                                          # [bs, 1, 1]
    probs_3d.masked_fill_(rows & (probs_3d < probs_3d.amax(dim=-1, keepdim=True) * min_ps), 0.0)
    probs_3d.div_(torch.where(rows, probs_3d.sum(dim=-1, keepdim=True), torch.ones_like(min_ps)))


def _joint_top_k_top_p(next_token_logits: Any, sampling_info: Any, draft_token_num: int, bs: int,
                       max_top_k: Any = None) -> Any:
    """The verify's target probabilities ([bs, draft_token_num, vocab]) under plain
    decoding's top-k and top-p rule: a token is kept if its rank is below ``top_k`` and the
    probability ranked above it, on the unfiltered distribution at the request's
    temperature, is at most ``top_p``; the kept tokens are renormalised."""
    import torch

    scaled = next_token_logits / torch.repeat_interleave(sampling_info.temperatures, draft_token_num, dim=0)
    vocab = int(scaled.shape[-1])
    top_ks = torch.repeat_interleave(sampling_info.top_ks, draft_token_num, dim=0).to(
        device=scaled.device, dtype=torch.int64).clamp(1, vocab)
    top_ps = torch.repeat_interleave(sampling_info.top_ps, draft_token_num, dim=0).to(scaled.device)
    k = min(max(int(max_top_k if max_top_k is not None else top_ks.max()), 1), vocab)
    top_l, top_i = torch.topk(scaled, k, dim=-1)                                   # sorted
    p = torch.exp(top_l - torch.logsumexp(scaled, dim=-1, keepdim=True))
    ranks = torch.arange(k, device=scaled.device)[None, :]
    keep = (ranks < top_ks[:, None]) & ((torch.cumsum(p, dim=-1) - p) <= top_ps[:, None])
    p = torch.where(keep, p, 0.0)
    out = torch.zeros_like(scaled, dtype=p.dtype).scatter_(1, top_i, p / p.sum(dim=-1, keepdim=True))
    return out.view(bs, draft_token_num, vocab)


def verify_target_probs(original: Callable, **kwargs) -> Any:
    """AROUND hook on SGLang's ``build_speculative_verify_target_probs`` (keyword-only
    arguments; returns [bs, width, vocab]), under DSPARK: a batch with top-k and top-p is
    cut by plain decoding's joint rule (:func:`_joint_top_k_top_p`; SGLang's verify cuts
    top-p after renormalising over the top k), and ``min_p`` is applied to the requests
    with ``top_p`` below 1 (:func:`_renorm_below_min_p`)."""
    info = kwargs.get("sampling_info")
    top_p = info is not None and getattr(info, "need_top_p_sampling", False)
    if not top_p or not _is_dspark():
        return original(**kwargs)
    if getattr(info, "need_top_k_sampling", True):
        out = _joint_top_k_top_p(kwargs["next_token_logits"], info, int(kwargs["draft_token_num"]),
                                 int(kwargs["bs"]), kwargs.get("max_top_k"))
    else:
        out = original(**kwargs)
    if getattr(info, "need_min_p_sampling", False):
        _renorm_below_min_p(out, info)
    return out


def _has_grammar(sampling_info: Any) -> bool:
    """The batch has a constrained request (``grammars``, set for every forward): SGLang's
    DSpark worker masks the verify logits by the grammar after the verify adjustments."""
    return bool(getattr(sampling_info, "grammars", None))


def min_p_after_grammar(original: Callable, **kwargs) -> Any:
    """AROUND hook on SGLang's DSpark ``accept_draft_tokens`` (keyword-only
    ``target_logits`` [bs * width, vocab], ``sampling_info``, ``verify_num_draft_tokens``):
    under DSPARK, ``min_p`` for a batch with a grammar (:func:`_mask_below_min_p`), on
    logits the grammar already masked. Plain decoding's ``min_p`` is relative to the most
    likely token the grammar allows; masked before the grammar (in the verify adjustments,
    as for other batches), a row could lose every token the grammar allows."""
    info = kwargs.get("sampling_info")
    if (info is not None and getattr(info, "need_min_p_sampling", False) and _has_grammar(info)
            and _is_dspark()):
        logits = kwargs["target_logits"]
        _mask_below_min_p(logits.view(len(info), int(kwargs["verify_num_draft_tokens"]), logits.shape[-1]), info)
    return original(**kwargs)


def penalised_adjustments(width_kw: str) -> Callable:
    """An AROUND hook for one of SGLang's DSpark verify adjustments (keyword-only
    arguments ``next_token_logits``, ``sampling_info`` and ``width_kw``, the block width):
    plain decoding's penalties first, then SGLang's adjustment without them, then
    ``min_p`` (:func:`_mask_below_min_p`), which plain decoding's sampler applies last (in
    a batch with a grammar, after the grammar mask instead: :func:`min_p_after_grammar`)."""

    def hook(original: Callable, **kwargs) -> Any:
        info = kwargs.get("sampling_info")
        min_p = info is not None and getattr(info, "need_min_p_sampling", False) and not _has_grammar(info)
        penalised = needs_plain_decoding(info)
        if not min_p and not penalised:
            return original(**kwargs)
        logits = kwargs["next_token_logits"]
        logits_3d = logits.view(len(info), int(kwargs[width_kw]), logits.shape[-1])
        if penalised:
            _penalise(logits_3d, info)
            kwargs["sampling_info"] = dataclasses.replace(
                info, penalizer_orchestrator=None, acc_additive_penalties=None, acc_scaling_penalties=None)
        out = original(**kwargs)
        if min_p:
            _mask_below_min_p(logits_3d, info)
        return out

    hook.__qualname__ = f"penalised_adjustments({width_kw})"
    return hook


adjust_strided = penalised_adjustments("verify_num_draft_tokens")   # the ragged verify's
adjust_dflash = penalised_adjustments("draft_token_num")            # the uniform verify's
