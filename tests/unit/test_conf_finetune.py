"""``conf-finetune``: rollout sampling, rejection / prefix masks, the head fit, the output
checkpoint and the CLI, on tiny locally built models (a few seconds each)."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from sglang_dspark.train import conf_finetune as cf
from sglang_dspark.train.conf_finetune import (ConfFinetuneConfig, Rollouts, chain_accept,
                                               collect_batch, fit_head, head_loss, loss_weights,
                                               prefix_accepted, prefix_probability,
                                               sample_block)


@pytest.fixture(scope="module")
def soft_pair(tmp_path_factory):
    """Constructed tiny pair with a soft target (sharpness 1: real T = 1 rejections)."""
    from sglang_dspark.tiny_models import TinySpec, build_pair

    out = tmp_path_factory.mktemp("soft-pair")
    build_pair(out, TinySpec(seed=3, sharpness=1.0, block_size=4))
    return {"target": out / "target", "draft": out / "draft"}


@pytest.fixture(scope="module")
def loaded(soft_pair):
    from sglang_dspark.train.model import load_draft
    from sglang_dspark.train.target import Target

    torch.set_num_threads(2)
    target = Target(soft_pair["target"])
    draft = load_draft(soft_pair["draft"], target.embed.float(), target.lm_head.float()).eval()
    return target, draft


@pytest.fixture(scope="module")
def corpus(loaded):
    from sglang_dspark.train.data import split_stdlib, text_sequences

    target, _ = loaded
    train, _ = split_stdlib()
    text = train[0].read_text(encoding="utf-8", errors="replace")[:20000]
    return text_sequences(target.tokenizer, [text], 64)


def _windows(loaded, corpus, n=16, length=24, seed=0):
    return cf.WindowSampler(corpus).sample(n, length, torch.Generator().manual_seed(seed))


def _fit_from_a_bad_head(loaded, corpus, cfg):
    """Rollouts of the soft pair, the head reset to c = 0.05 everywhere (badly off), then
    ``fit_head`` with ``cfg`` on a copy of the draft: (draft, rollouts, W1, loss before,
    loss after)."""
    import copy

    target, draft = loaded
    draft = copy.deepcopy(draft)          # the module's draft stays untouched
    g = torch.Generator().manual_seed(0)
    r = Rollouts.cat([collect_batch(target, draft, _windows(loaded, corpus, 32, L, s), 1.0, g)
                      for s, L in enumerate((20, 28, 36, 24))])
    with torch.no_grad():
        draft.confidence_head.proj.weight.zero_()
        draft.confidence_head.proj.bias.fill_(-3.0)
    w1 = draft.markov_head.markov_w1.weight.detach()
    before = float(head_loss(draft.confidence_head.proj, w1, r, cfg))
    fit_head(draft, r, cfg, g, log=None)
    after = float(head_loss(draft.confidence_head.proj, w1, r, cfg))
    return draft, r, w1, before, after


# ------------------------------------------------------------- rejection / masks
def test_chain_accept_and_prefix_masks_hand_built():
    p = torch.tensor([[0.5, 0.1, 0.1, 0.9, 0.3]])
    q = torch.tensor([[0.25, 0.4, 0.4, 0.1, 0.0]])
    u = torch.tensor([[0.99, 0.2, 0.3, 0.5, 0.0]])
    # p/q >= 1 accepts; 0.2*0.4 = 0.08 < 0.1 accepts; 0.3*0.4 = 0.12 > 0.1 rejects;
    # position 4 would pass on its own; q = 0 is not a probability: rejected
    acc = chain_accept(p, q, u)
    assert acc.tolist() == [[True, True, False, True, False]]
    # position k is reached iff every position < k was accepted (first rejection stops)
    assert prefix_accepted(acc).tolist() == [[True, True, True, False, False]]
    a = torch.tensor([[1.0, 0.25, 0.25, 1.0, 0.0]])
    assert torch.allclose(prefix_probability(a), torch.tensor([[1.0, 1.0, 0.25, 0.0625, 0.0625]]))

    r = Rollouts(hidden=torch.zeros(1, 5, 2), prev=torch.zeros(1, 5, dtype=torch.long),
                 drafts=torch.zeros(1, 5, dtype=torch.long), tv=torch.full((1, 5), 0.3),
                 accept_prob=a, accepted=acc)
    w = loss_weights(r, ConfFinetuneConfig(position_weight="uniform"))
    assert w.tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0]]
    w = loss_weights(r, ConfFinetuneConfig(position_weight="uniform", prefix="expected"))
    assert torch.allclose(w, prefix_probability(a))
    w = loss_weights(r, ConfFinetuneConfig(decay=2.0))
    assert torch.allclose(w, torch.tensor([[1.0, math.exp(-0.5), math.exp(-1.0), 0.0, 0.0]]))


def test_masked_positions_do_not_enter_the_loss():
    """Changing the features of positions after a rejection leaves the loss unchanged;
    changing a reached position changes it."""
    g = torch.Generator().manual_seed(0)
    N, G, H, r_ = 32, 4, 6, 3
    acc = torch.rand(N, G, generator=g) < 0.6
    r = Rollouts(hidden=torch.randn(N, G, H, generator=g),
                 prev=torch.randint(10, (N, G), generator=g),
                 drafts=torch.zeros(N, G, dtype=torch.long), tv=torch.rand(N, G, generator=g),
                 accept_prob=torch.rand(N, G, generator=g), accepted=acc)
    head = torch.nn.Linear(H + r_, 1)
    w1 = torch.randn(10, r_, generator=g)
    cfg = ConfFinetuneConfig()
    base = head_loss(head, w1, r, cfg)
    hidden = r.hidden.clone()
    hidden[~r.prefix_ok] += 5.0
    moved = Rollouts(**{**r.__dict__, "hidden": hidden})
    assert torch.allclose(head_loss(head, w1, moved, cfg), base)
    hidden = r.hidden.clone()
    hidden[:, 0] += 5.0                      # position 1 is always reached
    moved = Rollouts(**{**r.__dict__, "hidden": hidden})
    assert not torch.allclose(head_loss(head, w1, moved, cfg), base)


def test_survival_loss_matches_bce_of_the_product_and_ignores_the_prefix_mask():
    """``label="survival"``: BCE(prod_{i<=k} sigmoid(z_i), prod_{i<=k} a_i), every position
    (the event is unconditional, so positions after a rejection still count), stable for
    very confident heads."""
    g = torch.Generator().manual_seed(4)
    N, G, H, r_ = 16, 4, 5, 3
    r = Rollouts(hidden=torch.randn(N, G, H, generator=g),
                 prev=torch.randint(10, (N, G), generator=g),
                 drafts=torch.zeros(N, G, dtype=torch.long), tv=torch.rand(N, G, generator=g),
                 accept_prob=torch.rand(N, G, generator=g),
                 accepted=torch.rand(N, G, generator=g) < 0.5)
    head = torch.nn.Linear(H + r_, 1)
    w1 = torch.randn(10, r_, generator=g)
    cfg = ConfFinetuneConfig(label="survival", position_weight="uniform")
    cfg.validate()
    z = cf.conf_logits(head, w1, r)
    s_hat = torch.cumprod(torch.sigmoid(z), -1)
    s = torch.cumprod(r.accept_prob, -1)
    ref = torch.nn.functional.binary_cross_entropy(s_hat, s)
    assert torch.allclose(head_loss(head, w1, r, cfg), ref, atol=1e-6)
    # decay weights: the same BCE, weighted exp(-(k-1)/4) per position
    wd = cf.position_weights(G, 4.0)[None].expand(N, G)
    ref_d = (torch.nn.functional.binary_cross_entropy(s_hat, s, reduction="none") * wd).sum() \
        / wd.sum()
    assert torch.allclose(head_loss(head, w1, r, ConfFinetuneConfig(label="survival")), ref_d,
                          atol=1e-6)
    # a position behind a sampled rejection still enters the loss
    hidden = r.hidden.clone()
    hidden[~r.prefix_ok] += 5.0
    assert (~r.prefix_ok).any()
    moved = Rollouts(**{**r.__dict__, "hidden": hidden})
    assert not torch.allclose(head_loss(head, w1, moved, cfg), head_loss(head, w1, r, cfg))
    # huge logits (S_hat -> 1) and tiny ones (S_hat -> 0) stay finite, with finite gradients
    big = torch.tensor([[40.0, 40.0, -40.0, 40.0]], requires_grad=True)
    loss = cf.survival_loss(big, torch.tensor([[0.9, 0.5, 0.1, 0.0]]), torch.ones(1, 4))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(big.grad).all()


def test_survival_fit_calibrates_the_product(loaded, corpus):
    """Fitted with ``label="survival"``, the mean served survival prod c_i matches the mean
    exact survival prod a_i at every position (calibration in the large of what STS
    scores); the 1 - TV head, fitted on the same rollouts, is compared for information."""
    cfg = ConfFinetuneConfig(steps=200, batch_size=128, lr=0.05, label="survival",
                             position_weight="uniform")
    draft, r, w1, before, after = _fit_from_a_bad_head(loaded, corpus, cfg)
    assert after < before - 0.1, (before, after)
    with torch.no_grad():
        s_hat = torch.cumprod(torch.sigmoid(cf.conf_logits(draft.confidence_head.proj, w1, r)),
                              -1)
    s = torch.cumprod(r.accept_prob, -1)
    assert 0.02 < float(s[:, -1].mean()) < 0.98            # a real mix of outcomes
    for k in range(r.gamma):
        assert abs(float(s_hat[:, k].mean()) - float(s[:, k].mean())) < 0.03, k


def test_chain_accept_matches_the_cpu_rejection_kernel():
    """Our per-position test + prefix rule gives the accept length of the torch chain
    rejection sampler the SGLang engine runs on CPU (sglang_dspark.cpu.rejection)."""
    from sglang_dspark.cpu.rejection import chain_speculative_sampling_torch

    g = torch.Generator().manual_seed(1)
    bs, G, V = 64, 5, 7
    tp = torch.softmax(torch.randn(bs, G + 1, V, generator=g), -1)
    dp = torch.softmax(torch.randn(bs, G, V, generator=g), -1)
    drafts = torch.multinomial(dp.view(-1, V), 1, generator=g).view(bs, G)
    cand = torch.cat([torch.zeros(bs, 1, dtype=torch.long), drafts], 1)
    ridx = torch.arange(bs * (G + 1)).view(bs, G + 1)
    u = torch.rand(bs, G, generator=g)
    predicts = torch.zeros(bs * (G + 1), dtype=torch.long)
    acc_idx = torch.zeros(bs, G + 1, dtype=torch.long)
    acc_num = torch.zeros(bs, dtype=torch.long)
    chain_speculative_sampling_torch(predicts, acc_idx, acc_num, cand, ridx, None, None, u,
                                     torch.rand(bs, generator=g), tp, dp, 1.0, 1.0, True)
    p_tok = tp[:, :G].gather(-1, drafts[..., None]).squeeze(-1)
    q_tok = dp.gather(-1, drafts[..., None]).squeeze(-1)
    acc = chain_accept(p_tok, q_tok, u)
    ours = (prefix_accepted(acc) & acc).sum(-1)
    assert ours.tolist() == acc_num.tolist()
    assert 0 < acc_num.float().mean() < G           # a real mix of outcomes


# ------------------------------------------------------------- rollouts
def test_sample_block_matches_the_draft_distribution(loaded):
    _, draft = loaded
    g = torch.Generator().manual_seed(0)
    B, G, V = 20000, 2, draft.arch.vocab_size
    base = (torch.randn(1, G, V, generator=g) * 2).expand(B, G, V)
    anchor = torch.full((B,), 7, dtype=torch.long)
    drafts, prev, q = sample_block(draft, base, anchor, 1.0, g)
    with torch.no_grad():
        q1 = torch.softmax(base[0, 0] + draft.markov_head(anchor[:1])[0], -1)
    assert torch.allclose(q[0, 0], q1, atol=1e-6)
    assert prev[:, 0].eq(7).all() and torch.equal(prev[:, 1], drafts[:, 0])
    emp = torch.bincount(drafts[:, 0], minlength=V).float() / B
    assert 0.5 * (emp - q1).abs().sum() < 0.05, "step 1 samples do not follow q_1"
    # step 2 is sampled given the drafted x_1: q_2 = softmax(U_2 + Markov(x_1))
    top = int(torch.mode(drafts[:, 0]).values)
    rows = drafts[:, 0] == top
    with torch.no_grad():
        q2 = torch.softmax(base[0, 1] + draft.markov_head(torch.tensor([top]))[0], -1)
    assert torch.allclose(q[rows, 1][0], q2, atol=1e-6)
    emp2 = torch.bincount(drafts[rows, 1], minlength=V).float() / rows.sum()
    tol = 3 * (V / rows.sum().item()) ** 0.5 * 0.5 + 0.02
    assert 0.5 * (emp2 - q2).abs().sum() < tol
    # at a vanishing temperature the sampled draft is SGLang's greedy draft
    d0, _, _ = sample_block(draft, base[:4], anchor[:4], 1e-6, g)
    assert d0[:, 0].eq(q1.argmax()).all()


def test_collect_batch_matches_teacher_forced_draft_and_full_target(loaded, corpus):
    """Rollout quantities equal a full target forward on context + drafts and the
    trainer's teacher-forced draft forward fed the drafted tokens."""
    target, draft = loaded
    w = _windows(loaded, corpus, n=8, length=24)
    g = torch.Generator().manual_seed(5)
    r = collect_batch(target, draft, w, 1.0, g)
    G, L = draft.arch.block_size, w.shape[1]
    seq = torch.cat([w, r.drafts], 1)
    with torch.no_grad():
        tb = target.run(seq, draft.arch.target_layer_ids)
        out = draft(tb.feats, seq, torch.full((8, 1), L - 1))
    p = torch.softmax(tb.logits[:, L - 1:L - 1 + G], -1)
    q = torch.softmax(out.logits[:, 0].float(), -1)
    assert torch.equal(r.prev, out.prev_tokens[:, 0])
    assert torch.allclose(r.hidden, out.hidden[:, 0], atol=1e-5)
    assert torch.allclose(r.tv, 0.5 * (p - q).abs().sum(-1), atol=1e-4)
    pt = p.gather(-1, r.drafts[..., None]).squeeze(-1)
    qt = q.gather(-1, r.drafts[..., None]).squeeze(-1)
    assert torch.allclose(r.accept_prob, (pt / qt).clamp(max=1), atol=1e-4)
    # greedy sanity: at T -> 0 the block is what draft_greedy (SGLang at T = 0) drafts
    r0 = collect_batch(target, draft, w, 1e-6, g)
    with torch.no_grad():
        tw = target.run(w, draft.arch.target_layer_ids)
        greedy, _ = draft.draft_greedy(tw.feats, w, torch.full((8, 1), L - 1))
    assert torch.equal(r0.drafts, greedy[:, 0])


# ------------------------------------------------------------- fit + checkpoint
def test_fit_reduces_loss_and_calibrates_in_the_large(loaded, corpus):
    cfg = ConfFinetuneConfig(steps=150, batch_size=64, lr=0.05, position_weight="uniform")
    draft, r, w1, before, after = _fit_from_a_bad_head(loaded, corpus, cfg)
    assert after < before - 0.2, (before, after)
    with torch.no_grad():
        c = torch.sigmoid(cf.conf_logits(draft.confidence_head.proj, w1, r))
    wts = loss_weights(r, cfg)
    lab = 1 - r.tv
    for k in range(2):        # weighted mean confidence ~ weighted mean label
        assert abs(float((c[:, k] * wts[:, k]).sum() / wts[:, k].sum())
                   - float((lab[:, k] * wts[:, k]).sum() / wts[:, k].sum())) < 0.05


def test_run_changes_only_the_confidence_head(soft_pair, corpus, tmp_path):
    from sglang_dspark.checkpoint import validate_draft

    src = tmp_path / "src"
    shutil.copytree(soft_pair["draft"], src)
    (src / "notes.txt").write_text("kept\n")
    out = tmp_path / "ft"
    cfg = ConfFinetuneConfig(rollouts=96, rollout_batch=32, min_context=16, max_context=32,
                             generate=4, steps=30, batch_size=32, lr=0.05, eval_frac=0.25)
    rep = cf.run_conf_finetune(target_dir=soft_pair["target"], draft_dir=src, out_dir=out,
                               seqs=corpus, cfg=cfg, log=None)
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert (out / "notes.txt").read_text() == "kept\n"
    old, new = load_file(str(src / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert old.keys() == new.keys()
    for k in old:
        same = old[k].dtype == new[k].dtype and old[k].numpy().tobytes() == new[k].numpy().tobytes()
        assert same == (k not in cf.CONF_TENSORS), k
    validate_draft(out, soft_pair["target"])
    saved = json.loads((out / "conf_finetune.json").read_text())
    assert saved["rollouts"] == 96 and saved["eval_rollouts"] == 24
    assert len(saved["offline_after"]["heldout"]) == 4
    assert rep["loss_after"] < rep["loss_before"]


def test_cli_errors(soft_pair, tmp_path, capsys):
    from sglang_dspark.train.__main__ import main

    t, d = soft_pair["target"], soft_pair["draft"]
    assert main(["conf-finetune", "--target", str(tmp_path / "nope"), "--draft", str(d),
                 "--out", str(tmp_path / "o")]) == 2
    assert "--target" in capsys.readouterr().err
    assert main(["conf-finetune", "--target", str(t), "--draft", str(d), "--out", str(d)]) == 2
    assert "--out must differ" in capsys.readouterr().err
    assert main(["conf-finetune", "--target", str(t), "--draft", str(d), "--out",
                 str(tmp_path / "o"), "--min-context", "40", "--max-context", "20"]) == 2
    assert "--min-context" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["conf-finetune", "--target", str(t), "--draft", str(d), "--out",
              str(tmp_path / "o"), "--temperature", "0"])
    assert e.value.code == 2 and "positive number" in capsys.readouterr().err
    noconf = tmp_path / "noconf"
    shutil.copytree(d, noconf)
    cfgj = json.loads((noconf / "config.json").read_text())
    cfgj["enable_confidence_head"] = False
    (noconf / "config.json").write_text(json.dumps(cfgj))
    assert main(["conf-finetune", "--target", str(t), "--draft", str(noconf), "--out",
                 str(tmp_path / "o")]) == 2
    assert "no confidence head" in capsys.readouterr().err
    with pytest.raises(cf.ConfFinetuneError, match="label"):
        ConfFinetuneConfig(label="greedy").validate()
