"""Loss, masking and data plumbing of the drafter trainer (no engine)."""

import json

import pytest
import torch

from sglang_dspark.train.data import (DataError, chat_sequences, eligible_anchors, pad_batch,
                                      sample_anchors)
from sglang_dspark.train.loss import (LossWeights, block_targets, dspark_loss, position_weights,
                                      prefix_mask)


def test_prefix_mask_is_contiguous():
    valid = torch.tensor([[True, True, False, True], [False, True, True, True],
                          [True, True, True, True]])
    assert prefix_mask(valid).tolist() == [[True, True, False, False], [False] * 4, [True] * 4]


def test_block_targets_labels_and_masks():
    tokens = torch.arange(10)[None]             # token at t is t
    lmask = torch.ones(1, 10, dtype=torch.bool)
    lmask[0, 6] = False                         # an untrainable token inside the block
    anchors = torch.tensor([[3, 7]])
    ok = torch.tensor([[True, True]])
    labels, tpos, mask = block_targets(tokens, lmask, anchors, ok, G=4)
    # block row i of anchor p predicts token p+i+1 from the target row p+i
    assert labels[0, 0].tolist() == [4, 5, 6, 7]
    assert tpos[0, 0].tolist() == [3, 4, 5, 6]
    # label 6 is untrainable -> it and everything after it are masked (prefix)
    assert mask[0, 0].tolist() == [True, True, False, False]
    # anchor 7: labels 8, 9 exist, 10 and 11 run past the sequence
    assert mask[0, 1].tolist() == [True, True, False, False]
    _, _, mask2 = block_targets(tokens, lmask, anchors, torch.tensor([[False, True]]), G=4)
    assert not mask2[0, 0].any()


def test_position_weights_default_decay():
    w = position_weights(4, LossWeights().decay)
    assert torch.allclose(w, torch.exp(-torch.arange(4.0) / 4))
    assert LossWeights() == LossWeights(ce=0.1, tv=0.9, conf=1.0, decay=4.0)


def test_loss_terms_zero_when_draft_equals_target():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 3, 4, 11, generator=g)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    labels = t.argmax(-1)
    conf = torch.full((2, 3, 4), 30.0)          # sigmoid ~ 1 = 1 - TV
    out = dspark_loss(t.clone(), conf, labels, t, mask, LossWeights())
    assert out["tv"] < 1e-6
    assert out["conf"] < 1e-6
    assert out["top1_agree"] == 1.0
    # masked positions do not contribute at all
    bad = t.clone()
    bad[:, :, 2:] = -bad[:, :, 2:]
    m2 = mask.clone()
    m2[:, :, 2:] = False
    assert dspark_loss(bad, conf, labels, t, m2, LossWeights())["tv"] < 1e-6
    assert dspark_loss(bad, conf, labels, t, mask, LossWeights())["tv"] > 0.05


def test_greedy_confidence_label_is_argmax_agreement():
    """conf_label="greedy": the BCE target is 1 where the draft's argmax equals the target's
    (what greedy verification accepts) and 0 elsewhere, whatever the TV distance."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    t = torch.randn(1, 2, 4, 9, generator=g)
    d = t * 0.3                                    # same argmax everywhere, TV well above 0 ...
    d[0, 1, 2] = -t[0, 1, 2]                       # ... except one row, whose argmax differs
    mask = torch.ones(1, 2, 4, dtype=torch.bool)
    conf = torch.randn(1, 2, 4, generator=g)
    w = LossWeights(conf_label="greedy")
    agree = (d.argmax(-1) == t.argmax(-1)).float()
    assert agree.sum() == 7
    out = dspark_loss(d, conf, t.argmax(-1), t, mask, w)
    pw = position_weights(4, w.decay)[None, None, :].expand(1, 2, 4)
    want = (F.binary_cross_entropy_with_logits(conf, agree, reduction="none") * pw).sum() / pw.sum()
    assert torch.isclose(out["conf"], want)
    tv_out = dspark_loss(d, conf, t.argmax(-1), t, mask, LossWeights())
    assert not torch.isclose(tv_out["conf"], want)           # the paper's label differs here
    with pytest.raises(ValueError, match="conf_label"):
        LossWeights(conf_label="argmax").validate()


def test_dflash_mode_is_ce_only():
    w = LossWeights.for_mode("dflash")
    assert (w.ce, w.tv, w.conf) == (1.0, 0.0, 0.0)
    t = torch.randn(1, 2, 3, 7)
    out = dspark_loss(torch.randn(1, 2, 3, 7), None, t.argmax(-1), t,
                      torch.ones(1, 2, 3, dtype=torch.bool), w)
    assert "tv" not in out and "conf" not in out
    assert torch.isclose(out["loss"], out["ce"])


def test_anchor_sampling_respects_mask():
    m = torch.zeros(3, 40, dtype=torch.bool)
    m[0, 10:20] = True
    m[1, :] = True
    # row 2: nothing trainable
    anchors, ok = sample_anchors(m, 8, torch.Generator().manual_seed(0))
    elig = eligible_anchors(m)
    assert ok[0].all() and ok[1].all() and not ok[2].any()
    for b in range(2):
        for a in anchors[b].tolist():
            assert elig[b, a], (b, a)
    assert set(anchors[0].tolist()) <= set(range(10, 19))   # p and p+1 trainable
    assert len(set(anchors[1].tolist())) == 8               # distinct


def _chat_tokenizer(tmp_path):
    from sglang_dspark.tiny_models import TinySpec, build_tokenizer

    return build_tokenizer(tmp_path / "tok", TinySpec())


def test_chat_anchors_only_in_assistant_tokens(tmp_path):
    tok = _chat_tokenizer(tmp_path)
    recs = [{"messages": [{"role": "user", "content": "def add(a, b):"},
                          {"role": "assistant", "content": "    return a + b"},
                          {"role": "user", "content": "and sub?"},
                          {"role": "assistant", "content": "def sub(a, b):\n    return a - b"}]}]
    p = tmp_path / "chat.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    seqs = chat_sequences(tok, p, 256)
    assert len(seqs) == 1
    s = seqs[0]
    text_of = lambda ids: tok.decode(list(ids))
    trained = text_of([t for t, m in zip(s.tokens, s.loss_mask) if m])
    assert "return a + b" in trained and "return a - b" in trained
    assert "def add" not in trained and "and sub" not in trained and "user" not in trained
    tokens, lmask = pad_batch(seqs, 0)
    anchors, ok = sample_anchors(lmask, 64, torch.Generator().manual_seed(1))
    assert ok.any()
    for a, good in zip(anchors[0].tolist(), ok[0].tolist()):
        if good:
            assert lmask[0, a] and lmask[0, a + 1]


@pytest.mark.parametrize("line,needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}]}), "no assistant message"),
    (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), "messages.0.role"),
    (json.dumps({"turns": []}), "messages"),
])
def test_chat_jsonl_errors_name_the_line(tmp_path, line, needle):
    tok = _chat_tokenizer(tmp_path)
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "assistant", "content": "ok ok ok"}]})
                 + "\n" + line + "\n")
    with pytest.raises(DataError) as e:
        chat_sequences(tok, p, 64)
    assert f"{p}:2" in str(e.value) and needle in str(e.value)
