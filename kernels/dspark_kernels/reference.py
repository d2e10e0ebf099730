"""Torch reference of DSpark's sequential stage + confidence scoring.

Same maths and the same Philox/Gumbel stream as the Triton kernel (see
:mod:`dspark_kernels.contract` for the formulas); it is the test oracle and the
``torch`` backend on CPU. One step at a time, left to right, like SGLang's own
torch path, but written independently.
"""

from __future__ import annotations

from typing import Optional

import torch

from dspark_kernels.contract import SeqHeadInputs, SeqHeadOutput, validate_inputs
from dspark_kernels.philox import draft_gumbel


def _round(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float32 ``x`` to ``dtype`` and back (no-op for float32)."""
    return x if dtype == torch.float32 else x.to(dtype).to(torch.float32)


def markov_bias(prev_embeddings: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``prev_embeddings @ w2.T`` accumulated in float32, rounded to the weight dtype."""
    bias = prev_embeddings.to(torch.float32) @ w2.to(torch.float32).T
    return _round(bias, w2.dtype)


def confidence_logits(
    inputs: SeqHeadInputs, prev_tokens: torch.Tensor
) -> torch.Tensor:
    """[B, gamma] raw confidence logits (float32 holding conf-dtype values)."""
    conf_dtype = inputs.conf_weight.dtype
    hidden_dtype = inputs.hidden.dtype
    weight = inputs.conf_weight.to(torch.float32)
    h = _round(inputs.hidden.to(torch.float32), conf_dtype)
    raw = h @ weight[: inputs.hidden_size]
    if inputs.conf_with_markov:
        e = inputs.w1[prev_tokens.long()].to(torch.float32)
        e = _round(_round(e, hidden_dtype), conf_dtype)
        raw = raw + e @ weight[inputs.hidden_size :]
    if inputs.conf_bias is not None:
        raw = raw + inputs.conf_bias.to(torch.float32)
    return _round(raw, conf_dtype)


def _may_sample(sampled: torch.Tensor) -> bool:
    """False only when no row samples and that is known without a device sync.

    On CPU tensors the check is free. On a GPU it would stall the host (and break CUDA
    graph capture), so there every row of a non-greedy call draws noise as before;
    the Triton kernel skips it on the device per row block instead.
    """
    if sampled.device.type != "cpu":
        return True
    return bool(sampled.any())


def run_reference(inputs: SeqHeadInputs) -> SeqHeadOutput:
    base = inputs.base_logits
    batch, gamma, vocab = inputs.batch, inputs.gamma, inputs.vocab
    device = base.device
    step_dtype = inputs.step_dtype
    temps = None if inputs.greedy else inputs.temperatures.to(torch.float32)
    sampled = None if temps is None else temps != 0
    if sampled is not None and not _may_sample(sampled):
        # No row samples (every temperature 0): argmax rows take no noise and p_d = 1,
        # so the Philox draw and the softmax are skipped; same tokens, probabilities and
        # confidences as drawing them (torch.where picks z on every row).
        temps = sampled = None
    safe_temps = None if temps is None else torch.where(sampled, temps, torch.ones_like(temps))

    prev = inputs.anchor_tokens.long()
    tokens = torch.empty((batch, gamma), dtype=torch.int64, device=device)
    probs = (
        torch.ones((batch, gamma), dtype=torch.float32, device=device)
        if inputs.compute_draft_probs
        else None
    )
    prev_per_step = torch.empty((batch, gamma), dtype=torch.int64, device=device)
    for k in range(gamma):
        prev_per_step[:, k] = prev
        bias = markov_bias(inputs.w1[prev], inputs.w2)
        z = _round(base[:, k].to(torch.float32) + bias, step_dtype)
        if inputs.logits_out is not None:
            inputs.logits_out[:, k].copy_(z)
        keys = z
        if sampled is not None:
            noise = draft_gumbel(
                key=inputs.seed,
                rows=batch,
                columns=vocab,
                step=k,
                offset=inputs.offset,
                device=device,
            )
            keys = torch.where(sampled[:, None], z / safe_temps[:, None] + noise, z)
        # torch.argmax: first maximum wins, NaN counts as the maximum.
        token = torch.argmax(keys, dim=1)
        tokens[:, k] = token
        if probs is not None and sampled is not None:
            scaled = z / safe_temps[:, None]
            log_p = scaled.gather(1, token[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=1)
            probs[:, k] = torch.where(sampled, torch.exp(log_p), torch.ones_like(log_p))
        prev = token

    confidence = confidence_raw = None
    if inputs.has_confidence:
        raw = confidence_logits(inputs, prev_per_step)
        confidence = torch.sigmoid(raw / inputs.sts_temperatures[None, :])
        confidence_raw = raw.to(inputs.conf_weight.dtype)
    return SeqHeadOutput(
        tokens=tokens,
        draft_probs=probs,
        confidence=confidence,
        confidence_raw=confidence_raw,
        step_logits=inputs.logits_out,
    )


def sequential_head_reference(
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
) -> SeqHeadOutput:
    """Torch reference; arguments as :func:`dspark_kernels.sequential_head`."""
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
    return run_reference(inputs)
