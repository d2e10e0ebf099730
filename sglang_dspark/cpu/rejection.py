"""Chain speculative (rejection) sampling in torch, for CPU tensors.

SGLang's DSpark accept path calls the Triton kernel behind
``chain_speculative_sampling_triton`` even when its inputs live on the CPU.  This
module implements the same contract in torch, so temperature > 0 works on CPU:

Inputs (chain layout: ``candidates[b, 0]`` is the anchor, ``candidates[b, s]`` the
s-th draft token; ``target_probs`` has ``num_slots`` rows per request,
``draft_probs`` ``num_slots - 1``; ``retrive_index[b, s]`` is the flat row index).

Classic mode: token s is accepted iff ``u[s-1] * q(x_s) < p(x_s)`` with ``q`` a
valid probability (0 < q <= 1); the first rejection stops.  Block mode
(``block_verification=True``, Sun et al. 2024, Algorithm 2): prefix ratios
``h_s = min(h_{s-1} p/q, 1)``, longest-first acceptance with the residual-mass
correction.  Then one final token is drawn by inverse CDF with
``uniform_samples_for_final_sampling``: from ``p`` if every draft was accepted,
else from ``max(scale * p - q, 0)`` normalised (``scale`` = 1, or the accepted
prefix ratio in block mode).  Non-probabilities in ``q`` count as 0.

Outputs are written in place exactly where the kernel writes them: ``predicts``
(accepted tokens and the final token at the accepted rows' flat indices),
``accept_index`` and ``accept_token_num``.
"""

from __future__ import annotations

import torch


def _valid_q(q: torch.Tensor) -> torch.Tensor:
    return torch.where((q >= 0.0) & (q <= 1.0), q, torch.zeros_like(q))


def _inverse_cdf(weights: torch.Tensor, coin: float, total: float | None = None) -> int:
    """First index whose running sum exceeds coin * total (vocab-1 if none)."""
    w = weights.double()
    norm = float(w.sum()) if total is None else float(total)
    csum = torch.cumsum(w, 0)
    hit = torch.nonzero(csum > coin * norm)
    return int(hit[0]) if hit.numel() else int(w.numel() - 1)


def chain_speculative_sampling_torch(
    predicts, accept_index, accept_token_num, candidates, retrive_index,
    retrive_next_token, retrive_next_sibling, uniform_samples,
    uniform_samples_for_final_sampling, target_probs, draft_probs,
    threshold_single, threshold_acc, deterministic, *, block_verification: bool = False,
):
    bs, num_slots = candidates.shape
    tp = target_probs.float()
    dp = draft_probs.float()
    cand = candidates.tolist()
    ridx = retrive_index.tolist()
    coins = uniform_samples.float().tolist()
    finals = uniform_samples_for_final_sampling.float().tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        num_accept = 0
        scale = 1.0
        norm_sum = -1.0
        if block_verification:
            prefix, probs = 1.0, []
            for s in range(1, num_slots):
                tok = cand[b][s]
                p = float(tp[b, s - 1, tok])
                q = float(dp[b, s - 1, tok])
                prefix = min(prefix * p / q, 1.0) if 0.0 < q <= 1.0 else 0.0
                probs.append(prefix)
            for s in range(num_slots - 1, 0, -1):
                h = probs[s - 1]
                coin = coins[b][s - 1]
                if coin >= h:
                    continue
                accept_prob, mass = h, -1.0
                if s < num_slots - 1 and 0.0 < h < 1.0:
                    mass = float(torch.clamp(h * tp[b, s] - dp[b, s], min=0.0).sum())
                    accept_prob = mass / (mass + 1.0 - h)
                if coin < accept_prob:
                    num_accept, scale, norm_sum = s, h, mass
                    break
            for s in range(1, num_accept + 1):
                predicts[last] = cand[b][s]
                last = ridx[b][s]
                accept_index[b, s] = last
        else:
            for s in range(1, num_slots):
                tok = cand[b][s]
                p = float(tp[b, s - 1, tok])
                q = float(dp[b, s - 1, tok])
                if 0.0 < q <= 1.0 and coins[b][s - 1] * q < p:
                    num_accept += 1
                    predicts[last] = tok
                    last = ridx[b][s]
                    accept_index[b, num_accept] = last
                else:
                    break
        accept_token_num[b] = num_accept
        row = num_accept
        if num_accept == num_slots - 1:
            weights = tp[b, row]
        else:
            weights = torch.clamp(scale * tp[b, row] - _valid_q(dp[b, row]), min=0.0)
        total = None if norm_sum < 0.0 else norm_sum
        predicts[last] = _inverse_cdf(weights, finals[b], total)
