"""penalties._mask_below_min_p keeps exactly the tokens SGLang's plain sampler keeps."""

import torch

from sglang_dspark.penalties import _mask_below_min_p


def test_the_mask_keeps_what_sglangs_sampler_keeps():
    from types import SimpleNamespace as NS

    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    g = torch.Generator().manual_seed(0)
    bs, width, vocab = 6, 3, 200
    logits = torch.randn(bs, width, vocab, generator=g) * 3
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 2.0, 0.5]).view(-1, 1)
    min_ps = torch.tensor([0.0, 0.05, 0.2, 0.5, 0.01, 0.9])
    masked = logits.clone()
    _mask_below_min_p(masked, NS(min_ps=min_ps, temperatures=temps))
    # plain decoding's filter on each position's probabilities, top-k and top-p off (top_p 2:
    # at 1 the sampler's float cumulative sum drops a few 1e-8 tokens)
    rows = logits.view(bs * width, vocab)
    probs = torch.softmax(rows / temps.repeat_interleave(width, 0), -1)
    _, kept, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs, torch.full((bs * width,), vocab), torch.full((bs * width,), 2.0), min_ps.repeat_interleave(width),
        True, None, None, return_filtered_probs=True)
    plain = torch.zeros(bs * width, vocab, dtype=torch.bool).scatter_(1, idx.long(), kept > 0)
    ours = torch.isfinite(masked.view(bs * width, vocab))
    assert torch.equal(ours, plain)
    assert ours[:width].all()                           # min_p 0: nothing masked
    assert (ours.sum(1) < vocab)[width:].all() and (ours.sum(1) >= 1).all()
    assert torch.equal(masked[torch.isfinite(masked)], logits[torch.isfinite(masked)])
