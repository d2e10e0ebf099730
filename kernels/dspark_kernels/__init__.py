"""Fused DSpark sequential-head kernels (Markov draft walk + confidence).

Public API:

* :func:`sequential_head` -- tensor-level op (Triton or torch backend).
* :func:`sequential_head_reference` -- the torch oracle (same maths, same noise).
* :func:`select_backend` -- resolves ``SGLANG_DSPARK_FUSED_SEQ_HEAD``.
* :func:`draft_block_with_confidence` -- drop-in for SGLang 0.5.23's
  ``draft_markov_block`` + ``DSparkDraftMixin.compute_confidence`` pair.
* :func:`reserve_workspace` -- pre-allocate the barrier counters before graph capture.

Importing this package does not import Triton or SGLang.
"""

from dspark_kernels.api import sequential_head
from dspark_kernels.backend import ENV_VAR, select_backend
from dspark_kernels.contract import SeqHeadOutput
from dspark_kernels.reference import sequential_head_reference

__all__ = [
    "ENV_VAR",
    "SeqHeadOutput",
    "draft_block_with_confidence",
    "reserve_workspace",
    "select_backend",
    "sequential_head",
    "sequential_head_reference",
]


def reserve_workspace(*, device, max_batch: int = 4096) -> None:
    """Allocate the Triton kernel's barrier counters (call before CUDA graph capture)."""
    from dspark_kernels.triton_seq_head import reserve_workspace as _reserve

    _reserve(device=device, max_batch=max_batch)


def draft_block_with_confidence(**kwargs):
    """See :func:`dspark_kernels.sglang_adapter.draft_block_with_confidence`."""
    from dspark_kernels.sglang_adapter import draft_block_with_confidence as _impl

    return _impl(**kwargs)
