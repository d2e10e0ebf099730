"""This package vs SGLang 0.5.23's own torch path (same tokens, same noise stream)."""

from __future__ import annotations

import logging

import pytest
import torch

from dspark_kernel_testutil import sglang_available
from dspark_kernels import draft_block_with_confidence, sequential_head, sequential_head_reference

pytestmark = pytest.mark.skipif(not sglang_available(), reason="sglang is not importable")


class _NoSync:
    def sync(self, site, values):
        return values


def build_heads(*, vocab, rank, hidden, dtype, gamma, seed):
    from sglang.srt.models.dspark import DSparkConfidenceHead, VanillaMarkov

    g = torch.Generator().manual_seed(seed)
    markov = VanillaMarkov(vocab_size=vocab, markov_rank=rank).to(dtype)
    conf = DSparkConfidenceHead(hidden_size=hidden, markov_rank=rank)
    with torch.no_grad():
        markov.markov_w1.weight.copy_(torch.randn(vocab, rank, generator=g) * 0.5)
        markov.markov_w2.weight.copy_(torch.randn(vocab, rank, generator=g) * 0.5)
        conf.proj.weight.copy_(torch.randn(1, hidden + rank, generator=g) * 0.2)
        conf.proj.bias.copy_(torch.randn(1, generator=g))
    conf.sts_temperatures = torch.linspace(0.6, 1.8, gamma)
    return markov, conf


def upstream_block(*, markov, conf, base, anchor, feats, temps, key, offset, greedy):
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise, draft_markov_block

    noise = DraftNoise(key=key, offset=offset)
    tokens, logits = draft_markov_block(
        markov_head=markov,
        base_logits=base,
        anchor_tokens=anchor,
        draft_hidden=None,
        step_temperatures=temps,
        noise=noise,
        tp_sync=_NoSync(),
        greedy_draft=greedy,
    )
    confidence, raw = conf.predict(feats, anchor_tokens=anchor, draft_tokens=tokens, markov_head=markov)
    return tokens, logits, confidence, raw


@pytest.mark.parametrize(
    "batch,gamma,vocab,dtype,greedy",
    [
        (4, 5, 300, torch.float32, True),
        (4, 5, 300, torch.float32, False),
        (3, 7, 150, torch.bfloat16, True),
        (3, 7, 150, torch.bfloat16, False),
        (1, 4, 200, torch.float32, True),  # SGLang's one-row fused greedy path
        (1, 4, 200, torch.bfloat16, False),
        (5, 16, 64, torch.bfloat16, False),
    ],
)
def test_reference_and_kernel_match_sglang(batch, gamma, vocab, dtype, greedy):
    from sglang.srt.speculative.dspark_components.dspark_draft import draft_noise_key

    rank, hidden = 16, 24
    markov, conf = build_heads(vocab=vocab, rank=rank, hidden=hidden, dtype=dtype, gamma=gamma, seed=vocab)
    g = torch.Generator().manual_seed(batch + gamma)
    base = (torch.randn(batch, gamma, vocab, generator=g) * 2).to(dtype)
    anchor = torch.randint(0, vocab, (batch,), generator=g)
    feats = (torch.randn(batch * gamma, hidden, generator=g)).to(dtype)
    temps = torch.tensor([0.0, 0.8, 1.0, 1.4, 0.5])[:batch] if batch > 1 else torch.tensor([0.9])
    key = draft_noise_key(1234)
    offset0 = 77

    up_offset = torch.tensor([offset0])
    up_tokens, up_logits, up_conf, up_raw = upstream_block(
        markov=markov, conf=conf, base=base, anchor=anchor, feats=feats, temps=temps,
        key=key, offset=up_offset, greedy=greedy,
    )
    assert up_offset.item() == offset0 + (0 if greedy else 1)

    kwargs = dict(
        base_logits=base,
        anchor_tokens=anchor,
        w1=markov.markov_w1.weight.detach(),
        w2=markov.markov_w2.weight.detach(),
        temperatures=temps,
        seed=key,
        offset=torch.tensor([offset0]),
        greedy=greedy,
        hidden=feats.view(batch, gamma, hidden),
        conf_weight=conf.proj.weight.detach(),
        conf_bias=conf.proj.bias.detach(),
        sts_temperatures=conf.sts_temperatures,
    )
    for name, fn in (("reference", sequential_head_reference), ("triton", None)):
        logits_out = None if greedy else torch.empty_like(up_logits)
        if fn is None:
            out = sequential_head(backend="triton", logits_out=logits_out, **kwargs)
        else:
            out = fn(logits_out=logits_out, **kwargs)
        assert torch.equal(out.tokens, up_tokens), (name, out.tokens, up_tokens)
        if not greedy:
            assert out.step_logits.dtype == up_logits.dtype
            if name == "reference":
                assert torch.equal(out.step_logits, up_logits)
            else:
                torch.testing.assert_close(out.step_logits.float(), up_logits.float(), rtol=1e-5, atol=1e-5)
        assert out.confidence_raw.dtype == up_raw.dtype
        torch.testing.assert_close(out.confidence, up_conf, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.confidence_raw, up_raw, rtol=1e-5, atol=1e-5)


def _adapter_inputs(dtype=torch.bfloat16, greedy=False):
    batch, gamma, vocab, rank, hidden = 3, 4, 120, 16, 24
    markov, conf = build_heads(vocab=vocab, rank=rank, hidden=hidden, dtype=dtype, gamma=gamma, seed=5)
    g = torch.Generator().manual_seed(6)
    return dict(
        markov_head=markov,
        confidence_head=conf,
        base_logits=(torch.randn(batch, gamma, vocab, generator=g) * 2).to(dtype),
        anchor_tokens=torch.randint(0, vocab, (batch,), generator=g),
        confidence_features=torch.randn(batch * gamma, hidden, generator=g).to(dtype),
        step_temperatures=torch.tensor([0.0, 0.9, 1.2]),
        greedy_draft=greedy,
    )


@pytest.mark.parametrize("greedy", [True, False])
def test_adapter_backends_agree(greedy):
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise

    inputs = _adapter_inputs(greedy=greedy)
    results = {}
    for backend in ("upstream", "torch", "triton"):
        noise = DraftNoise(key=99, offset=torch.tensor([3]))
        out = draft_block_with_confidence(noise=noise, backend=backend, compute_draft_probs=True, **inputs)
        assert out.backend == backend
        assert noise.offset.item() == (3 if greedy else 4), backend
        results[backend] = out
    up = results["upstream"]
    for backend in ("torch", "triton"):
        out = results[backend]
        assert torch.equal(out.draft_tokens, up.draft_tokens), backend
        if greedy:
            assert out.step_logits is None and up.step_logits is None
        else:
            assert torch.equal(out.step_logits, up.step_logits), backend
            assert out.draft_probs is not None
        torch.testing.assert_close(out.confidence, up.confidence, rtol=1e-5, atol=1e-6)


def test_adapter_env_switch(monkeypatch):
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise

    inputs = _adapter_inputs(greedy=True)
    for value, expected in (("torch", "torch"), ("upstream", "upstream"), ("auto", "torch"), ("triton", "triton")):
        monkeypatch.setenv("SGLANG_DSPARK_FUSED_SEQ_HEAD", value)
        out = draft_block_with_confidence(noise=DraftNoise(key=1, offset=torch.tensor([0])), **inputs)
        assert out.backend == expected, value


def test_adapter_falls_back_for_gated_head(caplog):
    from sglang.srt.models.dspark import GatedMarkovHead
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftNoise

    inputs = _adapter_inputs(dtype=torch.float32)
    gated = GatedMarkovHead(vocab_size=120, markov_rank=16, hidden_size=24)
    inputs["markov_head"] = gated
    inputs["draft_hidden"] = inputs["confidence_features"].view(3, 4, 24)
    with caplog.at_level(logging.WARNING):
        out = draft_block_with_confidence(noise=DraftNoise(key=1, offset=torch.tensor([0])), backend="triton", **inputs)
    assert out.backend == "upstream"
    assert "gated" in caplog.text.lower() or "GEMV" in caplog.text
