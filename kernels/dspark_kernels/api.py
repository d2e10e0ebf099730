"""Public tensor-level API of the fused DSpark sequential head."""

from __future__ import annotations

from typing import Optional

import torch

from dspark_kernels.contract import SeqHeadOutput, validate_inputs
from dspark_kernels.reference import run_reference

KERNEL_BACKENDS = ("auto", "triton", "torch")


def sequential_head(
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
    compute_draft_probs: bool = True,
    backend: str = "auto",
    launch_mode: str = "auto",
    num_splits: Optional[int] = None,
    block_m: Optional[int] = None,
    block_v: Optional[int] = None,
) -> SeqHeadOutput:
    """Draft a whole block with the vanilla Markov head and score its confidence.

    Args (all keyword-only):
        base_logits: ``[B, gamma, V]`` draft base logits ``U_k`` (fp32/bf16/fp16),
            contiguous along V. ``gamma <= 16``.
        anchor_tokens: ``[B]`` int32/int64 ``x_0`` (the last target token).
        w1: ``[V_w, r]`` ``markov_w1.weight`` (embedding of the previous token).
        w2: ``[V, r]`` ``markov_w2.weight`` (``nn.Linear(r, V)`` layout): the Markov
            bias is ``w1[x_{k-1}] @ w2.T``.
        temperatures: ``[B]`` float32 per-row sampling temperature; ``0`` = argmax row
            (SGLang's ``step_temperatures``). Required unless ``greedy``.
        seed: 64-bit Philox key (SGLang: ``DraftNoise.key``).
        offset: ``[1]`` int64 device counter (SGLang: ``DraftNoise.offset``); read on the
            device, never on the host, and NOT advanced here.
        greedy: argmax every row (SGLang's ``greedy_draft``); no noise is drawn.
        logits_out: optional ``[B, gamma, V]`` buffer in the step dtype
            (``promote_types(base dtype, weight dtype)``) that receives the corrected
            step logits ``U_k + bias`` the sampling verify needs.
        hidden: ``[B, gamma, H]`` confidence features ``h_k`` (needed with ``conf_weight``).
        conf_weight: ``[H + r]`` (or ``[H]`` when ``conf_with_markov=False``)
            ``confidence_head.proj.weight``; input order ``[h_k ; w1[x_{k-1}]]``.
        conf_bias: ``[1]`` ``confidence_head.proj.bias`` or None.
        sts_temperatures: None, a scalar or ``[gamma]`` per-position STS temperatures.
        compute_draft_probs: also return ``p_d(x_k)``.
        backend: ``auto`` (triton on CUDA, torch elsewhere), ``triton`` or ``torch``.
            The SGLang-level switch (with ``upstream``) is
            :func:`dspark_kernels.select_backend`.
        launch_mode, num_splits, block_m, block_v: Triton tuning (see
            :mod:`dspark_kernels.triton_seq_head`).

    Returns:
        :class:`dspark_kernels.SeqHeadOutput` ``(tokens, draft_probs, confidence,
        confidence_raw, step_logits)``.
    """
    if backend not in KERNEL_BACKENDS:
        raise ValueError(
            f"sequential_head backend must be one of {KERNEL_BACKENDS}, got {backend!r} "
            "('upstream' is SGLang's own code path; see dspark_kernels.sglang_adapter)."
        )
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
        compute_draft_probs=compute_draft_probs,
    )
    if backend == "auto":
        backend = "triton" if base_logits.is_cuda else "torch"
    if inputs.batch == 0 or backend == "torch":
        return run_reference(inputs)
    from dspark_kernels.triton_seq_head import run_triton

    return run_triton(
        inputs,
        launch_mode=launch_mode,
        num_splits=num_splits,
        block_m=block_m,
        block_v=block_v,
    )
