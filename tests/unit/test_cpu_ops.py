"""sgl_kernel CPU stand-ins vs SGLang's own Triton reference kernels (interpreted
on CPU) and vs plain attention maths."""

import os
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F

from sglang_dspark.cpu import ops

SIDE = textwrap.dedent("""
    import sys, torch
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs
    from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens, fill_accept_out_cache_loc
    d = torch.load(sys.argv[1])
    bs = d["rpi"].numel()
    r2t = d["r2t"].clone()
    assign_req_to_token_pool[(bs,)](d["rpi"], r2t, d["start"], d["end"], d["loc"],
                                    r2t.shape[1], 8)
    out = torch.zeros_like(d["loc"])
    assign_extend_cache_locs[(bs,)](d["rpi"], r2t, d["start"], d["end"], out, r2t.shape[1], 8)
    bonus = torch.zeros(bs, dtype=torch.int64)
    fill_bonus_tokens[(bs,)](d["acc_tok"], d["acc_len"], bonus, d["acc_tok"].shape[1])
    aocl = torch.full((d["acc_idx"].numel(),), -7, dtype=torch.int64)
    fill_accept_out_cache_loc[(d["acc_idx"].numel(),)](d["acc_idx"], d["ocl"], aocl, 32)
    torch.save({"r2t": r2t, "ext": out, "bonus": bonus, "aocl": aocl}, sys.argv[2])
""")


def _data():
    g = torch.Generator().manual_seed(1)
    bs, pool_len = 5, 40
    rpi = torch.tensor([3, 0, 4, 1, 2], dtype=torch.int64)
    start = torch.tensor([0, 5, 2, 7, 0], dtype=torch.int64)
    end = start + torch.tensor([4, 0, 9, 3, 6])
    n = int((end - start).sum())
    acc_idx = torch.tensor([0, 1, -1, 3, -1, -1, 6, 7, 8, -1], dtype=torch.int64)
    return {"rpi": rpi, "start": start, "end": end,
            "r2t": torch.zeros(bs, pool_len, dtype=torch.int32),
            "loc": torch.randperm(1000, generator=g)[:n].to(torch.int64),
            "acc_tok": torch.randint(100, (bs, 6), generator=g),
            "acc_len": torch.tensor([1, 6, 3, 2, 4], dtype=torch.int32),
            "acc_idx": acc_idx, "ocl": torch.randint(1000, (10,), generator=g)}


def test_memory_ops_match_sglang_triton(tmp_path):
    d = _data()
    (tmp_path / "side.py").write_text(SIDE)
    torch.save(d, tmp_path / "in.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    subprocess.run([sys.executable, str(tmp_path / "side.py"), str(tmp_path / "in.pt"),
                    str(tmp_path / "out.pt")], check=True, env=env, timeout=600)
    ref = torch.load(tmp_path / "out.pt")
    r2t = d["r2t"].clone()
    ops.assign_req_to_token_pool_cpu(d["rpi"], r2t, d["start"], d["end"], d["loc"], 40)
    assert torch.equal(r2t, ref["r2t"]) and r2t.abs().sum() > 0
    ext = torch.zeros_like(d["loc"])
    ops.assign_extend_cache_locs_cpu(d["rpi"], r2t, d["start"], d["end"], ext, 40)
    assert torch.equal(ext, ref["ext"]) and torch.equal(ext, d["loc"])
    bonus = torch.zeros(5, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(d["acc_tok"], d["acc_len"], bonus, 6)
    assert torch.equal(bonus, ref["bonus"])
    aocl = torch.full((10,), -7, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(d["acc_idx"], d["ocl"], aocl)
    assert torch.equal(aocl, ref["aocl"])


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    bufs = [torch.arange(20 * 6, dtype=torch.float32).view(20, 6).clone(),
            torch.arange(20 * 3, dtype=torch.int64).view(20, 3).clone()]
    before = [b.clone() for b in bufs]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    src = torch.tensor([3, 4, 5])
    tgt = torch.tensor([4, 5, 6])  # overlapping: must behave like a gather-then-scatter
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        assert torch.equal(b[tgt], old[src])
        assert torch.equal(b[:4], old[:4]) and torch.equal(b[7:], old[7:])


def _sdpa(q, k, v, causal_offset=None):
    # q [T,H,D], k/v [S,Hkv,D] -> [T,H,D] with GQA
    h, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hkv, 1)
    v = v.repeat_interleave(h // hkv, 1)
    mask = None
    if causal_offset is not None:
        t, s = q.shape[0], k.shape[0]
        mask = torch.arange(s).view(1, -1) <= (torch.arange(t) + causal_offset).view(-1, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       attn_mask=mask, scale=0.25)
    return o.transpose(0, 1)


def test_decode_and_extend_attention_match_sdpa():
    torch.manual_seed(0)
    H, Hkv, D, N = 4, 2, 16, 64
    kb, vb = torch.randn(N, Hkv, D), torch.randn(N, Hkv, D)
    r2t = torch.randperm(N)[:40].view(2, 20).to(torch.int32)
    rpi = torch.tensor([1, 0])
    seq = torch.tensor([7, 12])
    # decode: writes the new token's KV at loc, then attends over the whole sequence
    q = torch.randn(2, H, D)
    key, val = torch.randn(2, Hkv, D), torch.randn(2, Hkv, D)
    loc = torch.stack([r2t[1, 6], r2t[0, 11]]).long()
    out = torch.empty(2, H, D)
    ops.decode_attention_cpu(q, kb, vb, 1.0, 1.0, out, key, val, loc, None, r2t, rpi, seq,
                             0.25, 0.0, False, 0, None, None)
    assert torch.equal(kb[loc[0]], key[0])
    for i in range(2):
        idx = r2t[rpi[i], : seq[i]].long()
        ref = _sdpa(q[i:i + 1], kb[idx], vb[idx])
        torch.testing.assert_close(out[i:i + 1], ref, atol=1e-5, rtol=1e-5)
    # extend: ragged extend lengths, prefix from the cache, causal within the block
    ext = torch.tensor([3, 5])
    start = torch.tensor([0, 3])
    total = seq + ext
    qe, ke, ve = torch.randn(8, H, D), torch.randn(8, Hkv, D), torch.randn(8, Hkv, D)
    oe = torch.empty(8, H, D)
    ops.extend_attention_cpu(qe, ke, ve, oe, kb, vb, 1.0, 1.0, r2t, rpi, total, ext, start, 5,
                             0.25, 0.0, False, 0, None, None, None, True)
    for i in range(2):
        pre = r2t[rpi[i], : seq[i]].long()
        s, e = int(start[i]), int(ext[i])
        k = torch.cat([kb[pre], ke[s:s + e]])
        v = torch.cat([vb[pre], ve[s:s + e]])
        ref = _sdpa(qe[s:s + e], k, v, causal_offset=int(seq[i]))
        torch.testing.assert_close(oe[s:s + e], ref, atol=1e-5, rtol=1e-5)


def test_unneeded_ops_fail_clearly():
    fn = ops.make_unsupported("fused_experts_cpu")
    try:
        fn()
    except ops.CpuOpUnsupported as e:
        assert "fused_experts_cpu" in str(e)
    else:
        raise AssertionError("expected CpuOpUnsupported")
