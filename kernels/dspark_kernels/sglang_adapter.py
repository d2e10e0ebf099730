"""Drop-in for the draft stage of SGLang 0.5.23's DSpark worker.

It replaces this pair of calls (both in
``sglang/srt/speculative/dspark_components/``):

* ``dspark_draft.draft_markov_block(markov_head=, base_logits=, anchor_tokens=,
  draft_hidden=, step_temperatures=, noise=, tp_sync=, logits_out=, greedy_draft=)``
  -> ``(draft_tokens [bs, gamma] int64, step_logits [bs, gamma, V] | None)``
  (called from ``sample_draft_block`` in the eager ``DraftBlockProposer.propose``
  path and from ``DsparkDraftSampler._markov_block`` in the draft-graph tail), and
* ``DSparkDraftMixin.compute_confidence(anchor_tokens=, draft_tokens=,
  confidence_features=)`` = ``DSparkConfidenceHead.predict`` ->
  ``(confidence [bs, gamma] fp32, confidence_raw [bs, gamma] proj dtype)``

with one call, :func:`draft_block_with_confidence`, whose result carries the same
tensors (plus ``draft_probs``). Like ``draft_markov_block`` it allocates
``step_logits`` when sampling without a ``logits_out`` and advances
``noise.offset`` by one after a sampled block. With backend ``upstream`` (or when
the fused path does not apply) it calls SGLang's own two functions.

The fused path applies when the Markov head's bias is exactly
``markov_w1(prev) @ markov_w2.weight.T`` over the whole vocab, i.e. when
``markov_head.greedy_w2_weight()`` is not None (plain ``VanillaMarkov``, not
TP-sharded, not the quantized Nemotron head, not gated/RNN) and ``w2`` covers the
base-logit width.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Optional

import torch

from dspark_kernels.api import sequential_head
from dspark_kernels.backend import select_backend
from dspark_kernels.contract import step_dtype_for

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class DraftBlockOutputs(NamedTuple):
    # [bs, gamma] int64 (DraftBlockResult.draft_tokens)
    draft_tokens: torch.Tensor
    # [bs, gamma, V] step logits (DraftBlockResult.corrected_logits); None for a greedy draft
    step_logits: Optional[torch.Tensor]
    # [bs, gamma] fp32 / proj dtype; None without a confidence head
    confidence: Optional[torch.Tensor]
    confidence_raw: Optional[torch.Tensor]
    # [bs, gamma] fp32 p_d(x_k); None on the upstream path
    draft_probs: Optional[torch.Tensor]
    # the backend that ran: "triton", "torch" or "upstream"
    backend: str


def fused_path_unsupported_reason(*, markov_head, base_logits: torch.Tensor) -> Optional[str]:
    """Why the fused op cannot stand in for this Markov head, or None if it can."""
    greedy_w2 = getattr(markov_head, "greedy_w2_weight", None)
    if greedy_w2 is None:
        return f"{type(markov_head).__name__} has no greedy_w2_weight()"
    w2 = greedy_w2()
    if w2 is None:
        return (
            f"{type(markov_head).__name__}'s bias is not a plain w1/w2 GEMV over the whole "
            "vocab (gated/RNN head, quantized w2, or TP-sharded w2)"
        )
    w1 = markov_head.markov_w1.weight
    if w2.shape[0] != base_logits.shape[-1]:
        return f"markov_w2 has {w2.shape[0]} rows but base logits have {base_logits.shape[-1]} columns"
    if w1.dtype != w2.dtype or w1.shape[1] != w2.shape[1]:
        return "markov_w1 / markov_w2 dtype or rank mismatch"
    if base_logits.shape[1] > 16:
        return f"gamma={base_logits.shape[1]} > 16"
    return None


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("dspark_kernels: %s; using SGLang's own draft path.", message)


def _upstream(
    *,
    markov_head,
    confidence_head,
    base_logits,
    anchor_tokens,
    draft_hidden,
    confidence_features,
    step_temperatures,
    noise,
    tp_sync,
    greedy_draft,
    logits_out,
) -> DraftBlockOutputs:
    from sglang.srt.speculative.dspark_components.dspark_draft import draft_markov_block

    tokens, step_logits = draft_markov_block(
        markov_head=markov_head,
        base_logits=base_logits,
        anchor_tokens=anchor_tokens,
        draft_hidden=draft_hidden,
        step_temperatures=step_temperatures,
        noise=noise,
        tp_sync=tp_sync if tp_sync is not None else _NoTpSync(),
        logits_out=logits_out,
        greedy_draft=greedy_draft,
    )
    confidence = confidence_raw = None
    if confidence_head is not None:
        confidence, confidence_raw = confidence_head.predict(
            confidence_features,
            anchor_tokens=anchor_tokens,
            draft_tokens=tokens,
            markov_head=markov_head,
        )
    return DraftBlockOutputs(tokens, step_logits, confidence, confidence_raw, None, "upstream")


class _NoTpSync:
    def sync(self, site, values):
        del site
        return values


def draft_block_with_confidence(
    *,
    markov_head,
    confidence_head,
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    confidence_features: Optional[torch.Tensor],
    step_temperatures: torch.Tensor,
    noise,
    greedy_draft: bool,
    draft_hidden: Optional[torch.Tensor] = None,
    tp_sync=None,
    logits_out: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    compute_draft_probs: bool = False,
) -> DraftBlockOutputs:
    """One call for SGLang's Markov draft walk and confidence scoring.

    Args (keyword-only; names as in SGLang's DSpark draft stage):
        markov_head: ``draft_model.markov_head``.
        confidence_head: ``draft_model.confidence_head`` (``DSparkConfidenceHead``) or None.
        base_logits: ``[bs, gamma, V]`` from ``compute_base_logits(...)[0].view(bs, gamma, -1)``.
        anchor_tokens: ``[bs]`` (``draft_block_ids[:, 0]``).
        confidence_features: the second output of ``compute_base_logits``
            (``[bs * gamma, H]`` or ``[bs, gamma, H]``); unused without a confidence head.
        step_temperatures: ``[bs]`` fp32 (``DraftParams.step_temperatures``; 0 = argmax row).
        noise: ``DraftNoise`` (``key`` int, ``offset`` ``[1]`` int64 device tensor).
        greedy_draft: the worker's ``greedy_draft`` flag.
        draft_hidden: ``[bs, gamma, H]``; only SGLang's gated/RNN heads read it.
        tp_sync: ``SpecTpSync``; the fused path broadcasts the whole token block once
            (SGLang broadcasts after every step).
        logits_out: ``[bs, gamma, V]`` step-logits buffer (graph-static), as SGLang's.
        backend: None = :func:`select_backend` (env ``SGLANG_DSPARK_FUSED_SEQ_HEAD``);
            or ``triton`` / ``torch`` / ``upstream``.
        compute_draft_probs: also return ``p_d(x_k)`` (fused paths only).
    """
    if backend is None:
        backend = select_backend(device=base_logits.device)
    if backend not in ("triton", "torch", "upstream"):
        raise ValueError(f"backend must be triton, torch or upstream, got {backend!r}.")
    bs, gamma, vocab = base_logits.shape
    if backend != "upstream":
        reason = fused_path_unsupported_reason(markov_head=markov_head, base_logits=base_logits)
        if reason is not None:
            _warn_once(reason)
            backend = "upstream"
    if backend == "upstream":
        return _upstream(
            markov_head=markov_head,
            confidence_head=confidence_head,
            base_logits=base_logits,
            anchor_tokens=anchor_tokens,
            draft_hidden=draft_hidden,
            confidence_features=confidence_features,
            step_temperatures=step_temperatures,
            noise=noise,
            tp_sync=tp_sync,
            greedy_draft=greedy_draft,
            logits_out=logits_out,
        )

    w1 = markov_head.markov_w1.weight
    w2 = markov_head.greedy_w2_weight()
    if not greedy_draft and logits_out is None:
        logits_out = torch.empty(
            (bs, gamma, vocab),
            dtype=step_dtype_for(base_logits.dtype, w1.dtype),
            device=base_logits.device,
        )
    conf_kwargs = {}
    if confidence_head is not None:
        if confidence_features is None:
            raise ValueError("a confidence head needs confidence_features.")
        proj = confidence_head.proj
        conf_kwargs = dict(
            hidden=confidence_features.reshape(bs, gamma, -1),
            conf_weight=proj.weight.reshape(-1),
            conf_bias=proj.bias,
            conf_with_markov=bool(confidence_head.with_markov),
            sts_temperatures=confidence_head.sts_temperatures,
        )
    out = sequential_head(
        base_logits=base_logits,
        anchor_tokens=anchor_tokens,
        w1=w1,
        w2=w2,
        temperatures=step_temperatures.to(torch.float32),
        seed=int(noise.key),
        offset=noise.offset,
        greedy=greedy_draft,
        logits_out=None if greedy_draft else logits_out,
        compute_draft_probs=compute_draft_probs,
        backend=backend,
        **conf_kwargs,
    )
    tokens = out.tokens
    if tp_sync is not None:
        from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

        tokens = tp_sync.sync(SpecTpSyncSite.DSPARK_DRAFT, tokens)
    if not greedy_draft:
        noise.offset.add_(1)
    return DraftBlockOutputs(
        tokens,
        None if greedy_draft else logits_out,
        out.confidence,
        out.confidence_raw,
        out.draft_probs,
        backend,
    )
