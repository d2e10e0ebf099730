"""No Gumbel noise is drawn when no row samples (torch reference, CPU tensors).

A non-greedy call whose temperatures are all 0 (SGLang passes ``greedy_draft=False``
with per-row temperatures) picks ``argmax z`` on every row, so the reference skips
the Philox draw and the softmax. Results must be bit-identical to drawing them, and
mixed batches must run exactly as before.
"""

from __future__ import annotations

import pytest
import torch

from dspark_kernel_testutil import clone_kwargs, make_inputs
from dspark_kernels import reference, sequential_head, sequential_head_reference
from dspark_kernels.philox import draft_gumbel

FIELDS = ("tokens", "draft_probs", "confidence", "confidence_raw", "step_logits")


@pytest.fixture
def noise_calls(monkeypatch):
    """Counts the reference's Philox draws."""
    calls = []
    real = reference.draft_gumbel

    def counting(**kw):
        calls.append(kw["step"])
        return real(**kw)

    monkeypatch.setattr(reference, "draft_gumbel", counting)
    return calls


def _without_skip(monkeypatch, kwargs):
    """The reference as it ran before the skip: every row of a sampling call draws noise."""
    with monkeypatch.context() as m:
        m.setattr(reference, "_may_sample", lambda sampled: True)
        return sequential_head_reference(**clone_kwargs(kwargs))


def _assert_identical(a, b):
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 5])
def test_all_greedy_rows_draw_no_noise_and_match_drawing_it(monkeypatch, noise_calls, dtype, batch):
    kwargs = make_inputs(batch=batch, gamma=4, vocab=150, dtype=dtype, seed=batch + 3)
    kwargs["temperatures"] = torch.zeros(batch)
    skipped = sequential_head_reference(**clone_kwargs(kwargs))
    assert noise_calls == []
    drawn = _without_skip(monkeypatch, kwargs)
    assert noise_calls == [0, 1, 2, 3]  # the old path really draws (the comparison is not vacuous)
    _assert_identical(skipped, drawn)
    assert torch.all(skipped.draft_probs == 1.0)
    # and it is what a greedy draft (greedy=True) gives
    greedy = sequential_head_reference(**{**clone_kwargs(kwargs), "greedy": True})
    for name in ("tokens", "draft_probs", "confidence", "confidence_raw", "step_logits"):
        assert torch.equal(getattr(skipped, name), getattr(greedy, name)), name


def test_mixed_batch_draws_noise_and_is_unchanged(monkeypatch, noise_calls):
    kwargs = make_inputs(batch=6, gamma=3, vocab=130, seed=8)  # temperatures 0, .7, 1, 1.6, 0, .7
    temps = kwargs["temperatures"]
    assert (temps == 0).any() and (temps != 0).any()
    out = sequential_head_reference(**clone_kwargs(kwargs))
    assert noise_calls == [0, 1, 2]
    _assert_identical(out, _without_skip(monkeypatch, kwargs))
    # independent check of the sampled rows: Gumbel-max over the stored step logits
    z = out.step_logits.float()
    for k in range(3):
        noise = draft_gumbel(key=kwargs["seed"], rows=6, columns=130, step=k, offset=kwargs["offset"])
        safe_t = torch.where(temps == 0, torch.ones_like(temps), temps)
        keys = torch.where((temps != 0)[:, None], z[:, k] / safe_t[:, None] + noise, z[:, k])
        assert torch.equal(out.tokens[:, k], keys.argmax(dim=1)), k


def test_one_sampled_row_keeps_the_noise(noise_calls):
    """The skip looks at every row: one sampled row among argmax rows still samples."""
    kwargs = make_inputs(batch=4, gamma=2, vocab=64, seed=2)
    kwargs["base_logits"].zero_()  # flat logits: only noise can move the sampled row
    kwargs["temperatures"] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    out = sequential_head_reference(**clone_kwargs(kwargs))
    assert noise_calls == [0, 1]
    assert torch.all(out.tokens[:3] == out.step_logits[:3].float().argmax(dim=-1))
    assert out.draft_probs[3].lt(1.0).all()


@pytest.mark.parametrize("temps", ["zeros", "mixed"])
def test_triton_interpreter_agrees(temps):
    kwargs = make_inputs(batch=5, gamma=3, vocab=200, seed=31)
    if temps == "zeros":
        kwargs["temperatures"] = torch.zeros(5)
    ref = sequential_head_reference(**clone_kwargs(kwargs))
    for mode, splits in (("persistent", 1), ("stepwise", 3)):
        out = sequential_head(backend="triton", launch_mode=mode, num_splits=splits, **clone_kwargs(kwargs))
        assert torch.equal(out.tokens, ref.tokens), (temps, mode)
        torch.testing.assert_close(out.draft_probs, ref.draft_probs, rtol=2e-5, atol=2e-6)
        torch.testing.assert_close(out.confidence, ref.confidence, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.step_logits, ref.step_logits, rtol=1e-5, atol=1e-5)
        if temps == "zeros":
            assert torch.all(out.draft_probs == 1.0)
