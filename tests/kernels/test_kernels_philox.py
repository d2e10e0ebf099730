"""The torch Philox stream, the Gumbel transform and their Triton twins."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from dspark_kernels import sequential_head_reference
from dspark_kernels.philox import (
    draft_noise_bits,
    gumbel_from_bits,
    log1p_neg,
    philox4x32,
)

# Known-answer vectors of Philox4x32-10 (Random123's kat_vectors).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (
        (0xFFFFFFFF,) * 4,
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_philox_known_answers(ctr, key, expected):
    words = philox4x32(key[0] | (key[1] << 32), *(torch.tensor([c]) for c in ctr))
    assert tuple(int(w.item()) for w in words) == expected


@triton.jit
def _philox_probe(SEED, C0, C1, C2, C3, OUT, N: tl.constexpr):
    i = tl.arange(0, N)
    c0 = tl.load(C0 + i).to(tl.uint32)
    c1 = tl.load(C1 + i).to(tl.uint32)
    c2 = tl.load(C2 + i).to(tl.uint32)
    c3 = tl.load(C3 + i).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(SEED, c0, c1, c2, c3, 10)
    tl.store(OUT + i * 4, w0.to(tl.int64) & 0xFFFFFFFF)
    tl.store(OUT + i * 4 + 1, w1.to(tl.int64) & 0xFFFFFFFF)
    tl.store(OUT + i * 4 + 2, w2.to(tl.int64) & 0xFFFFFFFF)
    tl.store(OUT + i * 4 + 3, w3.to(tl.int64) & 0xFFFFFFFF)


def test_torch_philox_equals_triton_philox():
    n = 64
    g = torch.Generator().manual_seed(1)
    ctrs = [torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64) for _ in range(4)]
    key = 0x2D2A9C317E44B1F3 ^ 987654321
    out = torch.zeros(n * 4, dtype=torch.int64)
    _philox_probe[(1,)](key, *ctrs, out, n)
    expected = torch.stack(philox4x32(key, *ctrs), dim=1).reshape(-1)
    assert torch.equal(out, expected)


def test_noise_layout_word_j_of_quad_q_is_column_4q_plus_j():
    bits = draft_noise_bits(key=77, rows=3, columns=10, step=2, offset=9)
    for row in range(3):
        for col in range(10):
            words = philox4x32(77, torch.tensor(col // 4), torch.tensor(row), torch.tensor(2), torch.tensor(9))
            assert bits[row, col].item() == words[col % 4].item()


def test_offset_uses_low_32_bits():
    a = draft_noise_bits(key=5, rows=2, columns=8, step=0, offset=torch.tensor([3 + 2**32]))
    b = draft_noise_bits(key=5, rows=2, columns=8, step=0, offset=3)
    assert torch.equal(a, b)


def test_log1p_neg_is_accurate():
    u = torch.tensor([2.0**-32, 1e-9, 3e-7, 1e-4, 0.1, 0.5, 0.9, 0.999999, 1.0], dtype=torch.float32)
    got = log1p_neg(u).double()
    want = torch.log1p(-u.double())
    finite = torch.isfinite(want)
    assert torch.all(((got - want).abs() / want.abs())[finite] < 3e-7)
    assert got[-1].item() == -math.inf


def test_gumbel_max_samples_the_softmax():
    """Empirical draws of the reference sampler follow softmax(z / T)."""
    rows, vocab, temperature = 20000, 6, 0.8
    logits = torch.tensor([1.0, 0.2, -0.5, 0.9, -2.0, 0.0])
    base = logits.view(1, 1, vocab).expand(rows, 1, vocab).contiguous()
    out = sequential_head_reference(
        base_logits=base,
        anchor_tokens=torch.zeros(rows, dtype=torch.int64),
        w1=torch.zeros(vocab, 4),
        w2=torch.zeros(vocab, 4),
        temperatures=torch.full((rows,), temperature),
        seed=123456789,
        offset=torch.tensor([42]),
    )
    counts = torch.bincount(out.tokens.view(-1), minlength=vocab).double()
    probs = torch.softmax(logits.double() / temperature, dim=0)
    sigma = (rows * probs * (1 - probs)).sqrt()
    assert torch.all((counts - rows * probs).abs() < 4.5 * sigma), (counts, rows * probs)
    # p_d reported for each draw is the softmax probability of the drawn token.
    torch.testing.assert_close(out.draft_probs.view(-1).double(), probs[out.tokens.view(-1)], rtol=1e-5, atol=1e-7)


def test_gumbel_noise_is_standard_gumbel():
    noise = gumbel_from_bits(draft_noise_bits(key=9, rows=200, columns=500, step=1, offset=3))
    assert abs(noise.mean().item() - 0.5772156649) < 0.01
    assert abs(noise.var().item() - math.pi**2 / 6) < 0.05
