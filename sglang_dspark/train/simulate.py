"""Greedy speculative decoding simulated with the HF target and the training-side draft.

Mirrors one SGLang DSPARK decode loop at temperature 0: prefill yields the first
token (the first anchor); each round drafts ``gamma`` tokens from the anchor with
context = target hidden states of every position before the anchor, the target
verifies them, the longest matching prefix is accepted and the target adds one
token.  Used for the agreement test against SGLang (same output ids, same number of
verify rounds per request) and as a cheap offline tau estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import DSparkDraft
from .target import Target


@dataclass
class SimResult:
    output_ids: list[int]
    verify_ct: int
    accept_lens: list[int]       # accepted drafts per round (bonus excluded)
    first_blocks: list[list[int]]  # draft tokens of each round (for debugging)


@torch.no_grad()
def simulate_greedy(target: Target, draft: DSparkDraft, prompt: list[int],
                    max_new_tokens: int) -> SimResult:
    G = draft.arch.block_size
    layer_ids = draft.arch.target_layer_ids
    seq = list(prompt)
    tb = target.run(torch.tensor([seq]), layer_ids)
    seq.append(int(tb.logits[0, -1].argmax()))
    out = [seq[-1]]
    verify_ct, acc, blocks = 0, [], []
    while len(out) < max_new_tokens:
        p = len(seq) - 1
        tokens = torch.tensor([seq])
        drafts, _ = draft.draft_greedy(tb.feats[:, :len(seq)] if tb.feats.shape[1] >= len(seq)
                                       else _pad_feats(tb.feats, len(seq)),
                                       tokens, torch.tensor([[p]]))
        d = drafts[0, 0].tolist()
        blocks.append(d)
        tb = target.run(torch.tensor([seq + d]), layer_ids)
        greedy = tb.logits[0, p:p + G + 1].argmax(-1).tolist()
        n = 0
        while n < G and d[n] == greedy[n]:
            n += 1
        new = d[:n] + [greedy[n]]
        verify_ct += 1
        acc.append(n)
        new = new[: max_new_tokens - len(out)]
        seq += new
        out += new
        # features of the accepted tokens come from the verify pass (positions < new anchor)
        tb = type(tb)(feats=tb.feats[:, :len(seq)], logits=tb.logits[:, :len(seq)])
    return SimResult(out, verify_ct, acc, blocks)


def _pad_feats(feats, n):
    pad = feats.new_zeros(feats.shape[0], n - feats.shape[1], feats.shape[2])
    return torch.cat([feats, pad], dim=1)


def simulated_tau(results: list[SimResult]) -> float:
    tok = sum(len(r.output_ids) for r in results)
    ver = sum(r.verify_ct for r in results)
    return tok / ver if ver else float("nan")
