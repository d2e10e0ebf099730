"""Kernel tests run the Triton kernels on CPU through the Triton interpreter.

TRITON_INTERPRET must be set before ``dspark_kernels.triton_seq_head`` is imported
(``@triton.jit`` picks the interpreter at decoration time), so it is set here, at
collection time, before any test module of this directory is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

_KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
# the shared helper module next to this file, whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import dspark_kernels  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # not installed yet: use the source tree
    sys.path.insert(0, str(_KERNELS_DIR))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield

