"""Shared input builders for the kernel tests (imported by the test modules)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def sglang_available() -> bool:
    try:
        import sglang.srt.models.dspark  # noqa: F401
        import sglang.srt.speculative.dspark_components.dspark_draft  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def make_inputs(
    *,
    batch: int,
    gamma: int,
    vocab: int,
    rank: int = 16,
    hidden: int = 24,
    dtype: torch.dtype = torch.float32,
    conf_dtype: torch.dtype = torch.float32,
    greedy: bool = False,
    seed: int = 0,
    with_confidence: bool = True,
    conf_with_markov: bool = True,
    conf_bias: bool = True,
    sts="vector",
    store_logits: bool = True,
) -> dict:
    """Keyword arguments for ``sequential_head`` / ``sequential_head_reference``.

    Temperatures cycle through 0 (argmax row), 0.7, 1.0 and 1.6, so sampled and
    argmax rows share a batch.
    """
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g) * scale).to(dt)

    temps = torch.tensor([0.0, 0.7, 1.0, 1.6], dtype=torch.float32).repeat(batch)[:batch]
    kwargs = dict(
        base_logits=randn(batch, gamma, vocab, scale=2.0),
        anchor_tokens=torch.randint(0, vocab, (batch,), generator=g),
        w1=randn(vocab, rank, scale=0.5),
        w2=randn(vocab, rank, scale=0.5),
        temperatures=temps,
        seed=int(torch.randint(0, 2**62, (1,), generator=g).item()),
        offset=torch.tensor([int(torch.randint(0, 2**40, (1,), generator=g).item())], dtype=torch.int64),
        greedy=greedy,
    )
    if store_logits:
        step_dtype = torch.promote_types(dtype, dtype)
        kwargs["logits_out"] = torch.full((batch, gamma, vocab), float("nan"), dtype=step_dtype)
    if with_confidence:
        kwargs["hidden"] = randn(batch, gamma, hidden)
        kwargs["conf_weight"] = randn(hidden + (rank if conf_with_markov else 0), scale=0.2, dt=conf_dtype)
        kwargs["conf_bias"] = randn(1, dt=conf_dtype) if conf_bias else None
        kwargs["conf_with_markov"] = conf_with_markov
        if sts == "vector":
            kwargs["sts_temperatures"] = torch.linspace(0.5, 2.0, gamma)
        elif sts == "scalar":
            kwargs["sts_temperatures"] = torch.tensor(1.7)
        else:
            kwargs["sts_temperatures"] = None
    return kwargs


def clone_kwargs(kwargs: dict) -> dict:
    """A copy whose output buffers are fresh (so two backends never share one)."""
    out = dict(kwargs)
    if kwargs.get("logits_out") is not None:
        out["logits_out"] = torch.full_like(kwargs["logits_out"], float("nan"))
    return out
