"""The ``SGLANG_DSPARK_FUSED_SEQ_HEAD`` switch.

Values (case-insensitive; unset or empty = ``auto``):

* ``auto``     -- CUDA: ``upstream`` (SGLang's own per-position kernels; the fused
  kernel measured slower on an H200, docs/kernels.md); CPU: ``torch`` (this package's
  reference, same maths as SGLang's torch path).
* ``triton``   -- this package's fused Triton kernel (CUDA, or CPU under
  ``TRITON_INTERPRET=1``).
* ``torch``    -- this package's torch reference (any device; slow on GPU, and it
  reads no host values, so it is also graph-capturable).
* ``upstream`` -- SGLang 0.5.23's own ``draft_markov_block`` + ``compute_confidence``.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from sglang_dspark.settings import BY_NAME as _SETTINGS  # pure Python: our variables' one parser

ENV_VAR = "SGLANG_DSPARK_FUSED_SEQ_HEAD"
CHOICES = _SETTINGS[ENV_VAR].parse.values


def _interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def requested_backend() -> str:
    """The raw, validated value of the switch (``auto`` when unset)."""
    from sglang_dspark.settings import read

    return read(ENV_VAR)


def select_backend(*, device: Optional[torch.device | str] = None) -> str:
    """Resolve the switch for tensors on ``device``: ``triton``, ``torch`` or ``upstream``.

    ``device`` defaults to the current CUDA device when CUDA is available, else CPU.
    """
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    value = requested_backend()
    if value == "auto":
        return "upstream" if device.type == "cuda" else "torch"
    if value == "triton" and device.type != "cuda" and not _interpreter_on():
        raise ValueError(
            f"{ENV_VAR}=triton needs CUDA tensors (got device {device}); on CPU set "
            "TRITON_INTERPRET=1 (slow, for tests) or use torch/upstream."
        )
    return value
