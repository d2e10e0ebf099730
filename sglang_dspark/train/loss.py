"""The DSpark training loss (paper + DeepSpec defaults) and its DFlash-mode ablation.

Per block position k = 1..gamma (0-based index i = k-1), with draft distribution
``p_d`` (softmax of base + Markov logits, teacher forced) and target distribution
``p_t`` (the target's own next-token distribution at the same position):

* CE  = -sum_v p_t(v) log p_d(v)     (default; or -log p_d(data token), ce_label="data")
* TV  = 0.5 * || p_d - p_t ||_1
* BCE = BCE(sigmoid(conf_k), c*_k),  c*_k = 1 - TV_k (= 1 - ||p_d - p_t||_1 / 2), detached
  (conf_label="tv", the paper's: the probability that rejection sampling at T = 1 accepts
  a draft token), or c*_k = 1[argmax p_d = argmax p_t] (conf_label="greedy": what greedy
  verification accepts; ours, for servers that run at temperature 0)

Each term is weighted by ``exp(-(k-1)/decay)`` and restricted to the block's
contiguous valid prefix (a position is valid when its label exists and lies in the
trainable region; everything after the first invalid position is masked too).
Totals are the weighted sums divided by the summed weights of valid positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossWeights:
    ce: float = 0.1
    tv: float = 0.9
    conf: float = 1.0
    decay: float = 4.0      # position weight exp(-(k-1)/decay)
    # CE label: "target" = soft CE against p_t (the expectation of CE on data the target
    # regenerated, which is how DeepSpec builds its training set); "data" = corpus token.
    ce_label: str = "target"
    # confidence label: "tv" = 1 - TV (paper); "greedy" = draft argmax equals target argmax
    conf_label: str = "tv"

    @staticmethod
    def for_mode(mode: str) -> "LossWeights":
        # DFlash baseline = same backbone, CE only.
        return LossWeights() if mode == "dspark" else LossWeights(ce=1.0, tv=0.0, conf=0.0)

    def validate(self) -> None:
        if self.ce_label not in ("target", "data"):
            raise ValueError(f"ce_label must be 'target' or 'data', got {self.ce_label!r}.")
        if self.conf_label not in ("tv", "greedy"):
            raise ValueError(f"conf_label must be 'tv' or 'greedy', got {self.conf_label!r}.")
        if min(self.ce, self.tv, self.conf) < 0 or self.ce + self.tv == 0:
            raise ValueError("loss weights must be >= 0 and CE + TV must be > 0.")
        if not self.decay > 0:
            raise ValueError("decay must be > 0.")


def prefix_mask(valid: torch.Tensor) -> torch.Tensor:
    """[..., G] bool -> keep only the contiguous valid prefix of each block."""
    return torch.cumprod(valid.long(), dim=-1).bool()


def position_weights(G: int, decay: float, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(G, device=device, dtype=torch.float32) / decay)


def block_targets(tokens: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                  anchor_ok: torch.Tensor, G: int):
    """Labels and validity for blocks at ``anchors``.

    Block row i of anchor p predicts token p+i+1.  Returns (labels [B,A,G],
    label_pos [B,A,G] (= p+i, the target row whose distribution is p_t),
    mask [B,A,G] contiguous-prefix validity)."""
    B, T = tokens.shape
    pos = anchors[:, :, None] + torch.arange(G, device=tokens.device)   # p + i
    lab_pos = pos + 1
    in_range = lab_pos < T
    lp = lab_pos.clamp(max=T - 1)
    labels = torch.gather(tokens, 1, lp.reshape(B, -1)).view(lp.shape)
    trainable = torch.gather(loss_mask, 1, lp.reshape(B, -1)).view(lp.shape).bool()
    valid = in_range & trainable & anchor_ok[:, :, None]
    return labels, pos.clamp(max=T - 1), prefix_mask(valid)


def dspark_loss(logits: torch.Tensor, conf_logits: torch.Tensor | None, labels: torch.Tensor,
                target_logits: torch.Tensor, mask: torch.Tensor, w: LossWeights) -> dict:
    """logits [B,A,G,V] draft (with Markov bias); target_logits [B,A,G,V]; mask [B,A,G]."""
    G = logits.shape[2]
    pw = position_weights(G, w.decay, logits.device)[None, None, :] * mask.float()
    denom = pw.sum().clamp(min=1e-6)
    logp_d = F.log_softmax(logits.float(), dim=-1)
    if w.ce_label == "target":
        ce = -(F.softmax(target_logits.float(), dim=-1) * logp_d).sum(-1)
    else:
        ce = -torch.gather(logp_d, -1, labels[..., None]).squeeze(-1)
    out = {"ce": (ce * pw).sum() / denom}
    agree = (logits.argmax(-1) == target_logits.argmax(-1)).float()    # greedy acceptance event
    total = w.ce * out["ce"]
    need_tv = w.tv > 0 or (w.conf > 0 and conf_logits is not None)
    if need_tv:
        p_d = logp_d.exp()
        p_t = F.softmax(target_logits.float(), dim=-1)
        tv = 0.5 * (p_d - p_t).abs().sum(-1)
        out["tv"] = (tv * pw).sum() / denom
        if w.tv > 0:
            total = total + w.tv * out["tv"]
        if w.conf > 0 and conf_logits is not None:
            if w.conf_label == "greedy":
                c_star = agree
            else:
                c_star = (1.0 - tv).detach().clamp(0.0, 1.0)
            bce = F.binary_cross_entropy_with_logits(conf_logits.float(), c_star, reduction="none")
            out["conf"] = (bce * pw).sum() / denom
            total = total + w.conf * out["conf"]
    out["top1_agree"] = (agree * mask).sum() / mask.float().sum().clamp(min=1)
    out["loss"] = total
    return out
