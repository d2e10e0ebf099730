"""Benchmark baseline: SGLang 0.5.23's per-position launch pattern, re-expressed.

SGLang's DSpark draft walks the block one position at a time, and per position
launches: the ``markov_w1`` embedding gather, the ``markov_w2`` GEMM (cuBLAS) that
materialises a ``[B, V]`` bias, a Triton kernel that adds bias and base logits,
rounds, stores the step logits, adds Gumbel noise and emits per-block argmax
candidates, and a Triton kernel that reduces the candidates to a token. After
the block the confidence head runs as separate torch ops (gather, concat,
linear, sigmoid / STS). This module reproduces that *launch pattern* with this
package's own kernels and the same maths, so GPU benchmarks can compare the
fused kernel against it on machines where SGLang is not installed. It is not
SGLang's code; when SGLang is importable the benchmark also times the real thing.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dspark_kernels.contract import SeqHeadOutput, validate_inputs
from dspark_kernels.triton_seq_head import _BIG_INDEX, _gumbel_tile, _round_code, _round_to

_BLOCK = 1024


@triton.jit(do_not_specialize=["SEED", "STEP"])
def _step_partial_kernel(
    BASE,
    s_base,
    BIAS,
    s_bias,
    LOGITS_OUT,
    s_lo,
    TEMPS,
    OFFSET,
    SEED,
    PART_KEY,
    PART_IDX,
    V,
    STEP,
    NPARTS,
    BLOCK: tl.constexpr,
    STEP_ROUND: tl.constexpr,
    SAMPLE: tl.constexpr,
    STORE: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    rows = row + tl.arange(0, 1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    ok = (cols < V)[None, :]
    base = tl.load(BASE + rows[:, None].to(tl.int64) * s_base + cols[None, :], mask=ok, other=0.0)
    bias = tl.load(BIAS + rows[:, None].to(tl.int64) * s_bias + cols[None, :], mask=ok, other=0.0)
    z = _round_to(base.to(tl.float32) + bias.to(tl.float32), STEP_ROUND)
    if STORE:
        tl.store(LOGITS_OUT + rows[:, None].to(tl.int64) * s_lo + cols[None, :], z, mask=ok)
    key = z
    if SAMPLE:
        t = tl.load(TEMPS + rows)
        if tl.max(t, axis=0) != 0.0:
            noise = _gumbel_tile(SEED, rows, part * BLOCK, STEP, tl.load(OFFSET) & 0xFFFFFFFF, 1, BLOCK)
            key = z / t[:, None] + noise
    is_nan = ok & (key != key)
    has_nan = tl.max(is_nan.to(tl.int32), axis=1)
    best = tl.max(tl.where(ok & ~is_nan, key, float("-inf")), axis=1)
    win = tl.where(has_nan[:, None] > 0, is_nan, ok & (key == best[:, None]))
    idx = tl.min(tl.where(win, cols[None, :], _BIG_INDEX), axis=1)
    best = tl.where(has_nan > 0, float("nan"), best)
    tl.store(PART_KEY + rows * NPARTS + part, best)
    tl.store(PART_IDX + rows * NPARTS + part, idx)


@triton.jit(do_not_specialize=["G", "STEP"])
def _step_finish_kernel(PART_KEY, PART_IDX, TOKENS, G, STEP, NPARTS, PARTS_P2: tl.constexpr):
    row = tl.program_id(0)
    p = tl.arange(0, PARTS_P2)
    ok = p < NPARTS
    key = tl.load(PART_KEY + row * NPARTS + p, mask=ok, other=float("-inf"))
    idx = tl.load(PART_IDX + row * NPARTS + p, mask=ok, other=_BIG_INDEX)
    is_nan = ok & (key != key)
    has_nan = tl.max(is_nan.to(tl.int32), axis=0)
    best = tl.max(tl.where(ok & ~is_nan, key, float("-inf")), axis=0)
    win = tl.where(has_nan > 0, is_nan, ok & (key == best))
    token = tl.min(tl.where(win, idx, _BIG_INDEX), axis=0)
    tl.store(TOKENS + row * G + STEP, token.to(tl.int64))


def sequential_head_perstep(
    *,
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    temperatures: Optional[torch.Tensor] = None,
    seed: int = 0,
    offset: Optional[torch.Tensor] = None,
    greedy: bool = False,
    logits_out: Optional[torch.Tensor] = None,
    hidden: Optional[torch.Tensor] = None,
    conf_weight: Optional[torch.Tensor] = None,
    conf_bias: Optional[torch.Tensor] = None,
    conf_with_markov: bool = True,
    sts_temperatures=None,
) -> SeqHeadOutput:
    """Same contract as :func:`dspark_kernels.sequential_head` (no ``draft_probs``)."""
    inputs = validate_inputs(
        base_logits=base_logits,
        anchor_tokens=anchor_tokens,
        w1=w1,
        w2=w2,
        temperatures=temperatures,
        seed=seed,
        offset=offset,
        greedy=greedy,
        logits_out=logits_out,
        hidden=hidden,
        conf_weight=conf_weight,
        conf_bias=conf_bias,
        conf_with_markov=conf_with_markov,
        sts_temperatures=sts_temperatures,
        compute_draft_probs=False,
    )
    batch, gamma, vocab = inputs.batch, inputs.gamma, inputs.vocab
    device = base_logits.device
    nparts = triton.cdiv(vocab, _BLOCK)
    part_key = torch.empty((batch, nparts), dtype=torch.float32, device=device)
    part_idx = torch.empty((batch, nparts), dtype=torch.int32, device=device)
    tokens = torch.empty((batch, gamma), dtype=torch.int64, device=device)
    prev = inputs.anchor_tokens.long()
    for k in range(gamma):
        bias = F.linear(w1[prev], w2)  # [B, V] in the weight dtype
        base_k = base_logits[:, k]
        _step_partial_kernel[(batch, nparts)](
            base_k,
            base_k.stride(0),
            bias,
            bias.stride(0),
            base_k if logits_out is None else logits_out[:, k],
            0 if logits_out is None else logits_out.stride(0),
            part_key if inputs.greedy else inputs.temperatures,
            part_idx if inputs.offset is None else inputs.offset,
            inputs.seed,
            part_key,
            part_idx,
            vocab,
            k,
            nparts,
            BLOCK=_BLOCK,
            STEP_ROUND=_round_code(inputs.step_dtype),
            SAMPLE=not inputs.greedy,
            STORE=logits_out is not None,
        )
        _step_finish_kernel[(batch,)](
            part_key, part_idx, tokens, gamma, k, nparts, PARTS_P2=triton.next_power_of_2(nparts)
        )
        prev = tokens[:, k]

    confidence = confidence_raw = None
    if inputs.has_confidence:
        conf_dtype = inputs.conf_weight.dtype
        features = inputs.hidden
        if inputs.conf_with_markov:
            prev_tokens = torch.cat([inputs.anchor_tokens.long().view(-1, 1), tokens[:, :-1]], dim=1)
            features = torch.cat([features, w1[prev_tokens].to(features.dtype)], dim=-1)
        raw = F.linear(
            features.to(conf_dtype), inputs.conf_weight.view(1, -1), inputs.conf_bias
        ).squeeze(-1)
        confidence = torch.sigmoid(raw.float() / inputs.sts_temperatures)
        confidence_raw = raw
    return SeqHeadOutput(tokens, None, confidence, confidence_raw, logits_out)
