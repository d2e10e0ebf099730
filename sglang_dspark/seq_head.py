"""Route SGLang's DSpark Markov draft walk through ``dspark_kernels``.

Switch: ``SGLANG_DSPARK_FUSED_SEQ_HEAD`` = ``auto`` (default) | ``triton`` | ``torch`` |
``upstream`` (see :mod:`dspark_kernels.backend`).  ``auto`` keeps SGLang's own
kernels on GPU (where ours measured slower, docs/kernels.md) and runs our torch
reference on CPU.  The hook wraps ``dspark_draft.draft_markov_block`` (eager
proposer and the draft-graph sampler); confidence scoring stays SGLang's there,
because its features are not passed to that function.  Heads the fused path does
not cover (gated/RNN, sharded or quantized ``w2``, gamma > 16) fall back to SGLang.
"""

from __future__ import annotations

from dspark_kernels.backend import select_backend
from dspark_kernels.sglang_adapter import (
    draft_block_with_confidence,
    fused_path_unsupported_reason,
)

_last_backend = {"value": "upstream"}


def last_backend() -> str:
    return _last_backend["value"]


def fused_draft_markov_block(original, *args, **kwargs):
    base_logits = kwargs.get("base_logits")
    markov_head = kwargs.get("markov_head")
    if args or base_logits is None or markov_head is None:
        return original(*args, **kwargs)
    backend = select_backend(device=base_logits.device)
    if backend == "upstream" or fused_path_unsupported_reason(
            markov_head=markov_head, base_logits=base_logits) is not None:
        _last_backend["value"] = "upstream"
        return original(*args, **kwargs)
    out = draft_block_with_confidence(
        markov_head=markov_head, confidence_head=None, base_logits=base_logits,
        anchor_tokens=kwargs["anchor_tokens"], confidence_features=None,
        step_temperatures=kwargs["step_temperatures"], noise=kwargs["noise"],
        greedy_draft=bool(kwargs.get("greedy_draft", False)),
        draft_hidden=kwargs.get("draft_hidden"), tp_sync=kwargs.get("tp_sync"),
        logits_out=kwargs.get("logits_out"), backend=backend)
    _last_backend["value"] = out.backend
    return out.draft_tokens, out.step_logits
