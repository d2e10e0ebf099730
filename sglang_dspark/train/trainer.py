"""Train a DSpark (or DFlash-mode) drafter against a frozen HF target, online."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .data import Sequence, pad_batch, sample_anchors
from .loss import LossWeights, block_targets, dspark_loss
from .model import DraftArch, DSparkDraft, arch_to_json
from .target import Target


@dataclass(frozen=True)
class DraftTrainConfig:
    mode: str = "dspark"                 # "dspark" | "dflash"
    block_size: int = 8                  # gamma: draft tokens per block (anchor row included)
    target_layer_ids: tuple[int, ...] | None = None   # default: spread over the target
    num_layers: int = 1
    intermediate_size: int | None = None  # default: the target's
    markov_rank: int = 256
    steps: int = 300
    batch_size: int = 8
    anchors_per_seq: int = 32            # DeepSpec samples up to 512 per sequence
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "cpu"
    log_every: int = 25
    cache_target: bool = False           # keep target features in memory across epochs
    weights: LossWeights | None = None   # default: LossWeights.for_mode(mode)

    def validate(self) -> None:
        if self.mode not in ("dspark", "dflash"):
            raise ValueError(f"mode must be 'dspark' or 'dflash', got {self.mode!r}.")
        for name in ("block_size", "num_layers", "steps", "batch_size", "anchors_per_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if not self.lr > 0:
            raise ValueError("lr must be > 0.")

    def loss_weights(self) -> LossWeights:
        return self.weights or LossWeights.for_mode(self.mode)


def default_layer_ids(num_target_layers: int, k: int = 2) -> tuple[int, ...]:
    """k ids spread over [0, L-2] (SGLang cannot capture the last layer)."""
    hi = num_target_layers - 2
    if hi < 0:
        raise ValueError("the target needs at least 2 layers.")
    if k == 1 or hi == 0:
        return (hi,)
    ids = sorted({round(i * hi / (k - 1)) for i in range(k)})
    return tuple(ids)


def build_draft(target: Target, cfg: DraftTrainConfig) -> DSparkDraft:
    tc = target.config
    H = int(tc["hidden_size"])
    nh = int(tc["num_attention_heads"])
    layer_ids = cfg.target_layer_ids or default_layer_ids(target.num_layers)
    tok = target.tokenizer
    mask_id = tok.convert_tokens_to_ids("<|mask|>") if "<|mask|>" in tok.get_vocab() else None
    if mask_id is None:
        mask_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    arch = DraftArch(
        vocab_size=int(tc["vocab_size"]), hidden_size=H,
        intermediate_size=int(cfg.intermediate_size or tc["intermediate_size"]),
        num_layers=cfg.num_layers, num_heads=nh,
        num_kv_heads=int(tc.get("num_key_value_heads", nh)),
        head_dim=int(tc.get("head_dim") or H // nh), target_layer_ids=tuple(layer_ids),
        num_target_layers=target.num_layers, block_size=cfg.block_size,
        mask_token_id=int(mask_id), markov_rank=cfg.markov_rank, mode=cfg.mode,
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-6)),
        rope_theta=float(tc.get("rope_theta", 10000.0)),
        max_position_embeddings=int(tc.get("max_position_embeddings", 4096)))
    draft = DSparkDraft(arch, target.embed.float(), target.lm_head.float())
    draft.init_weights(cfg.seed)
    return draft.to(cfg.device)


@dataclass
class TrainResult:
    out_dir: Path
    history: list[dict] = field(default_factory=list)
    wall_s: float = 0.0


def train_draft(target: Target, seqs: list[Sequence], cfg: DraftTrainConfig, out_dir: Path,
                log=print) -> TrainResult:
    cfg.validate()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    draft = build_draft(target, cfg)
    w = cfg.loss_weights()
    w.validate()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.95))

    def lr_at(step):
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    pad = target.tokenizer.pad_token_id or 0
    layer_ids = draft.arch.target_layer_ids
    cache: dict[tuple[int, ...], tuple] = {}
    t0 = time.time()
    res = TrainResult(Path(out_dir))
    n = len(seqs)
    order = torch.randperm(n, generator=gen).tolist()
    cursor = 0
    draft.train()
    for step in range(cfg.steps):
        idx = []
        for _ in range(min(cfg.batch_size, n)):
            if cursor >= n:
                order, cursor = torch.randperm(n, generator=gen).tolist(), 0
            idx.append(order[cursor])
            cursor += 1
        key = tuple(idx)
        tokens, lmask = pad_batch([seqs[i] for i in idx], pad)
        if cfg.cache_target and key in cache:
            feats, tlogits = cache[key]
        else:
            tb = target.run(tokens, layer_ids)
            feats, tlogits = tb.feats.to(cfg.device), tb.logits.to(cfg.device)
            if cfg.cache_target:
                cache[key] = (feats, tlogits)
        tokens, lmask = tokens.to(cfg.device), lmask.to(cfg.device)
        anchors, ok = sample_anchors(lmask.cpu(), cfg.anchors_per_seq, gen)
        anchors, ok = anchors.to(cfg.device), ok.to(cfg.device)
        G = draft.arch.block_size
        labels, tpos, mask = block_targets(tokens, lmask, anchors, ok, G)
        B = tokens.shape[0]
        t_logits = torch.gather(tlogits, 1, tpos.reshape(B, -1, 1).expand(-1, -1, tlogits.shape[-1])
                                ).view(*tpos.shape, -1)
        out = draft(feats, tokens, anchors)
        losses = dspark_loss(out.logits, out.conf_logits, labels, t_logits, mask, w)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        rec = {k: round(float(v), 5) for k, v in losses.items()}
        rec["step"] = step
        res.history.append(rec)
        if log and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            log(f"[{cfg.mode}] step {step:4d} " + " ".join(
                f"{k}={v:.4f}" for k, v in rec.items() if k != "step")
                + f" ({time.time() - t0:.0f}s)")
    res.wall_s = time.time() - t0
    draft.eval()
    extra = {"train_config": _cfg_json(cfg), "loss_weights": asdict(w),
             "arch": arch_to_json(draft.arch), "final": res.history[-1] if res.history else None,
             "target": str(target.path)}
    draft.save(out_dir, extra)
    (Path(out_dir) / "train_history.json").write_text(json.dumps(res.history) + "\n")
    return res


def _cfg_json(cfg: DraftTrainConfig) -> dict:
    d = asdict(cfg)
    d["target_layer_ids"] = list(cfg.target_layer_ids) if cfg.target_layer_ids else None
    return d
