"""Philox4x32-10 counter-based random numbers in plain torch.

The draft noise of DSpark's sequential head is a pure function of
``(key, token column, batch row, draft step, offset)``: no generator state, so
a CUDA graph replays it and the CPU reference reproduces it bit for bit.

Stream layout (the one SGLang 0.5.23's Markov sampling step uses, so draft
tokens sampled by this package, by the Triton kernel and by SGLang agree):

* key   = the 64-bit draft noise key (low 32 bits = k0, high 32 bits = k1)
* ctr0  = token column // 4
* ctr1  = batch row
* ctr2  = draft step (0-based position inside the block)
* ctr3  = offset & 0xFFFFFFFF (a device counter the caller advances per block)

Output word ``j`` of the call for ``ctr0 = q`` belongs to column ``4 * q + j``.
A word ``w`` becomes ``u = (float32(w) + 0.5) * 2**-32`` and the Gumbel-max key
of a logit ``z`` at temperature ``T`` is ``z / T - log(-log1p(-u))``.

Everything here uses int64 tensors holding unsigned 32-bit values.
"""

from __future__ import annotations

import torch

PHILOX_ROUNDS = 10
# Round multipliers and Weyl key increments of Philox4x32 (Salmon et al. 2011).
_MUL_A = 0xD2511F53
_MUL_B = 0xCD9E8D57
_BUMP_A = 0x9E3779B9
_BUMP_B = 0xBB67AE85
_MASK32 = 0xFFFFFFFF
# 2**-32 as a float32 constant.
UNIFORM_SCALE = 2.3283064365386963e-10


def _mul_hi_lo(x: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit halves of ``x * multiplier`` for 32-bit ``x``.

    ``x`` is split into 16-bit halves so that no partial product leaves int64.
    """
    x_low = x & 0xFFFF
    x_high = x >> 16
    part_low = x_low * multiplier  # < 2**48
    part_high = x_high * multiplier  # < 2**48; the product is part_high * 2**16 + part_low
    low = (part_low + ((part_high & 0xFFFF) << 16)) & _MASK32
    high = (part_high + (part_low >> 16)) >> 16
    return high, low


def philox4x32(
    key: int,
    ctr0: torch.Tensor,
    ctr1: torch.Tensor,
    ctr2: torch.Tensor,
    ctr3: torch.Tensor,
    *,
    rounds: int = PHILOX_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-``rounds`` of four broadcastable int64 counter tensors.

    Returns the four output words as int64 tensors in ``[0, 2**32)``.
    """
    key = int(key)
    if not 0 <= key < 2**64:
        raise ValueError(f"Philox key must be in [0, 2**64), got {key}.")
    k0, k1 = key & _MASK32, (key >> 32) & _MASK32
    c0, c1, c2, c3 = (torch.as_tensor(c).to(torch.int64) & _MASK32 for c in (ctr0, ctr1, ctr2, ctr3))
    for _ in range(rounds):
        hi_a, lo_a = _mul_hi_lo(c0, _MUL_A)
        hi_b, lo_b = _mul_hi_lo(c2, _MUL_B)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _BUMP_A) & _MASK32
        k1 = (k1 + _BUMP_B) & _MASK32
    return c0, c1, c2, c3


def draft_noise_bits(
    *,
    key: int,
    rows: int,
    columns: int,
    step: int,
    offset: int | torch.Tensor,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The ``[rows, columns]`` random words (int64) of one draft step."""
    quads = (columns + 3) // 4
    if isinstance(offset, torch.Tensor):
        ctr3 = offset.reshape(1, 1).to(device=device, dtype=torch.int64)
    else:
        ctr3 = torch.full((1, 1), int(offset), dtype=torch.int64, device=device)
    words = philox4x32(
        key,
        torch.arange(quads, dtype=torch.int64, device=device).view(1, quads),
        torch.arange(rows, dtype=torch.int64, device=device).view(rows, 1),
        torch.full((1, 1), int(step), dtype=torch.int64, device=device),
        ctr3,
    )
    words = torch.broadcast_tensors(*words)
    return torch.stack(words, dim=-1).reshape(rows, quads * 4)[:, :columns]


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """Map 32-bit words to float32 uniforms in (0, 1]."""
    return (bits.to(torch.float32) + 0.5) * UNIFORM_SCALE


def log1p_neg(u: torch.Tensor) -> torch.Tensor:
    """``log1p(-u)`` for float32 ``u`` in (0, 1], in the form the kernel uses.

    ``w = 1 - u`` is rounded; ``log(w) * (-u) / (w - 1)`` cancels that rounding
    (Goldberg's trick), so tiny ``u`` keep full relative precision.
    """
    w = 1.0 - u
    exact = w == 1.0
    denominator = torch.where(exact, torch.full_like(w, -1.0), w - 1.0)
    return torch.where(exact, -u, torch.log(w) * (-u / denominator))


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise ``-log(E)`` with ``E = -log1p(-u)`` an Exp(1) draw."""
    return -torch.log(-log1p_neg(bits_to_uniform(bits)))


def draft_gumbel(
    *,
    key: int,
    rows: int,
    columns: int,
    step: int,
    offset: int | torch.Tensor,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The ``[rows, columns]`` float32 Gumbel noise of one draft step."""
    return gumbel_from_bits(
        draft_noise_bits(
            key=key, rows=rows, columns=columns, step=step, offset=offset, device=device
        )
    )
