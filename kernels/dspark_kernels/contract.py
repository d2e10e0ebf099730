"""Input contract and output type shared by every sequential-head backend.

The maths (identical in the torch reference and in the Triton kernel, and the
same as SGLang 0.5.23's ``VanillaMarkov`` + ``MarkovSampleStep`` +
``DSparkConfidenceHead``):

for k = 0 .. gamma-1, with ``prev = anchor`` at k = 0 and ``prev = x_{k-1}`` after:

* ``e      = w1[prev]``                                    (``[r]``, weight dtype)
* ``bias   = round_w(sum_j e[j] * w2[:, j])``               (fp32 sum, rounded to the
  weight dtype like ``nn.Linear`` output)
* ``z      = round_step(float(base[k]) + float(bias))``     (step dtype =
  ``promote_types(base dtype, weight dtype)``)
* token ``x_k = argmax(z)`` when the row's temperature is 0 (or ``greedy``), else
  ``argmax(z / T - log(-log1p(-u)))`` with Philox uniforms ``u`` (see
  :mod:`dspark_kernels.philox`); ties go to the lowest column, a NaN wins;
* ``p_d(x_k) = softmax(z / T)[x_k]`` for sampled rows, ``1.0`` for argmax rows;
* confidence ``raw_k = round_c(w . [round_c(h_k) ; round_c(round_h(e))] + b)`` in
  the confidence weight's dtype, ``c_k = sigmoid(float(raw_k) / T_sts[k])``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

SUPPORTED_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_GAMMA = 16


class SeqHeadOutput(NamedTuple):
    """What one call of the sequential head produces."""

    # [B, gamma] int64 drafted tokens x_1..x_gamma.
    tokens: torch.Tensor
    # [B, gamma] float32 p_d(x_k) at the row's temperature (1.0 on argmax rows);
    # None when not requested.
    draft_probs: Optional[torch.Tensor]
    # [B, gamma] float32 STS-calibrated confidence; None without a confidence head.
    confidence: Optional[torch.Tensor]
    # [B, gamma] raw confidence logit in the confidence weight's dtype; None without one.
    confidence_raw: Optional[torch.Tensor]
    # The caller's ``logits_out`` ([B, gamma, V] step logits) when given, else None.
    step_logits: Optional[torch.Tensor]


class SeqHeadInputs(NamedTuple):
    base_logits: torch.Tensor
    anchor_tokens: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    temperatures: Optional[torch.Tensor]
    seed: int
    offset: Optional[torch.Tensor]
    greedy: bool
    logits_out: Optional[torch.Tensor]
    hidden: Optional[torch.Tensor]
    conf_weight: Optional[torch.Tensor]
    conf_bias: Optional[torch.Tensor]
    conf_with_markov: bool
    sts_temperatures: Optional[torch.Tensor]
    compute_draft_probs: bool
    # derived
    batch: int
    gamma: int
    vocab: int
    rank: int
    hidden_size: int
    step_dtype: torch.dtype

    @property
    def samples(self) -> bool:
        return not self.greedy

    @property
    def has_confidence(self) -> bool:
        return self.conf_weight is not None


def step_dtype_for(base_dtype: torch.dtype, weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype of ``base_logits + bias`` (what SGLang's VanillaMarkov uses)."""
    return torch.promote_types(base_dtype, weight_dtype)


def _fail(message: str) -> None:
    raise ValueError(f"dspark_kernels.sequential_head: {message}")


def _check_float(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_FLOAT_DTYPES:
        _fail(f"{name} must be float32, bfloat16 or float16, got {tensor.dtype}.")


def validate_inputs(
    *,
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    temperatures: Optional[torch.Tensor],
    seed: int,
    offset: Optional[torch.Tensor],
    greedy: bool,
    logits_out: Optional[torch.Tensor],
    hidden: Optional[torch.Tensor],
    conf_weight: Optional[torch.Tensor],
    conf_bias: Optional[torch.Tensor],
    conf_with_markov: bool,
    sts_temperatures,
    compute_draft_probs: bool,
) -> SeqHeadInputs:
    """Check shapes, dtypes and devices; return the normalized inputs."""
    if base_logits.ndim != 3:
        _fail(f"base_logits must be [batch, gamma, vocab], got shape {tuple(base_logits.shape)}.")
    batch, gamma, vocab = base_logits.shape
    device = base_logits.device
    if not 1 <= gamma <= MAX_GAMMA:
        _fail(f"gamma (base_logits.shape[1]) must be in [1, {MAX_GAMMA}], got {gamma}.")
    if vocab < 1:
        _fail("vocab (base_logits.shape[2]) must be >= 1.")
    _check_float("base_logits", base_logits)
    if base_logits.stride(2) != 1:
        _fail("base_logits must be contiguous along the vocab dimension.")
    if anchor_tokens.shape != (batch,) or anchor_tokens.dtype not in (torch.int32, torch.int64):
        _fail(
            f"anchor_tokens must be an int32/int64 [batch={batch}] tensor, got "
            f"{anchor_tokens.dtype} {tuple(anchor_tokens.shape)}."
        )
    if w1.ndim != 2 or w2.ndim != 2:
        _fail("w1 ([vocab, rank], markov_w1.weight) and w2 ([vocab, rank], markov_w2.weight) must be 2-D.")
    rank = w1.shape[1]
    if w2.shape != (vocab, rank):
        _fail(
            f"w2 must be markov_w2.weight with shape [vocab={vocab}, rank={rank}], got "
            f"{tuple(w2.shape)} (bias = w1[prev] @ w2.T)."
        )
    if w1.dtype != w2.dtype:
        _fail(f"w1 and w2 must share a dtype, got {w1.dtype} and {w2.dtype}.")
    _check_float("w1", w1)
    if w1.stride(1) != 1 or w2.stride(1) != 1:
        _fail("w1 and w2 rows must be contiguous (stride 1 along rank).")
    step_dtype = step_dtype_for(base_logits.dtype, w1.dtype)

    if not greedy:
        if temperatures is None:
            _fail("sampling (greedy=False) needs temperatures [batch] (0 = argmax row).")
        if offset is None:
            _fail("sampling (greedy=False) needs offset, a 1-element int64 device tensor.")
    if temperatures is not None:
        if temperatures.shape != (batch,) or temperatures.dtype != torch.float32:
            _fail(
                f"temperatures must be a float32 [batch={batch}] tensor, got "
                f"{temperatures.dtype} {tuple(temperatures.shape)}."
            )
        temperatures = temperatures.contiguous()
    if offset is not None:
        if offset.numel() != 1 or offset.dtype != torch.int64:
            _fail(f"offset must be a 1-element int64 tensor, got {offset.dtype} {tuple(offset.shape)}.")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        _fail(f"seed must be in [0, 2**64), got {seed}.")
    if logits_out is not None:
        if logits_out.shape != (batch, gamma, vocab):
            _fail(f"logits_out must be [{batch}, {gamma}, {vocab}], got {tuple(logits_out.shape)}.")
        if logits_out.dtype != step_dtype:
            _fail(f"logits_out must have the step dtype {step_dtype}, got {logits_out.dtype}.")
        if logits_out.stride(2) != 1:
            _fail("logits_out must be contiguous along the vocab dimension.")

    hidden_size = 0
    if conf_weight is not None:
        if hidden is None:
            _fail("conf_weight needs hidden [batch, gamma, hidden_size] (the confidence features).")
        if hidden.ndim != 3 or hidden.shape[:2] != (batch, gamma):
            _fail(f"hidden must be [{batch}, {gamma}, hidden_size], got {tuple(hidden.shape)}.")
        _check_float("hidden", hidden)
        _check_float("conf_weight", conf_weight)
        if hidden.stride(2) != 1:
            _fail("hidden must be contiguous along the hidden dimension.")
        hidden_size = hidden.shape[2]
        conf_weight = conf_weight.reshape(-1).contiguous()
        expected = hidden_size + (rank if conf_with_markov else 0)
        if conf_weight.numel() != expected:
            _fail(
                f"conf_weight must have {expected} = hidden_size"
                f"{' + rank' if conf_with_markov else ''} elements "
                f"(confidence_head.proj.weight, input order [h_k ; w1[x_(k-1)]]), got "
                f"{conf_weight.numel()}."
            )
        if conf_bias is not None:
            if conf_bias.numel() != 1:
                _fail(f"conf_bias must have one element, got {conf_bias.numel()}.")
            conf_bias = conf_bias.reshape(1)
        if sts_temperatures is None:
            sts = torch.ones(1, dtype=torch.float32, device=device).expand(gamma)
        else:
            sts = torch.as_tensor(sts_temperatures, dtype=torch.float32, device=device)
            if sts.numel() == 1:
                sts = sts.reshape(1).expand(gamma)
            elif sts.numel() == gamma:
                sts = sts.reshape(gamma)
            else:
                _fail(
                    f"sts_temperatures must have 1 or gamma={gamma} elements, got {sts.numel()}."
                )
        sts_temperatures = sts
    else:
        hidden = None
        conf_bias = None
        sts_temperatures = None

    for name, tensor in (
        ("anchor_tokens", anchor_tokens),
        ("w1", w1),
        ("w2", w2),
        ("temperatures", temperatures),
        ("offset", offset),
        ("logits_out", logits_out),
        ("hidden", hidden),
        ("conf_weight", conf_weight),
        ("conf_bias", conf_bias),
    ):
        if tensor is not None and tensor.device != device:
            _fail(f"{name} is on {tensor.device} but base_logits is on {device}.")

    return SeqHeadInputs(
        base_logits=base_logits,
        anchor_tokens=anchor_tokens,
        w1=w1,
        w2=w2,
        temperatures=temperatures,
        seed=seed,
        offset=offset,
        greedy=bool(greedy),
        logits_out=logits_out,
        hidden=hidden,
        conf_weight=conf_weight,
        conf_bias=conf_bias,
        conf_with_markov=bool(conf_with_markov),
        sts_temperatures=sts_temperatures,
        compute_draft_probs=bool(compute_draft_probs),
        batch=batch,
        gamma=gamma,
        vocab=vocab,
        rank=rank,
        hidden_size=hidden_size,
        step_dtype=step_dtype,
    )
