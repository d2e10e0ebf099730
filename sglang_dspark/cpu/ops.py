"""Pure-torch stand-ins for the CPU ops SGLang imports from ``sgl_kernel``.

SGLang's CPU engine calls a handful of ``*_cpu`` ops from its CPU build of
``sgl_kernel``, which is not on PyPI (the PyPI wheel is CUDA-only and fails to
import on a machine without ``libcuda``).  Each function here implements the
contract of the op it stands in for, as documented by SGLang's own Triton
reference kernel of the same name (cited per function), in plain torch.

Ops the DSPARK path never reaches are still importable (``from sgl_kernel import
X`` must not fail at module import), but calling one raises a clear error.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

# ---------------------------------------------------------------- memory ops


def _packed_offsets(start: torch.Tensor, end: torch.Tensor) -> list[int]:
    lens = (end.long() - start.long()).tolist()
    offs, acc = [], 0
    for n in lens:
        offs.append(acc)
        acc += n
    return offs


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset,
                                 end_offset, out_cache_loc, pool_len):
    """req_to_token[req, start:end] = out_cache_loc[packed] (Triton: assign_req_to_token_pool)."""
    offs = _packed_offsets(start_offset, end_offset)
    for i, (r, s, e) in enumerate(zip(req_pool_indices.tolist(), start_offset.tolist(),
                                      end_offset.tolist())):
        if e > s:
            req_to_token[r, s:e] = out_cache_loc[offs[i]:offs[i] + e - s].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset,
                                 end_offset, out_cache_loc, pool_len):
    """out_cache_loc[packed] = req_to_token[req, start:end] (Triton: assign_extend_cache_locs)."""
    offs = _packed_offsets(start_offset, end_offset)
    for i, (r, s, e) in enumerate(zip(req_pool_indices.tolist(), start_offset.tolist(),
                                      end_offset.tolist())):
        if e > s:
            out_cache_loc[offs[i]:offs[i] + e - s] = req_to_token[r, s:e].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(*args, **kwargs):
    raise _unsupported("assign_draft_cache_locs_contiguous_cpu")


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer b: row tgt[j] = row src[j], rows of strides[b] bytes
    (Triton: copy_all_layer_kv_cache_tiled; safe when src and tgt overlap)."""
    if tgt_loc.numel() == 0:
        return
    src = src_loc.long()
    tgt = tgt_loc.long()
    rows = int(max(int(src.max()), int(tgt.max()))) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        nbytes = rows * int(stride)
        raw = (ctypes.c_uint8 * nbytes).from_address(int(ptr))
        view = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        view[tgt] = view[src].clone()


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """bonus[i] = accept_tokens.flat[stride*i + accept_lens[i] - 1] (Triton: fill_bonus_tokens)."""
    bs = accept_lens.numel()
    flat = accept_tokens.reshape(-1)
    idx = torch.arange(bs, device=flat.device) * int(accept_stride) + accept_lens.long() - 1
    bonus_tokens.copy_(flat[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Compact out_cache_loc[accept_index[i]] for accept_index[i] != -1, in order
    (Triton: fill_accept_out_cache_loc)."""
    idx = accept_index.reshape(-1)
    keep = idx[idx != -1].long()
    accept_out_cache_loc[: keep.numel()] = out_cache_loc[keep].to(accept_out_cache_loc.dtype)


def verify_tree_greedy_cpu(*, predicts, accept_index, accept_token_num, candidates,
                           retrive_index, retrive_next_token, retrive_next_sibling,
                           target_predict):
    """Greedy tree verification (Triton/CUDA: verify_tree_greedy): walk from the
    root, following the child whose candidate equals the target's prediction."""
    bs, num_draft = candidates.shape
    cand = candidates.tolist()
    tgt = target_predict.reshape(bs, num_draft).tolist()
    ridx = retrive_index.tolist()
    nxt = retrive_next_token.tolist()
    sib = retrive_next_sibling.tolist()
    num_spec = accept_index.shape[1]
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        cur = 0
        n_acc = 0
        for j in range(1, num_spec):
            child = nxt[b][cur]
            found = False
            while child != -1:
                if cand[b][child] == tgt[b][cur]:
                    predicts[last] = cand[b][child]
                    n_acc += 1
                    accept_index[b, j] = ridx[b][child]
                    last = ridx[b][child]
                    cur = child
                    found = True
                    break
                child = sib[b][child]
            if not found:
                break
        accept_token_num[b] = n_acc
        predicts[last] = tgt[b][cur]


def build_tree_kernel_efficient_cpu(*args, **kwargs):
    raise _unsupported("build_tree_kernel_efficient_cpu")


def build_draft_decode_metadata_cpu(*args, **kwargs):
    raise _unsupported("build_draft_decode_metadata_cpu")


# ------------------------------------------------------------------ attention


def _softcap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(scores / cap) if cap and cap > 0 else scores


def _attend(q, k, v, scale, logit_cap, mask=None, sinks=None):
    """q [Tq,H,D], k [Tk,Hkv,D], v [Tk,Hkv,Dv] -> [Tq,H,Dv], in float32."""
    h, hkv = q.shape[1], k.shape[1]
    group = h // hkv
    qf = q.float().transpose(0, 1)                                  # H,Tq,D
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # H,Tk,D
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    s = _softcap(torch.matmul(qf, kf.transpose(1, 2)) * scale, logit_cap)
    if mask is not None:
        s = s.masked_fill(~mask.unsqueeze(0), float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(h, 1, 1).expand(h, s.shape[1], 1)
        s = torch.cat([s, sink], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p, vf).transpose(0, 1)


def _window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int):
    m = torch.ones(q_pos.numel(), k_pos.numel(), dtype=torch.bool)
    if causal:
        m &= k_pos.view(1, -1) <= q_pos.view(-1, 1)
    if window and window > 0:
        m &= k_pos.view(1, -1) > q_pos.view(-1, 1) - window
    return m


def decode_attention_cpu(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    k_scale: float, v_scale: float, output: torch.Tensor,
    key: Optional[torch.Tensor], value: Optional[torch.Tensor], loc: torch.Tensor,
    attn_logits: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float, logit_cap: float, is_cross_attention: bool,
    sliding_window_size: int, encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
) -> None:
    """One query token per sequence over its whole KV (SGLang op decode_attention_cpu).

    If ``key``/``value`` are given they are first written at ``loc`` (the op writes
    the new token's KV itself).  ``sliding_window_size`` <= 0 means no window.
    """
    if is_cross_attention:
        raise _unsupported("decode_attention_cpu(is_cross_attention=True)")
    if key is not None and value is not None:
        k_buffer[loc.long()] = key.view(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc.long()] = value.view(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    for i, (r, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        idx = req_to_token[r, :n].long()
        if sliding_window_size and sliding_window_size > 0:
            idx = idx[-sliding_window_size:]
        k = k_buffer[idx].float() * float(k_scale)
        v = v_buffer[idx].float() * float(v_scale)
        out = _attend(q[i:i + 1], k, v, sm_scale, logit_cap, sinks=sinks)
        output[i] = out[0].to(output.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor, k_extend: torch.Tensor, v_extend: torch.Tensor,
    o_extend: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    k_scale: float, v_scale: float, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor, max_len_extend: int, sm_scale: float, logit_cap: float,
    is_cross_attention: bool, sliding_window_size: int, encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor], tree_mask: Optional[torch.Tensor], is_causal: bool,
) -> None:
    """Extend queries attend to the cached prefix plus the extend tokens
    (SGLang op extend_attention_cpu).  Chains only: ``tree_mask`` must be None."""
    if is_cross_attention:
        raise _unsupported("extend_attention_cpu(is_cross_attention=True)")
    if tree_mask is not None:
        raise _unsupported("extend_attention_cpu with a tree mask (tree_topk > 1)")
    for i, (r, n, e, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(),
                                          extend_seq_lens.tolist(),
                                          extend_start_loc.tolist())):
        if e == 0:
            continue
        prefix = n - e
        idx = req_to_token[r, :prefix].long()
        k = torch.cat([k_buffer[idx].float() * float(k_scale), k_extend[s:s + e].float()])
        v = torch.cat([v_buffer[idx].float() * float(v_scale), v_extend[s:s + e].float()])
        q_pos = torch.arange(prefix, n)
        k_pos = torch.arange(0, n)
        mask = _window_mask(q_pos, k_pos, is_causal, sliding_window_size)
        out = _attend(q_extend[s:s + e], k, v, sm_scale, logit_cap, mask=mask, sinks=sinks)
        o_extend[s:s + e] = out.to(o_extend.dtype)


# ------------------------------------------------------------------ helpers


class CpuOpUnsupported(NotImplementedError):
    pass


def _unsupported(name: str) -> CpuOpUnsupported:
    return CpuOpUnsupported(
        f"sglang-dspark's CPU stand-in does not implement sgl_kernel.{name}; the DSPARK "
        "CPU path does not need it. Use a GPU, or SGLang's CPU build of sgl_kernel, "
        "for other algorithms/models on CPU."
    )


def make_unsupported(name: str):
    def _missing(*args, **kwargs):
        raise _unsupported(name)

    _missing.__name__ = name
    return _missing


MODULE_OPS = {
    f.__name__: f
    for f in (
        assign_req_to_token_pool_cpu, assign_extend_cache_locs_cpu,
        assign_draft_cache_locs_contiguous_cpu, copy_all_layer_kv_cache_cpu,
        fill_bonus_tokens_cpu, fill_accept_out_cache_loc_cpu, verify_tree_greedy_cpu,
        build_tree_kernel_efficient_cpu, build_draft_decode_metadata_cpu,
    )
}
TORCH_OPS = {"decode_attention_cpu": decode_attention_cpu,
             "extend_attention_cpu": extend_attention_cpu}
