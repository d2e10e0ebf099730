"""Triton kernel: DSpark's whole sequential stage + confidence in one launch.

Work split
----------
The grid is ``(num_splits, row_blocks)``. Program ``(s, m)`` owns rows
``[m * BLOCK_M, (m + 1) * BLOCK_M)`` and the vocab chunk ``s`` (a run of
``tiles_per_split`` tiles of ``BLOCK_V`` columns). For every draft step it

1. gathers ``w1[prev]`` for its rows and computes the Markov bias of its chunk with
   ``tl.dot`` (``[BLOCK_M, r] x [r, BLOCK_V]`` per tile, fp32 accumulation),
2. adds the base logits, rounds like SGLang (bias to the weight dtype, sum to the
   step dtype), optionally stores the step logits, adds the Philox Gumbel noise on
   sampled rows, keeps a running (argmax, NaN flag, value) and an online
   log-sum-exp of ``z / T`` per row,
3. writes one partial per (row, step, split) and the rows' chunk winners are
   combined into the step's token (lowest column on ties, NaN wins).

Split ``k % num_splits`` also computes the confidence of step ``k`` (it needs only
``h_k`` and ``w1[x_{k-1}]``); split 0 writes tokens and ``p_d(x_k)``.

Step-to-step synchronisation (``launch_mode``)
-----------------------------------------------
* ``persistent``: one launch for the whole block. With ``num_splits > 1`` the
  programs of a row block meet at a per-row-block barrier (an atomic counter in a
  cached workspace, self-resetting at kernel exit, so it is CUDA-graph safe).
  The launcher keeps the whole grid within the SMs available to this process
  (torch's SM count, limited by ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), so every
  program is resident and the spin cannot deadlock; a requested split count that
  does not fit runs stepwise instead (logged once). With ``num_splits == 1`` there is no
  barrier at all (each program owns whole rows).
* ``stepwise``: ``gamma + 1`` launches of the same kernel; launch ``j`` first
  combines step ``j - 1``'s partials, then computes step ``j``. The kernel
  boundary is the barrier. No atomics; works in the Triton interpreter with any
  number of splits, and on any grid size.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional

import torch
import triton
import triton.language as tl

from dspark_kernels.contract import SeqHeadInputs, SeqHeadOutput
from sglang_dspark.settings import BY_NAME as _SETTINGS  # pure Python: our variables' one parser

_BIG_INDEX = tl.constexpr(2147483647)
_UNIFORM_SCALE = tl.constexpr(2.3283064365386963e-10)
_ROUND_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _round_code(dtype: torch.dtype) -> int:
    code = _ROUND_CODE[dtype]
    # The interpreter's float16 downcast truncates; use the bit-arithmetic rounding.
    return 3 if (code == 2 and _is_interpreter()) else code


LAUNCH_MODES = _SETTINGS["SGLANG_DSPARK_SEQ_HEAD_LAUNCH"].parse.values


@triton.jit
def _round_to(x, CODE: tl.constexpr):
    # Round float32 values to a 16-bit float and back, round-to-nearest-even.
    # CODE: 0 = keep float32, 1 = bfloat16, 2 = float16 (native cvt), 3 = float16 by
    # bit arithmetic (interpreter: its float downcast truncates). bfloat16 always
    # uses the bit form: exact RNE, NaN kept, overflow to inf, on every platform.
    if CODE == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif CODE == 2:
        x = x.to(tl.float16).to(tl.float32)
    elif CODE == 3:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0xFFF + ((bits >> 13) & 1)) >> 13) << 13
        y = bits.to(tl.float32, bitcast=True)
        y = tl.where(y > 65504.0, float("inf"), tl.where(y < -65504.0, float("-inf"), y))
        x = tl.where(x != x, x, y)
    return x


@triton.jit
def _gumbel_tile(SEED, rows, col0, step, offset_lo, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    # [BLOCK_M, BLOCK_V] Gumbel noise -log(-log1p(-u)) of columns col0 .. col0 + BLOCK_V.
    # One Philox call per 4 columns; word j of quad q goes to column 4 * q + j.
    zero = tl.zeros([BLOCK_M, BLOCK_V // 4], tl.int64)
    quads = col0 // 4 + tl.arange(0, BLOCK_V // 4)
    c0 = (zero + quads[None, :]).to(tl.uint32)
    c1 = (zero + rows[:, None]).to(tl.uint32)
    c2 = (zero + step).to(tl.uint32)
    c3 = (zero + offset_lo).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(SEED, c0, c1, c2, c3, 10)
    bits = tl.interleave(tl.interleave(w0, w2), tl.interleave(w1, w3))
    u = (bits.to(tl.float32) + 0.5) * _UNIFORM_SCALE
    w = 1.0 - u
    exact = w == 1.0
    denominator = tl.where(exact, -1.0, w - 1.0)
    log1p_neg_u = tl.where(exact, -u, tl.log(w) * (-u / denominator))
    return -tl.log(-log1p_neg_u)


@triton.jit
def _combine_step(
    PART_F,
    PART_I,
    rows,
    k,
    G,
    NUM_SPLITS,
    BLOCK_M: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    VOLATILE: tl.constexpr,
):
    # Combine the per-split partials of step k into (token, p_d) per row, walking
    # the splits in chunks (lowest column first, so ties keep the lowest index).
    best_key = tl.full([BLOCK_M], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_M], _BIG_INDEX, tl.int32)
    best_nan = tl.zeros([BLOCK_M], tl.int32)
    best_s = tl.zeros([BLOCK_M], tl.float32)
    run_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    run_l = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(0, NUM_SPLITS, SPLIT_CHUNK):
        sp = c0 + tl.arange(0, SPLIT_CHUNK)
        slot = (rows.to(tl.int64)[:, None] * G + k) * SPLITS_P2 + sp[None, :]
        smask = (sp[None, :] < NUM_SPLITS) & (rows[:, None] >= 0)
        key = tl.load(PART_F + slot * 4, mask=smask, other=float("-inf"), volatile=VOLATILE)
        sval = tl.load(PART_F + slot * 4 + 1, mask=smask, other=0.0, volatile=VOLATILE)
        mx = tl.load(PART_F + slot * 4 + 2, mask=smask, other=float("-inf"), volatile=VOLATILE)
        sm = tl.load(PART_F + slot * 4 + 3, mask=smask, other=0.0, volatile=VOLATILE)
        idx = tl.load(PART_I + slot * 2, mask=smask, other=_BIG_INDEX, volatile=VOLATILE)
        nan = tl.load(PART_I + slot * 2 + 1, mask=smask, other=0, volatile=VOLATILE)
        valid = smask & (idx != _BIG_INDEX)
        c_nan = tl.max(tl.where(valid, nan, 0), axis=1)
        c_best = tl.max(tl.where(valid & (nan == 0), key, float("-inf")), axis=1)
        win = valid & tl.where(c_nan[:, None] > 0, nan > 0, key == c_best[:, None])
        c_idx = tl.min(tl.where(win, idx, _BIG_INDEX), axis=1)
        c_s = tl.sum(tl.where(valid & (idx == c_idx[:, None]), sval, 0.0), axis=1)
        take = (c_idx != _BIG_INDEX) & (
            (best_idx == _BIG_INDEX)
            | (c_nan > best_nan)
            | ((c_nan == best_nan) & (best_nan == 0) & (c_best > best_key))
        )
        best_key = tl.where(take, c_best, best_key)
        best_idx = tl.where(take, c_idx, best_idx)
        best_nan = tl.where(take, c_nan, best_nan)
        best_s = tl.where(take, c_s, best_s)
        # log-sum-exp merge of the chunk's (max, sum) pairs
        live = valid & (mx > float("-inf"))
        c_m = tl.max(tl.where(live, mx, float("-inf")), axis=1)
        new_m = tl.maximum(run_m, c_m)
        new_m_safe = tl.where(new_m == float("-inf"), 0.0, new_m)
        c_l = tl.sum(tl.where(live, sm * tl.exp(tl.where(live, mx, 0.0) - new_m_safe[:, None]), 0.0), axis=1)
        run_l = run_l * tl.exp(tl.where(run_m == float("-inf"), float("-inf"), run_m - new_m_safe)) + c_l
        run_m = new_m
    m_safe = tl.where(run_m == float("-inf"), 0.0, run_m)
    # run_l is 0 only when no p_d was accumulated (argmax-only launches): prob unused.
    prob = tl.exp(best_s - m_safe) / tl.where(run_l > 0.0, run_l, 1.0)
    return best_idx, prob


# Runtime sizes and step bounds vary per call: no value specialisation, so one
# compiled variant serves every batch size and every stepwise launch.
@triton.jit(
    do_not_specialize=[
        "SEED", "B", "G", "STEP_BEGIN", "STEP_END", "TILES_PER_SPLIT", "NUM_SPLITS",
    ]
)  # fmt: skip
def _seq_head_kernel(
    BASE,
    s_base_b,
    s_base_k,
    ANCHOR,
    W1,
    s_w1,
    W2,
    s_w2,
    TEMPS,
    OFFSET,
    SEED,
    LOGITS_OUT,
    s_lo_b,
    s_lo_k,
    HIDDEN,
    s_h_b,
    s_h_k,
    CONF_W,
    CONF_B,
    STS,
    s_sts,
    TOKENS,
    PROBS,
    CONF_OUT,
    RAW_OUT,
    PART_F,
    PART_I,
    COUNTERS,
    B,
    V,
    R,
    H,
    G,
    STEP_BEGIN,
    STEP_END,
    TILES_PER_SPLIT,
    NUM_SPLITS,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    W_ROUND: tl.constexpr,
    STEP_ROUND: tl.constexpr,
    HID_ROUND: tl.constexpr,
    FEAT_ROUND: tl.constexpr,
    RAW_ROUND: tl.constexpr,
    DOT_F32: tl.constexpr,
    SAMPLE: tl.constexpr,
    PROBS_ON: tl.constexpr,
    STORE: tl.constexpr,
    HAS_CONF: tl.constexpr,
    CONF_MARKOV: tl.constexpr,
    HAS_CONF_BIAS: tl.constexpr,
    PERSISTENT: tl.constexpr,
    USE_BARRIER: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < B
    rows64 = rows.to(tl.int64)

    if SAMPLE:
        temps = tl.load(TEMPS + rows, mask=row_ok, other=0.0)
        sampled = temps != 0.0
        any_sampled = tl.max(sampled.to(tl.int32), axis=0)
        safe_t = tl.where(sampled, temps, 1.0)
        offset_lo = tl.load(OFFSET) & 0xFFFFFFFF
    else:
        sampled = rows < 0
        safe_t = tl.full([BLOCK_M], 1.0, tl.float32)

    tile_begin = pid_s * TILES_PER_SPLIT
    tile_end = tl.minimum(tile_begin + TILES_PER_SPLIT, tl.cdiv(V, BLOCK_V))
    r_offs = tl.arange(0, BLOCK_R)
    v_offs = tl.arange(0, BLOCK_V)

    # The previous token of the first step this launch computes.
    if STEP_BEGIN == 0:
        prev = tl.load(ANCHOR + rows, mask=row_ok, other=0).to(tl.int64)
    else:
        token, prob = _combine_step(
            PART_F, PART_I, rows, STEP_BEGIN - 1, G, NUM_SPLITS, BLOCK_M, SPLITS_P2, SPLIT_CHUNK, False
        )
        if pid_s == 0:
            tl.store(TOKENS + rows64 * G + STEP_BEGIN - 1, token.to(tl.int64), mask=row_ok)
            if PROBS_ON:
                tl.store(PROBS + rows64 * G + STEP_BEGIN - 1, tl.where(sampled, prob, 1.0), mask=row_ok)
        prev = token.to(tl.int64)
    prev = tl.where(row_ok, prev, 0)

    for k in range(STEP_BEGIN, STEP_END):
        # ---- confidence of step k: needs h_k and w1[x_{k-1}] only; the steps'
        # confidences are spread over the splits so no program carries all of them ----
        if HAS_CONF:
            if pid_s == k % NUM_SPLITS:
                acc_c = tl.zeros([BLOCK_M], tl.float32)
                for h0 in range(0, H, BLOCK_H):
                    h_offs = h0 + tl.arange(0, BLOCK_H)
                    h_ok = h_offs < H
                    hv = tl.load(
                        HIDDEN + rows64[:, None] * s_h_b + k * s_h_k + h_offs[None, :],
                        mask=row_ok[:, None] & h_ok[None, :],
                        other=0.0,
                    ).to(tl.float32)
                    hv = _round_to(hv, FEAT_ROUND)
                    wv = tl.load(CONF_W + h_offs, mask=h_ok, other=0.0).to(tl.float32)
                    acc_c += tl.sum(hv * wv[None, :], axis=1)
                if CONF_MARKOV:
                    for r0 in range(0, R, BLOCK_R):
                        rr = r0 + r_offs
                        r_ok = rr < R
                        ev = tl.load(
                            W1 + prev[:, None] * s_w1 + rr[None, :],
                            mask=row_ok[:, None] & r_ok[None, :],
                            other=0.0,
                        ).to(tl.float32)
                        ev = _round_to(_round_to(ev, HID_ROUND), FEAT_ROUND)
                        wv = tl.load(CONF_W + H + rr, mask=r_ok, other=0.0).to(tl.float32)
                        acc_c += tl.sum(ev * wv[None, :], axis=1)
                if HAS_CONF_BIAS:
                    acc_c += tl.load(CONF_B).to(tl.float32)
                raw = _round_to(acc_c, RAW_ROUND)
                sts = tl.load(STS + k * s_sts)
                conf = 1.0 / (1.0 + tl.exp(-(raw / sts)))
                tl.store(RAW_OUT + rows64 * G + k, raw, mask=row_ok)
                tl.store(CONF_OUT + rows64 * G + k, conf, mask=row_ok)

        # ---- this split's share of step k ----
        best_key = tl.full([BLOCK_M], float("-inf"), tl.float32)
        best_s = tl.zeros([BLOCK_M], tl.float32)
        best_idx = tl.full([BLOCK_M], _BIG_INDEX, tl.int32)
        best_nan = tl.zeros([BLOCK_M], tl.int32)
        run_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        run_l = tl.zeros([BLOCK_M], tl.float32)
        for t in range(tile_begin, tile_end):
            cols = t * BLOCK_V + v_offs
            col_ok = cols < V
            acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
            for r0 in range(0, R, BLOCK_R):
                rr = r0 + r_offs
                r_ok = rr < R
                e = tl.load(
                    W1 + prev[:, None] * s_w1 + rr[None, :],
                    mask=r_ok[None, :],
                    other=0.0,
                )
                w = tl.load(
                    W2 + cols.to(tl.int64)[:, None] * s_w2 + rr[None, :],
                    mask=col_ok[:, None] & r_ok[None, :],
                    other=0.0,
                )
                if DOT_F32:
                    # fp32 weights, or the interpreter (its dot misreads 16-bit floats).
                    # bf16/fp16 products are exact in fp32, so the maths is the same.
                    acc = tl.dot(
                        e.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee"
                    )
                else:
                    acc = tl.dot(e, tl.trans(w), acc)
            bias = _round_to(acc, W_ROUND)
            base = tl.load(
                BASE + rows64[:, None] * s_base_b + k * s_base_k + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            z = _round_to(base + bias, STEP_ROUND)
            if STORE:
                tl.store(
                    LOGITS_OUT + rows64[:, None] * s_lo_b + k * s_lo_k + cols[None, :],
                    z,
                    mask=row_ok[:, None] & col_ok[None, :],
                )
            key = z
            scaled = z
            if SAMPLE:
                scaled = z / safe_t[:, None]
                if any_sampled > 0:
                    noise = _gumbel_tile(SEED, rows, t * BLOCK_V, k, offset_lo, BLOCK_M, BLOCK_V)
                    key = tl.where(sampled[:, None], scaled + noise, z)
                if PROBS_ON:
                    tile_m = tl.max(tl.where(col_ok[None, :], scaled, float("-inf")), axis=1)
                    new_m = tl.maximum(run_m, tile_m)
                    new_m_safe = tl.where(new_m == float("-inf"), 0.0, new_m)
                    run_l = run_l * tl.exp(tl.where(run_m == float("-inf"), float("-inf"), run_m - new_m_safe))
                    run_l += tl.sum(
                        tl.where(col_ok[None, :], tl.exp(scaled - new_m_safe[:, None]), 0.0), axis=1
                    )
                    run_m = new_m
            is_nan = col_ok[None, :] & (key != key)
            tile_nan = tl.max(is_nan.to(tl.int32), axis=1)
            tile_best = tl.max(tl.where(col_ok[None, :] & ~is_nan, key, float("-inf")), axis=1)
            win = tl.where(tile_nan[:, None] > 0, is_nan, col_ok[None, :] & (key == tile_best[:, None]))
            tile_idx = tl.min(tl.where(win, cols[None, :], _BIG_INDEX), axis=1)
            take = (tile_idx != _BIG_INDEX) & (
                (best_idx == _BIG_INDEX)
                | (tile_nan > best_nan)
                | ((tile_nan == best_nan) & (best_nan == 0) & (tile_best > best_key))
            )
            if PROBS_ON:
                tile_s = tl.sum(tl.where(cols[None, :] == tile_idx[:, None], scaled, 0.0), axis=1)
                best_s = tl.where(take, tile_s, best_s)
            best_key = tl.where(take, tile_best, best_key)
            best_idx = tl.where(take, tile_idx, best_idx)
            best_nan = tl.where(take, tile_nan, best_nan)

        slot = (rows64 * G + k) * SPLITS_P2 + pid_s
        tl.store(PART_F + slot * 4, best_key)
        tl.store(PART_F + slot * 4 + 1, best_s)
        tl.store(PART_F + slot * 4 + 2, run_m)
        tl.store(PART_F + slot * 4 + 3, run_l)
        tl.store(PART_I + slot * 2, best_idx)
        tl.store(PART_I + slot * 2 + 1, best_nan)

        if PERSISTENT:
            # Partials are re-read by other threads (and, with splits, other programs).
            tl.debug_barrier()
            if USE_BARRIER:
                # Every program of this row block has published step k.
                tl.atomic_add(COUNTERS + pid_m, 1, sem="release")
                target = (k + 1) * NUM_SPLITS
                while tl.atomic_add(COUNTERS + pid_m, 0, sem="acquire") < target:
                    pass
            token, prob = _combine_step(
                PART_F, PART_I, rows, k, G, NUM_SPLITS, BLOCK_M, SPLITS_P2, SPLIT_CHUNK, USE_BARRIER
            )
            if pid_s == 0:
                tl.store(TOKENS + rows64 * G + k, token.to(tl.int64), mask=row_ok)
                if PROBS_ON:
                    tl.store(PROBS + rows64 * G + k, tl.where(sampled, prob, 1.0), mask=row_ok)
            prev = tl.where(row_ok, token.to(tl.int64), 0)

    if PERSISTENT:
        if USE_BARRIER:
            # Exit arrival; the last program out resets the counter for the next launch.
            tl.debug_barrier()
            arrived = tl.atomic_add(COUNTERS + pid_m, 1, sem="acq_rel")
            if arrived == (STEP_END + 1) * NUM_SPLITS - 1:
                tl.atomic_xchg(COUNTERS + pid_m, 0, sem="release")


# ---------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------

_WORKSPACE_LOCK = threading.Lock()
# device -> list of counter buffers (all kept alive: captured graphs may point at any).
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}
_MIN_COUNTERS = 4096


def _is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernel_is_interpreted() -> bool:
    return not isinstance(_seq_head_kernel, triton.runtime.jit.JITFunction)


def barrier_counters(device: torch.device, needed: int) -> torch.Tensor:
    """The cached, zero-initialised int32 barrier counters of ``device``.

    Counters are reset by the kernel itself, so one buffer serves every launch on
    one stream. Grown (never freed) only outside graph capture.
    """
    device = torch.device(device)
    with _WORKSPACE_LOCK:
        buffers = _COUNTERS.setdefault(device, [])
        if buffers and buffers[-1].numel() >= needed:
            return buffers[-1]
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "dspark_kernels: the barrier workspace must grow during CUDA graph capture; "
                "call dspark_kernels.reserve_workspace(device=..., max_batch=...) before capturing."
            )
        size = max(_MIN_COUNTERS, triton.next_power_of_2(needed))
        buffers.append(torch.zeros(size, dtype=torch.int32, device=device))
        return buffers[-1]


def reserve_workspace(*, device, max_batch: int = 4096) -> None:
    """Allocate the barrier counters for up to ``max_batch`` rows before graph capture."""
    barrier_counters(torch.device(device), triton.cdiv(max_batch, 16))


# ---------------------------------------------------------------------------
# how many programs are resident at once (the persistent barrier's premise)
# ---------------------------------------------------------------------------

MPS_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()
# CUDA device index -> available SMs (MPS reads its variable once, when CUDA starts)
_AVAILABLE_SMS: dict[int, int] = {}


def _log_once(key: str, level: int, message: str) -> None:
    """Log ``message`` the first time ``key`` comes up in this process."""
    if key not in _LOGGED:
        _LOGGED.add(key)
        _logger.log(level, "dspark_kernels: %s", message)


def available_sms(sm_count: int, mps_active_thread_percentage: Optional[str] = None) -> int:
    """How many SMs one launch of this process can count on at once (at least 1).

    ``sm_count`` is what torch reports for the device; ``mps_active_thread_percentage``
    the text of ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (None or blank: not set). Under
    that MPS limit a client's kernels run on about that share of the SMs, so the
    answer is ``floor(sm_count * percentage / 100)``. This may undercount (if the
    driver already reports the limited count, or rounds the share up to whole TPCs),
    which only costs vocab splits, never a hang. A value that is not a number in
    (0, 100] gives 1: a launch then never needs two programs resident together.
    Pure function (no device, no environment).
    """
    sms = max(1, int(sm_count))
    if mps_active_thread_percentage is None or not mps_active_thread_percentage.strip():
        return sms
    text = mps_active_thread_percentage.strip()
    try:
        pct = float(text)
    except ValueError:
        pct = float("nan")
    if not 0.0 < pct <= 100.0:  # also NaN
        _log_once(
            "bad-mps-percentage",
            logging.WARNING,
            f"{MPS_PERCENTAGE_ENV}={text!r} is not a percentage in (0, 100]; the sequential "
            "head plans as if one SM were available (no cross-program barrier). Set it to "
            "a number such as 50, or unset it.",
        )
        return 1
    return max(1, int(sms * pct / 100.0))


def device_available_sms(device: torch.device) -> int:
    """:func:`available_sms` of a CUDA ``device``: torch's SM count, limited by
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; 1 for other devices. Cached per device."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    cached = _AVAILABLE_SMS.get(index)
    if cached is None:
        reported = int(torch.cuda.get_device_properties(index).multi_processor_count)
        cached = available_sms(reported, os.environ.get(MPS_PERCENTAGE_ENV))
        _AVAILABLE_SMS[index] = cached
        if cached < reported:
            _log_once(
                f"mps-limit-{index}",
                logging.INFO,
                f"cuda:{index} reports {reported} SMs; {MPS_PERCENTAGE_ENV} leaves {cached}, "
                "so persistent sequential-head launches keep their grid within that.",
            )
    return cached


class LaunchPlan:
    __slots__ = (
        "mode",
        "block_m",
        "block_v",
        "block_r",
        "block_h",
        "row_blocks",
        "num_splits",
        "tiles_per_split",
        "num_warps",
    )

    def __repr__(self) -> str:
        return "LaunchPlan(" + ", ".join(f"{s}={getattr(self, s)}" for s in self.__slots__) + ")"


# GPU tile shapes per rows-per-program: (BLOCK_V, BLOCK_R, num_warps). Picked so that
# ptxas (sm_90, Triton 3.x) reports no register spills for every variant; see
# tests/kernels/test_kernels_gpu_compile.py. Not yet tuned on a GPU.
_GPU_TILES = {16: (64, 32, 8), 32: (64, 32, 8), 64: (32, 32, 8)}


def plan_launch(
    *,
    batch: int,
    vocab: int,
    rank: int,
    device: torch.device,
    launch_mode: str = "auto",
    num_splits: Optional[int] = None,
    block_m: Optional[int] = None,
    block_v: Optional[int] = None,
    sm_count: Optional[int] = None,
    interpret: Optional[bool] = None,
) -> LaunchPlan:
    """Choose block sizes, the vocab split and the launch mode.

    A persistent launch with more than one vocab split spins at a barrier until every
    program of its row block has arrived, so its whole grid must be resident at once:
    it is kept within the SMs available to this process (:func:`device_available_sms`:
    torch's SM count, limited by ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). A requested
    split count whose grid does not fit runs ``stepwise`` instead (no barrier; logged
    once). ``sm_count`` / ``interpret`` override the detected device (for planning a
    GPU launch on a machine without one, or under a known SM limit).
    """
    if launch_mode not in LAUNCH_MODES:
        raise ValueError(f"launch_mode must be one of {LAUNCH_MODES}, got {launch_mode!r}.")
    if interpret is None:
        interpret = _is_interpreter() or device.type != "cuda"
    plan = LaunchPlan()
    if block_m is None:
        block_m = 16 if (batch <= 16 or interpret) else (32 if batch <= 64 else 64)
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16 (tl.dot), got {block_m}.")
    gpu_v, gpu_r, gpu_warps = _GPU_TILES.get(block_m, (32, 32, 8))
    if block_v is None:
        block_v = 64 if interpret else gpu_v
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}.")
    plan.block_m = block_m
    plan.block_v = block_v
    plan.block_r = max(16, min(64 if interpret else gpu_r, triton.next_power_of_2(rank)))
    plan.block_h = 128
    plan.num_warps = 4 if interpret else gpu_warps
    plan.row_blocks = triton.cdiv(batch, block_m)
    n_tiles = triton.cdiv(vocab, block_v)
    sms = max(1, int(sm_count)) if sm_count is not None else device_available_sms(device)

    mode = launch_mode
    if mode == "auto":
        from sglang_dspark.settings import read

        mode = read("SGLANG_DSPARK_SEQ_HEAD_LAUNCH")
    if num_splits is None:
        if interpret:
            want = 1
        elif mode == "stepwise":
            want = max(1, (2 * sms) // plan.row_blocks)
        else:
            # persistent: the whole grid must be resident (<= SM count) for the spin barrier.
            want = max(1, sms // plan.row_blocks)
    else:
        want = int(num_splits)
        if want < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}.")
    want = min(want, n_tiles)
    plan.tiles_per_split = triton.cdiv(n_tiles, want)
    plan.num_splits = triton.cdiv(n_tiles, plan.tiles_per_split)
    if mode == "auto":
        mode = "persistent" if (plan.num_splits == 1 or not interpret) else "stepwise"
    if mode == "persistent" and plan.num_splits > 1:
        if interpret:
            raise ValueError(
                "launch_mode='persistent' with num_splits > 1 needs a GPU (its spin barrier "
                "would deadlock the sequential Triton interpreter); use launch_mode='stepwise'."
            )
        if plan.num_splits * plan.row_blocks > sms:
            # Not every program could be resident: the barrier could wait forever on
            # one that never starts. The stepwise launch has no barrier.
            _log_once(
                "persistent-does-not-fit",
                logging.WARNING,
                f"a persistent launch of {plan.num_splits} splits x {plan.row_blocks} row "
                f"blocks does not fit the {sms} available SMs; running it stepwise "
                "(gamma + 1 launches, no cross-program barrier). Logged once; later "
                "launches that do not fit run stepwise too.",
            )
            mode = "stepwise"
    plan.mode = mode
    return plan


class KernelLaunch:
    """Everything one ``_seq_head_kernel`` launch sequence needs."""

    def __init__(self, grid, args, meta, step_ranges, outputs):
        self.grid = grid
        # positional kernel args, with None where the per-launch STEP_BEGIN/STEP_END go
        self.args = args
        self.meta = meta
        self.step_ranges = step_ranges
        self.outputs = outputs

    def kernel_args(self, step_begin: int, step_end: int) -> list:
        args = list(self.args)
        i = _ARG_NAMES.index("STEP_BEGIN")
        args[i], args[i + 1] = step_begin, step_end
        return args

    def run(self) -> SeqHeadOutput:
        for step_begin, step_end in self.step_ranges:
            _seq_head_kernel[self.grid](*self.kernel_args(step_begin, step_end), **self.meta)
        return self.outputs


_ARG_NAMES = [
    "BASE", "s_base_b", "s_base_k", "ANCHOR", "W1", "s_w1", "W2", "s_w2", "TEMPS", "OFFSET",
    "SEED", "LOGITS_OUT", "s_lo_b", "s_lo_k", "HIDDEN", "s_h_b", "s_h_k", "CONF_W", "CONF_B",
    "STS", "s_sts", "TOKENS", "PROBS", "CONF_OUT", "RAW_OUT", "PART_F", "PART_I", "COUNTERS",
    "B", "V", "R", "H", "G", "STEP_BEGIN", "STEP_END", "TILES_PER_SPLIT", "NUM_SPLITS",
]  # fmt: skip


def build_launch(inputs: SeqHeadInputs, plan: LaunchPlan) -> KernelLaunch:
    """Allocate outputs/scratch and assemble the kernel arguments for ``plan``."""
    base = inputs.base_logits
    device = base.device
    batch, gamma = inputs.batch, inputs.gamma
    splits_p2 = triton.next_power_of_2(plan.num_splits)
    rows_pad = plan.row_blocks * plan.block_m

    tokens = torch.empty((batch, gamma), dtype=torch.int64, device=device)
    probs = None
    if inputs.compute_draft_probs:
        probs = (torch.ones if inputs.greedy else torch.empty)(
            (batch, gamma), dtype=torch.float32, device=device
        )
    part_f = torch.empty((rows_pad, gamma, splits_p2, 4), dtype=torch.float32, device=device)
    part_i = torch.empty((rows_pad, gamma, splits_p2, 2), dtype=torch.int32, device=device)
    use_barrier = plan.mode == "persistent" and plan.num_splits > 1
    counters = barrier_counters(device, plan.row_blocks) if use_barrier else part_i

    has_conf = inputs.has_confidence
    confidence = confidence_raw = hidden = sts = None
    hid_round = feat_round = 0
    if has_conf:
        conf_dtype = inputs.conf_weight.dtype
        confidence = torch.empty((batch, gamma), dtype=torch.float32, device=device)
        confidence_raw = torch.empty((batch, gamma), dtype=conf_dtype, device=device)
        hidden = inputs.hidden
        sts = inputs.sts_temperatures
        hid_round = _round_code(hidden.dtype)
        feat_round = _round_code(conf_dtype)
    logits_out = inputs.logits_out
    dummy = part_f

    def pick(tensor, fallback=dummy):
        return fallback if tensor is None else tensor

    args = [
        base, base.stride(0), base.stride(1),
        inputs.anchor_tokens,
        inputs.w1, inputs.w1.stride(0),
        inputs.w2, inputs.w2.stride(0),
        pick(None if inputs.greedy else inputs.temperatures),
        pick(inputs.offset, part_i),
        inputs.seed,
        pick(logits_out),
        0 if logits_out is None else logits_out.stride(0),
        0 if logits_out is None else logits_out.stride(1),
        pick(hidden),
        0 if hidden is None else hidden.stride(0),
        0 if hidden is None else hidden.stride(1),
        pick(inputs.conf_weight if has_conf else None),
        pick(inputs.conf_bias),
        pick(sts),
        0 if sts is None else sts.stride(0),
        tokens,
        pick(probs, tokens),
        pick(confidence),
        pick(confidence_raw),
        part_f,
        part_i,
        counters,
        batch, inputs.vocab, inputs.rank, inputs.hidden_size, gamma,
        None, None,
        plan.tiles_per_split,
        plan.num_splits,
    ]  # fmt: skip
    assert len(args) == len(_ARG_NAMES)
    meta = dict(
        BLOCK_M=plan.block_m,
        BLOCK_V=plan.block_v,
        BLOCK_R=plan.block_r,
        BLOCK_H=plan.block_h,
        SPLITS_P2=splits_p2,
        SPLIT_CHUNK=min(splits_p2, 16),
        W_ROUND=_round_code(inputs.w1.dtype),
        STEP_ROUND=_round_code(inputs.step_dtype),
        HID_ROUND=hid_round,
        FEAT_ROUND=feat_round,
        RAW_ROUND=feat_round,
        DOT_F32=inputs.w1.dtype == torch.float32 or _is_interpreter(),
        SAMPLE=not inputs.greedy,
        PROBS_ON=inputs.compute_draft_probs and not inputs.greedy,
        STORE=logits_out is not None,
        HAS_CONF=has_conf,
        CONF_MARKOV=has_conf and inputs.conf_with_markov,
        HAS_CONF_BIAS=has_conf and inputs.conf_bias is not None,
        PERSISTENT=plan.mode == "persistent",
        USE_BARRIER=use_barrier,
        num_warps=plan.num_warps,
    )
    if plan.mode == "persistent":
        step_ranges = [(0, gamma)]
    else:
        step_ranges = [(j, min(j + 1, gamma)) for j in range(gamma + 1)]
    outputs = SeqHeadOutput(
        tokens=tokens,
        draft_probs=probs,
        confidence=confidence,
        confidence_raw=confidence_raw,
        step_logits=logits_out,
    )
    return KernelLaunch((plan.num_splits, plan.row_blocks), args, meta, step_ranges, outputs)


def run_triton(
    inputs: SeqHeadInputs,
    *,
    launch_mode: str = "auto",
    num_splits: Optional[int] = None,
    block_m: Optional[int] = None,
    block_v: Optional[int] = None,
) -> SeqHeadOutput:
    device = inputs.base_logits.device
    if device.type != "cuda" and not _is_interpreter():
        raise RuntimeError(
            "dspark_kernels triton backend needs CUDA tensors (or TRITON_INTERPRET=1 on CPU); "
            "use backend='torch' for CPU tensors."
        )
    if device.type != "cuda" and not _kernel_is_interpreted():
        raise RuntimeError(
            "dspark_kernels.triton_seq_head was imported before TRITON_INTERPRET=1 was set, so "
            "its kernels were compiled for a GPU; set TRITON_INTERPRET=1 before the first import."
        )
    plan = plan_launch(
        batch=inputs.batch,
        vocab=inputs.vocab,
        rank=inputs.rank,
        device=device,
        launch_mode=launch_mode,
        num_splits=num_splits,
        block_m=block_m,
        block_v=block_v,
    )
    return build_launch(inputs, plan).run()


assert list(_seq_head_kernel.arg_names[: len(_ARG_NAMES)]) == _ARG_NAMES, "kernel signature drifted"
