"""Triton kernel (interpreted on CPU) vs the torch reference."""

from __future__ import annotations

import pytest
import torch

from dspark_kernel_testutil import clone_kwargs, make_inputs
from dspark_kernels import sequential_head, sequential_head_reference


def test_kernel_runs_interpreted():
    from triton.runtime.interpreter import InterpretedFunction

    from dspark_kernels import triton_seq_head

    assert isinstance(triton_seq_head._seq_head_kernel, InterpretedFunction), (
        "dspark_kernels.triton_seq_head was imported before TRITON_INTERPRET=1 was set; "
        "run the kernel tests in their own pytest process"
    )


def _ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mantissa = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[dtype]
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0**-14)))
    return torch.pow(2.0, exponent - mantissa)


def assert_matches(kernel, ref, kwargs, *, dtype):
    """Tokens identical; logits, p_d and confidences within tight tolerances."""
    assert kernel.tokens.dtype == torch.int64
    assert torch.equal(kernel.tokens, ref.tokens), (kernel.tokens, ref.tokens)
    if ref.step_logits is not None:
        got, want = kernel.step_logits.float(), ref.step_logits.float()
        assert not torch.isnan(got).any(), "step logits were not fully written"
        # Only the fp32 accumulation order of the bias differs. float32: rounding
        # noise; 16-bit step dtype: one ulp, and only where a sum sits on a rounding
        # boundary.
        if ref.step_logits.dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            diff = (got - want).abs()
            assert torch.all(diff <= _ulp(want, ref.step_logits.dtype))
            assert (diff > 0).float().mean().item() <= 1e-3
    if ref.draft_probs is not None:
        torch.testing.assert_close(kernel.draft_probs, ref.draft_probs, rtol=2e-5, atol=2e-6)
        if kwargs["greedy"]:
            assert torch.all(kernel.draft_probs == 1.0)
        else:
            argmax_rows = kwargs["temperatures"] == 0
            assert torch.all(kernel.draft_probs[argmax_rows] == 1.0)
    if ref.confidence is not None:
        assert kernel.confidence.dtype == torch.float32
        assert kernel.confidence_raw.dtype == kwargs["conf_weight"].dtype
        torch.testing.assert_close(kernel.confidence, ref.confidence, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            kernel.confidence_raw.float(),
            ref.confidence_raw.float(),
            rtol=1e-5 if kwargs["conf_weight"].dtype == torch.float32 else 1e-2,
            atol=1e-5,
        )
    else:
        assert kernel.confidence is None and kernel.confidence_raw is None


def run_both(kwargs, **launch):
    ref = sequential_head_reference(**clone_kwargs(kwargs))
    kernel = sequential_head(backend="triton", **clone_kwargs(kwargs), **launch)
    return kernel, ref


# (batch, gamma, vocab, rank, dtype, greedy, launch_mode, num_splits, block_m)
CASES = [
    (1, 1, 37, 16, torch.float32, True, "persistent", 1, None),  # V below one tile
    (2, 4, 64, 32, torch.float32, False, "persistent", 1, None),  # V exactly one tile
    (3, 7, 200, 24, torch.float32, False, "stepwise", 3, None),  # non-pow2 V and rank
    (5, 16, 130, 16, torch.float32, False, "stepwise", 2, None),  # gamma 16
    (17, 3, 150, 16, torch.float32, False, "persistent", 1, None),  # two row blocks
    (4, 5, 1000, 32, torch.bfloat16, False, "stepwise", 4, None),  # several tiles per split
    (4, 5, 333, 32, torch.bfloat16, True, "persistent", 1, None),
    (2, 16, 96, 16, torch.bfloat16, False, "persistent", 1, None),
    (33, 2, 100, 16, torch.bfloat16, True, "stepwise", 2, 32),  # block_m 32, ragged rows
    (3, 4, 257, 16, torch.float16, False, "stepwise", 2, None),
]


@pytest.mark.parametrize("batch,gamma,vocab,rank,dtype,greedy,mode,splits,block_m", CASES)
def test_kernel_matches_reference(batch, gamma, vocab, rank, dtype, greedy, mode, splits, block_m):
    kwargs = make_inputs(
        batch=batch, gamma=gamma, vocab=vocab, rank=rank, dtype=dtype, greedy=greedy, seed=batch * 100 + vocab
    )
    kernel, ref = run_both(kwargs, launch_mode=mode, num_splits=splits, block_m=block_m)
    assert_matches(kernel, ref, kwargs, dtype=dtype)


@pytest.mark.parametrize("gamma", range(1, 17))
def test_every_gamma(gamma):
    kwargs = make_inputs(batch=2, gamma=gamma, vocab=24, rank=16, hidden=16, seed=gamma)
    kernel, ref = run_both(kwargs, launch_mode="stepwise", num_splits=2, block_v=16)
    assert_matches(kernel, ref, kwargs, dtype=torch.float32)


def test_split_and_mode_do_not_change_results():
    kwargs = make_inputs(batch=3, gamma=4, vocab=300, seed=11)
    outs = [
        sequential_head(backend="triton", **clone_kwargs(kwargs), launch_mode=m, num_splits=s)
        for m, s in (("persistent", 1), ("stepwise", 1), ("stepwise", 2), ("stepwise", 5))
    ]
    for out in outs[1:]:
        assert torch.equal(out.tokens, outs[0].tokens)
        assert torch.equal(out.step_logits, outs[0].step_logits)
        torch.testing.assert_close(out.draft_probs, outs[0].draft_probs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "conf_dtype,with_markov,bias,sts",
    [
        (torch.float32, False, True, "vector"),
        (torch.float32, True, False, "scalar"),
        (torch.float32, True, True, None),
        (torch.bfloat16, True, True, "vector"),
    ],
)
def test_confidence_variants(conf_dtype, with_markov, bias, sts):
    kwargs = make_inputs(
        batch=3,
        gamma=5,
        vocab=80,
        dtype=torch.bfloat16,
        conf_dtype=conf_dtype,
        conf_with_markov=with_markov,
        conf_bias=bias,
        sts=sts,
        seed=7,
    )
    kernel, ref = run_both(kwargs)
    assert_matches(kernel, ref, kwargs, dtype=torch.bfloat16)


def test_confidence_formula_by_hand():
    """Independent check of the input order [h_k ; w1[x_(k-1)]] and of STS."""
    kwargs = make_inputs(batch=2, gamma=3, vocab=40, rank=16, hidden=8, seed=3)
    out = sequential_head(backend="triton", **clone_kwargs(kwargs))
    prev = torch.cat([kwargs["anchor_tokens"].view(-1, 1), out.tokens[:, :-1]], dim=1)
    w = kwargs["conf_weight"].double()
    feats = torch.cat([kwargs["hidden"].double(), kwargs["w1"][prev].double()], dim=-1)
    raw = feats @ w + kwargs["conf_bias"].double()
    expected = torch.sigmoid(raw / kwargs["sts_temperatures"].double())
    torch.testing.assert_close(out.confidence.double(), expected, rtol=1e-5, atol=1e-6)


def test_no_confidence_and_no_logits():
    kwargs = make_inputs(batch=2, gamma=3, vocab=50, with_confidence=False, store_logits=False, seed=5)
    kernel, ref = run_both(kwargs)
    assert kernel.step_logits is None and kernel.confidence is None
    assert_matches(kernel, ref, kwargs, dtype=torch.float32)


def test_draft_probs_are_softmax_of_step_logits():
    kwargs = make_inputs(batch=4, gamma=3, vocab=90, seed=9)
    out = sequential_head(backend="triton", **clone_kwargs(kwargs))
    temps = kwargs["temperatures"]
    for row in range(4):
        for k in range(3):
            if temps[row] == 0:
                assert out.draft_probs[row, k].item() == 1.0
                continue
            probs = torch.softmax(out.step_logits[row, k].double() / temps[row].double(), dim=-1)
            expected = probs[out.tokens[row, k]].item()
            assert abs(out.draft_probs[row, k].item() - expected) <= 1e-5 * max(expected, 1e-3)


def test_argmax_rows_are_argmax_of_step_logits():
    kwargs = make_inputs(batch=4, gamma=4, vocab=120, seed=13)
    out = sequential_head(backend="triton", **clone_kwargs(kwargs))
    greedy_rows = kwargs["temperatures"] == 0
    assert greedy_rows.any()
    expected = out.step_logits[greedy_rows].argmax(dim=-1)
    assert torch.equal(out.tokens[greedy_rows], expected)


def test_markov_bias_really_feeds_back():
    """A strong bias w1[x] @ w2.T = 10 * onehot(x + 1) makes the draft count up."""
    vocab, rank, gamma = 40, 40, 6
    w1 = torch.eye(vocab, rank)
    w2 = torch.roll(torch.eye(vocab), shifts=1, dims=0) * 10.0  # w2[v] = e_(v-1)
    base = torch.randn(2, gamma, vocab) * 0.1
    anchor = torch.tensor([3, 30])
    for backend in ("triton", "torch"):
        out = sequential_head(base_logits=base, anchor_tokens=anchor, w1=w1, w2=w2, greedy=True, backend=backend)
        assert out.tokens.tolist() == [[4, 5, 6, 7, 8, 9], [31, 32, 33, 34, 35, 36]], backend


def test_ties_take_lowest_index_across_splits():
    vocab = 200
    base = torch.zeros(3, 2, vocab)
    base[0, :, [150, 40, 120]] = 5.0  # a three-way tie spread over splits
    base[1, :, :] = float("-inf")  # nothing selectable: column 0, like torch.argmax
    base[2, 0, [180, 60]] = float("nan")  # NaN wins, lowest NaN column
    kwargs = dict(
        base_logits=base,
        anchor_tokens=torch.zeros(3, dtype=torch.int64),
        w1=torch.zeros(vocab, 16),
        w2=torch.zeros(vocab, 16),
        greedy=True,
    )
    ref = sequential_head_reference(**kwargs)
    assert ref.tokens.tolist() == [[40, 40], [0, 0], [60, 0]]
    for mode, splits in (("persistent", 1), ("stepwise", 4)):
        out = sequential_head(backend="triton", launch_mode=mode, num_splits=splits, **kwargs)
        assert torch.equal(out.tokens, ref.tokens), (mode, out.tokens)


def test_masked_vocab_with_sampling():
    kwargs = make_inputs(batch=4, gamma=3, vocab=150, seed=21)
    kwargs["base_logits"][:, :, 1::2] = float("-inf")  # odd columns masked
    kernel, ref = run_both(kwargs, launch_mode="stepwise", num_splits=3)
    assert torch.all(kernel.tokens % 2 == 0)
    assert_matches(kernel, ref, kwargs, dtype=torch.float32)


def test_noise_depends_on_offset_and_seed_and_offset_is_not_advanced():
    kwargs = make_inputs(batch=4, gamma=4, vocab=64, seed=17)
    kwargs["base_logits"].zero_()  # flat logits: the noise alone picks the tokens
    kwargs["temperatures"].fill_(1.0)
    first = sequential_head(backend="triton", **clone_kwargs(kwargs)).tokens
    assert kwargs["offset"].item() == make_inputs(batch=4, gamma=4, vocab=64, seed=17)["offset"].item()
    again = sequential_head(backend="triton", **clone_kwargs(kwargs)).tokens
    assert torch.equal(first, again)
    bumped = clone_kwargs(kwargs)
    bumped["offset"] = kwargs["offset"] + 1
    assert not torch.equal(first, sequential_head(backend="triton", **bumped).tokens)
    reseeded = clone_kwargs(kwargs)
    reseeded["seed"] = kwargs["seed"] + 1
    assert not torch.equal(first, sequential_head(backend="triton", **reseeded).tokens)


def test_persistent_multi_split_is_refused_by_the_interpreter():
    kwargs = make_inputs(batch=2, gamma=2, vocab=200, seed=1)
    with pytest.raises(ValueError, match="stepwise"):
        sequential_head(backend="triton", launch_mode="persistent", num_splits=2, **kwargs)
