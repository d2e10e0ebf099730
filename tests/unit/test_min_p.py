"""The verify's filters (penalties._mask_below_min_p on the logits; _joint_top_k_top_p and
_renorm_below_min_p on the target probabilities) keep exactly the tokens SGLang's plain
sampler keeps, with the same probabilities."""

from types import SimpleNamespace as NS

import torch

from sglang_dspark.penalties import _joint_top_k_top_p, _mask_below_min_p, _renorm_below_min_p


def _plain(logits, temps, top_ps, min_ps, top_ks=None):
    """SGLang's plain sampler's filtered distribution per position ([bs * width, vocab])."""
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    bs, width, vocab = logits.shape
    top_ks = torch.full((bs,), vocab) if top_ks is None else top_ks
    probs = torch.softmax(logits.view(bs * width, vocab) / temps.repeat_interleave(width, 0), -1)
    _, kept, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs, top_ks.repeat_interleave(width), top_ps.repeat_interleave(width), min_ps.repeat_interleave(width),
        True, None, None, return_filtered_probs=True)
    dist = torch.zeros(bs * width, vocab).scatter_(1, idx.long(), kept)
    return dist / dist.sum(1, keepdim=True)


def test_the_mask_keeps_what_sglangs_sampler_keeps():
    g = torch.Generator().manual_seed(0)
    bs, width, vocab = 6, 3, 200
    logits = torch.randn(bs, width, vocab, generator=g) * 3
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 2.0, 0.5]).view(-1, 1)
    min_ps = torch.tensor([0.0, 0.05, 0.2, 0.5, 0.01, 0.9])
    masked = logits.clone()
    _mask_below_min_p(masked, NS(min_ps=min_ps, temperatures=temps, top_ps=torch.ones(bs)))
    # plain decoding's filter on each position's probabilities, top-k and top-p off (top_p 2:
    # at 1 the sampler's float cumulative sum drops a few 1e-8 tokens)
    plain = _plain(logits, temps, torch.full((bs,), 2.0), min_ps) > 0
    ours = torch.isfinite(masked.view(bs * width, vocab))
    assert torch.equal(ours, plain)
    assert ours[:width].all()                           # min_p 0: nothing masked
    assert (ours.sum(1) < vocab)[width:].all() and (ours.sum(1) >= 1).all()
    assert torch.equal(masked[torch.isfinite(masked)], logits[torch.isfinite(masked)])


def test_with_top_p_the_verify_keeps_what_sglangs_sampler_keeps():
    """Requests with top_p below 1: the logits mask leaves them and the target probabilities
    SGLang's verify builds (top-p after the mask would cut more) are masked after its cut."""
    from sglang.srt.speculative.dflash_utils import build_speculative_verify_target_probs

    g = torch.Generator().manual_seed(1)
    bs, width, vocab = 6, 3, 200
    logits = torch.randn(bs, width, vocab, generator=g) * 2
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 2.0, 1.0]).view(-1, 1)
    top_ps = torch.tensor([0.9, 0.8, 0.95, 1.0, 0.5, 0.9])
    min_ps = torch.tensor([0.05, 0.2, 0.01, 0.1, 0.3, 0.0])
    info = NS(min_ps=min_ps, temperatures=temps, top_ps=top_ps, top_ks=torch.full((bs,), vocab),
              need_top_k_sampling=False, need_top_p_sampling=True)
    masked = logits.clone()
    _mask_below_min_p(masked, info)                                # the verify adjustments' hook
    assert torch.equal(torch.isfinite(masked).all(-1), (top_ps < 1).view(-1, 1).expand(bs, width))
    target = build_speculative_verify_target_probs(
        next_token_logits=masked.view(bs * width, vocab), sampling_info=info, draft_token_num=width, bs=bs)
    before = target.clone()
    _renorm_below_min_p(target, info)                              # verify_target_probs
    plain = _plain(logits, temps, top_ps, min_ps)
    ours = target.view(bs * width, vocab)
    assert torch.equal(ours > 0, plain > 0)
    torch.testing.assert_close(ours, plain)
    # the rows min_p 0 or top_p 1 are left bit for bit; masking the logits of every row
    # first (the rule before) keeps fewer tokens than plain decoding where top_p cuts
    untouched = ((min_ps == 0) | (top_ps >= 1)).view(-1)
    assert torch.equal(target[untouched], before[untouched])
    all_masked = logits.clone()
    _mask_below_min_p(all_masked, NS(min_ps=min_ps, temperatures=temps, top_ps=torch.ones(bs)))
    early = build_speculative_verify_target_probs(
        next_token_logits=all_masked.view(bs * width, vocab), sampling_info=info, draft_token_num=width, bs=bs)
    assert (early > 0).sum() < (plain > 0).sum()


def test_top_k_with_top_p_is_plain_decodings_joint_rule():
    """A batch with top-k and top-p: both cut on the unfiltered probabilities, as plain
    decoding cuts them (SGLang's verify renormalises over the top k first: fewer tokens)."""
    from sglang.srt.speculative.dflash_utils import build_speculative_verify_target_probs

    g = torch.Generator().manual_seed(2)
    bs, width, vocab = 6, 3, 300
    logits = torch.randn(bs, width, vocab, generator=g) * 2
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 2.0, 1.0]).view(-1, 1)
    top_ks = torch.tensor([20, 5, 1 << 30, 40, 20, 1])
    top_ps = torch.tensor([0.8, 0.95, 0.7, 1.0, 0.5, 0.9])
    min_ps = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0])
    info = NS(min_ps=min_ps, temperatures=temps, top_ps=top_ps, top_ks=top_ks,
              need_top_k_sampling=True, need_top_p_sampling=True)
    kw = dict(next_token_logits=logits.view(bs * width, vocab), sampling_info=info, draft_token_num=width, bs=bs)
    ours = _joint_top_k_top_p(**kw, max_top_k=vocab)
    _renorm_below_min_p(ours, info)
    plain = _plain(logits, temps, top_ps, min_ps, top_ks)
    assert torch.equal(ours.view(bs * width, vocab) > 0, plain > 0)
    torch.testing.assert_close(ours.view(bs * width, vocab), plain)
    # the sparse top-k (the batch's largest top_k, SGLang's max_top_k) cuts the same
    small = dict(kw, sampling_info=NS(**{**vars(info), "top_ks": top_ks.clamp(max=50)}))
    torch.testing.assert_close(_joint_top_k_top_p(**small, max_top_k=50), _joint_top_k_top_p(**small, max_top_k=vocab))
    sglang = build_speculative_verify_target_probs(**kw).view(bs * width, vocab)
    assert (sglang > 0).sum() < (plain > 0).sum()
