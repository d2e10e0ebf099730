"""Torch chain rejection sampling vs SGLang's own Triton kernel (run by the Triton
interpreter on CPU) and vs a direct statement of the rejection rule."""

import os
import subprocess
import sys
import textwrap

import torch

from sglang_dspark.cpu.rejection import chain_speculative_sampling_torch


def _case(seed, bs=4, slots=5, vocab=37, peaked=False):
    g = torch.Generator().manual_seed(seed)
    def dist(*shape):
        x = torch.randn(*shape, vocab, generator=g) * (4.0 if peaked else 1.0)
        return torch.softmax(x, -1)
    tp = dist(bs, slots)
    dp = dist(bs, slots - 1)
    cand = torch.zeros(bs, slots, dtype=torch.int64)
    cand[:, 0] = torch.randint(vocab, (bs,), generator=g)
    for s in range(1, slots):
        cand[:, s] = torch.multinomial(dp[:, s - 1], 1, generator=g).squeeze(1)
    ridx = torch.arange(bs * slots, dtype=torch.int64).view(bs, slots)
    u = torch.rand(bs, slots - 1, generator=g)
    uf = torch.rand(bs, generator=g)
    return tp, dp, cand, ridx, u, uf


def _run_torch(case, block):
    tp, dp, cand, ridx, u, uf = case
    bs, slots = cand.shape
    predicts = torch.full((bs * slots,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, slots), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    chain_speculative_sampling_torch(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=cand, retrive_index=ridx, retrive_next_token=None,
        retrive_next_sibling=None, uniform_samples=u, uniform_samples_for_final_sampling=uf,
        target_probs=tp, draft_probs=dp, threshold_single=1.0, threshold_acc=1.0,
        deterministic=True, block_verification=block)
    return predicts, accept_index, accept_num


SGLANG_SIDE = textwrap.dedent("""
    import sys, torch
    from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton
    cases = torch.load(sys.argv[1])
    outs = []
    for (tp, dp, cand, ridx, u, uf), block in cases:
        bs, slots = cand.shape
        predicts = torch.full((bs * slots,), -1, dtype=torch.int32)
        accept_index = torch.full((bs, slots), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        chain_speculative_sampling_triton(predicts, accept_index, accept_num, cand, ridx,
            None, None, u, uf, tp, dp, 1.0, 1.0, True, block_verification=block)
        outs.append((predicts, accept_index, accept_num))
    torch.save(outs, sys.argv[2])
""")


def test_matches_sglang_triton_kernel_exactly(tmp_path):
    cases = [(_case(seed, peaked=seed % 2 == 0), block)
             for seed in range(12) for block in (False, True)]
    cin, cout, script = tmp_path / "in.pt", tmp_path / "out.pt", tmp_path / "side.py"
    torch.save(cases, cin)
    script.write_text(SGLANG_SIDE)
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    subprocess.run([sys.executable, str(script), str(cin), str(cout)], check=True, env=env,
                   timeout=600)
    theirs = torch.load(cout)
    accepted_some = 0
    for (case, block), (p_ref, ai_ref, an_ref) in zip(cases, theirs):
        p, ai, an = _run_torch(case, block)
        assert torch.equal(an, an_ref), (block, an, an_ref)
        assert torch.equal(ai, ai_ref)
        assert torch.equal(p, p_ref)
        accepted_some += int((an > 0).sum())
    assert accepted_some > 0


def test_emits_the_target_distribution():
    """Speculative sampling is lossless: the first emitted token ~ p_target."""
    torch.manual_seed(0)
    vocab, n = 6, 6000
    p = torch.tensor([0.35, 0.25, 0.15, 0.1, 0.1, 0.05])
    q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.2, 0.1])
    tp = p.expand(n, 2, vocab).clone()
    dp = q.expand(n, 1, vocab).clone()
    cand = torch.stack([torch.zeros(n, dtype=torch.int64),
                        torch.multinomial(q, n, replacement=True)], 1)
    ridx = torch.arange(n * 2).view(n, 2)
    case = (tp, dp, cand, ridx, torch.rand(n, 1), torch.rand(n))
    predicts, accept_index, accept_num = _run_torch(case, block=False)
    # first emitted token: the accepted draft if accepted, else the correction
    first = torch.where(accept_num > 0, cand[:, 1], predicts.view(n, 2)[:, 0].long())
    counts = torch.bincount(first, minlength=vocab).double()
    expected = p.double() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, chi2  # chi-square, 5 dof, p = 0.001
    # and the acceptance rate is sum(min(p, q))
    assert abs(float((accept_num > 0).double().mean()) - float(torch.minimum(p, q).sum())) < 0.03
