"""Training-side DSpark / DFlash drafter: the math SGLang 0.5.23's ``Qwen3DSparkModel`` serves.

Re-implemented from reading SGLang's draft model (``srt/models/dflash.py``,
``srt/models/dspark.py``) and worker (``dspark_components/dspark_draft.py``); no code
is copied.  What a serving step computes, and this module reproduces:

* context features: ``ctx = hidden_norm(fc(concat(target hidden states of
  target_layer_ids)))`` for every committed position *before* the anchor.  SGLang
  injects ``ctx`` straight into each draft layer's K/V (``kv_proj_only`` ->
  per-head ``k_norm`` -> RoPE at the context position; no ``input_layernorm``).
* the block: ``gamma`` query rows ``[anchor, mask, ..., mask]`` at positions
  ``p .. p+gamma-1`` (``sample_from_anchor``: the anchor row is the first prediction
  position), embedded with the target's (frozen) embedding.
* each draft layer is a pre-norm Qwen3 block (q/k per-head RMSNorm, neox RoPE, GQA,
  SiLU MLP); attention is non-causal (``ENCODER_ONLY``): every block row sees the
  whole context and every row of its own block.
* ``h = norm(x)``, base logits ``U = h @ lm_head^T`` (target LM head, frozen).
* vanilla Markov head: ``logits_k = U_k + W2 @ W1[x_{k-1}]`` with ``x_0`` = anchor.
* confidence head: ``c_k = sigmoid(proj([h_k ; W1[x_{k-1}]]))``.

DFlash mode (ablation) is the same backbone with no Markov and no confidence head.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("dspark", "dflash")


@dataclass(frozen=True)
class DraftArch:
    """Shape of a draft; hidden size / heads / vocab follow the target."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    block_size: int
    mask_token_id: int
    markov_rank: int = 256
    mode: str = "dspark"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}.")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads.")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers - 1]
        if bad or not self.target_layer_ids:
            raise ValueError(
                f"target_layer_ids {list(self.target_layer_ids)} must be non-empty and each in "
                f"[0, {self.num_target_layers - 2}]: SGLang captures a target layer's output "
                "before the next layer, so the last layer cannot be used.")
        if self.mode == "dspark" and self.markov_rank < 1:
            raise ValueError("markov_rank must be >= 1 in dspark mode.")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside vocab {self.vocab_size}.")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding on the last dim; x [..., n, heads, d], positions [..., n]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float()[..., None] * inv                      # [..., n, d/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]   # [..., n, 1, d/2]
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, a: DraftArch):
        super().__init__()
        self.a = a
        H, nh, nkv, d = a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim
        self.q_proj = nn.Linear(H, nh * d, bias=False)
        self.k_proj = nn.Linear(H, nkv * d, bias=False)
        self.v_proj = nn.Linear(H, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, H, bias=False)
        self.q_norm = RMSNorm(d, a.rms_norm_eps)
        self.k_norm = RMSNorm(d, a.rms_norm_eps)

    def kv(self, x, positions):
        """K (normed, roped) and V for rows x [B, n, H] at positions [B, n]."""
        a = self.a
        B, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, n, a.num_kv_heads, a.head_dim))
        k = rope(k, positions, a.rope_theta)
        v = self.v_proj(x).view(B, n, a.num_kv_heads, a.head_dim)
        return k, v

    def forward(self, x, positions, ctx, ctx_positions, mask):
        """x [B, n, H] block rows; ctx [B, T, H] projected context; mask [B, n, T+n] bool."""
        a = self.a
        B, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, n, a.num_heads, a.head_dim))
        q = rope(q, positions, a.rope_theta)
        k, v = self.kv(x, positions)
        ck, cv = self.kv(ctx, ctx_positions)
        k = torch.cat([ck, k], dim=1)
        v = torch.cat([cv, v], dim=1)
        rep = a.num_heads // a.num_kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=mask[:, None], scale=a.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(B, n, a.num_heads * a.head_dim))


class MLP(nn.Module):
    def __init__(self, a: DraftArch):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.up_proj = nn.Linear(a.hidden_size, a.intermediate_size, bias=False)
        self.down_proj = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, a: DraftArch):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)

    def forward(self, x, positions, ctx, ctx_positions, mask):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx, ctx_positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    def __init__(self, vocab: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)

    def forward(self, prev_tokens):
        return self.markov_w2(self.markov_w1(prev_tokens))


class ConfidenceHead(nn.Module):
    def __init__(self, in_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_dim, 1, bias=True)

    def forward(self, feats):
        return self.proj(feats).squeeze(-1)


@dataclass
class DraftOutput:
    hidden: torch.Tensor                 # [B, A, G, H] final-normed draft hidden
    base_logits: torch.Tensor            # [B, A, G, V]
    logits: torch.Tensor                 # base + Markov bias (teacher forced) [B, A, G, V]
    conf_logits: torch.Tensor | None     # [B, A, G]
    prev_tokens: torch.Tensor            # [B, A, G] Markov inputs x_{k-1}
    extra: dict = field(default_factory=dict)


class DSparkDraft(nn.Module):
    """Parameter names equal the checkpoint names SGLang's loader reads."""

    def __init__(self, arch: DraftArch, embed: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        arch.validate()
        self.arch = arch
        H, K = arch.hidden_size, len(arch.target_layer_ids)
        self.fc = nn.Linear(K * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, arch.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(arch) for _ in range(arch.num_layers)])
        self.norm = RMSNorm(H, arch.rms_norm_eps)
        if arch.mode == "dspark":
            self.markov_head = MarkovHead(arch.vocab_size, arch.markov_rank)
            self.confidence_head = ConfidenceHead(H + arch.markov_rank)
        else:
            self.markov_head = None
            self.confidence_head = None
        # frozen, shared with the target; buffers are not saved in the draft checkpoint
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)

    def init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name == "markov_head.markov_w1.weight":
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
                elif name == "markov_head.markov_w2.weight" or name.startswith("confidence_head"):
                    p.zero_()  # start as a pure parallel drafter; confidence 0.5
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    # ---------------------------------------------------------------- forward
    def backbone(self, target_feats, tokens, anchors, anchor_ok=None):
        """Parallel backbone for A anchors per sequence.

        target_feats [B, T, K*H]; tokens [B, T]; anchors [B, A] (anchor positions p);
        returns final-normed hidden [B, A, G, H].  Block a sees context < p_a only.
        """
        a = self.arch
        B, T = tokens.shape
        A, G = anchors.shape[1], a.block_size
        dev = tokens.device
        ctx = self.hidden_norm(self.fc(target_feats.to(self.fc.weight.dtype)))
        ctx_pos = torch.arange(T, device=dev).expand(B, T)
        offs = torch.arange(G, device=dev)
        pos = anchors[:, :, None] + offs                                   # [B, A, G]
        ids = torch.full((B, A, G), a.mask_token_id, dtype=torch.long, device=dev)
        ids[:, :, 0] = torch.gather(tokens, 1, anchors)
        x = self.embed[ids].to(self.fc.weight.dtype).reshape(B, A * G, -1)
        pos = pos.reshape(B, A * G)
        # mask: context key t visible iff t < p_a; block keys visible iff same block
        ctx_vis = torch.arange(T, device=dev)[None, None, :] < anchors[:, :, None]   # [B,A,T]
        ctx_vis = ctx_vis[:, :, None, :].expand(B, A, G, T).reshape(B, A * G, T)
        blk = torch.arange(A, device=dev).repeat_interleave(G)
        blk_vis = (blk[:, None] == blk[None, :]).expand(B, A * G, A * G)
        mask = torch.cat([ctx_vis, blk_vis], dim=-1)
        for layer in self.layers:
            x = layer(x, pos, ctx, ctx_pos, mask)
        return self.norm(x).view(B, A, G, -1)

    def forward(self, target_feats, tokens, anchors, detach_conf_inputs: bool = True):
        """Teacher-forced training forward: Markov input x_{k-1} = tokens[p + k]."""
        a = self.arch
        B, T = tokens.shape
        h = self.backbone(target_feats, tokens, anchors)
        base = h @ self.lm_head.to(h.dtype).T
        G = a.block_size
        idx = (anchors[:, :, None] + torch.arange(G, device=tokens.device)).clamp(max=T - 1)
        prev = torch.gather(tokens, 1, idx.reshape(B, -1)).view(idx.shape)
        if self.markov_head is None:
            return DraftOutput(h, base, base, None, prev)
        lat = self.markov_head.markov_w1(prev)
        logits = base + self.markov_head.markov_w2(lat)
        feats = torch.cat([h, lat], dim=-1)
        if detach_conf_inputs:
            feats = feats.detach()
        conf = self.confidence_head(feats)
        return DraftOutput(h, base, logits, conf, prev)

    @torch.no_grad()
    def draft_greedy(self, target_feats, tokens, anchors):
        """What SGLang drafts at temperature 0: step k picks argmax(U_k + B(x_{k-1})),
        x_0 = anchor, x_{k-1} = the token drafted at the previous step.

        Returns (draft tokens [B, A, G], confidences [B, A, G] or None)."""
        h = self.backbone(target_feats, tokens, anchors)
        base = h @ self.lm_head.to(h.dtype).T
        G = self.arch.block_size
        prev = torch.gather(tokens, 1, anchors)
        out, prevs = [], []
        for k in range(G):
            step = base[:, :, k]
            if self.markov_head is not None:
                step = step + self.markov_head(prev)
            prevs.append(prev)
            prev = step.argmax(-1)
            out.append(prev)
        drafts = torch.stack(out, dim=2)
        conf = None
        if self.confidence_head is not None:
            lat = self.markov_head.markov_w1(torch.stack(prevs, dim=2))
            conf = torch.sigmoid(self.confidence_head(torch.cat([h, lat], dim=-1)).float())
        return drafts, conf

    # ------------------------------------------------------------- checkpoint
    def sglang_config(self, extra: dict | None = None) -> dict:
        a = self.arch
        dspark = a.mode == "dspark"
        cfg = {
            "architectures": ["Qwen3DSparkModel"] if dspark else ["DFlashDraftModel"],
            "model_type": "qwen3",
            "vocab_size": a.vocab_size, "hidden_size": a.hidden_size,
            "intermediate_size": a.intermediate_size, "num_hidden_layers": a.num_layers,
            "num_attention_heads": a.num_heads, "num_key_value_heads": a.num_kv_heads,
            "head_dim": a.head_dim, "hidden_act": "silu",
            "max_position_embeddings": a.max_position_embeddings,
            "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta, "rope_scaling": None,
            "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32",
            "block_size": a.block_size, "num_target_layers": a.num_target_layers,
            "dflash_config": {"target_layer_ids": list(a.target_layer_ids),
                              "mask_token_id": a.mask_token_id, "block_size": a.block_size},
            "mask_token_id": a.mask_token_id, "target_layer_ids": list(a.target_layer_ids),
            "sample_from_anchor": True,
        }
        if dspark:
            cfg.update({"markov_rank": a.markov_rank, "markov_head_type": "vanilla",
                        "enable_confidence_head": True, "confidence_head_with_markov": True})
        cfg["dspark_train"] = {"mode": a.mode, **(extra or {})}
        return cfg

    def save(self, out_dir: Path, extra: dict | None = None) -> Path:
        from safetensors.torch import save_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(dict(sorted(state.items())), str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(self.sglang_config(extra), indent=2) + "\n")
        return out_dir


def export_dflash_as_neutral_dspark(dflash_dir: Path, out_dir: Path, markov_rank: int = 1) -> Path:
    """Serve a DFlash-mode draft with SGLang's DSPARK algorithm at the same block size.

    SGLang's DSPARK model insists on a Markov head (``markov_rank > 0``).  With
    ``W1 = W2 = 0`` the bias is exactly zero, so ``logits_k = U_k``: DFlash's math.
    ``enable_confidence_head`` is false, so this must run in static verify mode
    (SGLang builds no confidence head there).
    """
    from safetensors.torch import load_file, save_file

    dflash_dir, out_dir = Path(dflash_dir), Path(out_dir)
    cfg = json.loads((dflash_dir / "config.json").read_text())
    state = load_file(str(dflash_dir / "model.safetensors"))
    if any(k.startswith(("markov_head.", "confidence_head.")) for k in state):
        raise ValueError(f"{dflash_dir} is not a DFlash-mode draft (it has Markov/confidence tensors).")
    V = int(cfg["vocab_size"])
    state["markov_head.markov_w1.weight"] = torch.zeros(V, markov_rank)
    state["markov_head.markov_w2.weight"] = torch.zeros(V, markov_rank)
    cfg.update({"architectures": ["Qwen3DSparkModel"], "markov_rank": markov_rank,
                "markov_head_type": "vanilla", "enable_confidence_head": False,
                "confidence_head_with_markov": False})
    cfg.setdefault("dspark_train", {})["served_as"] = "dspark-neutral-markov"
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(state.items())), str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out_dir


def load_draft(draft_dir: Path, embed: torch.Tensor, lm_head: torch.Tensor) -> DSparkDraft:
    """Load a checkpoint written by :meth:`DSparkDraft.save` (or a neutral export)."""
    from safetensors.torch import load_file

    draft_dir = Path(draft_dir)
    cfg = json.loads((draft_dir / "config.json").read_text())
    state = load_file(str(draft_dir / "model.safetensors"))
    has_conf = any(k.startswith("confidence_head.") for k in state)
    mode = "dspark" if has_conf else "dflash"
    arch = DraftArch(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"], num_kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"], target_layer_ids=tuple(cfg["target_layer_ids"]),
        num_target_layers=cfg["num_target_layers"], block_size=cfg["block_size"],
        mask_token_id=cfg["mask_token_id"], markov_rank=cfg.get("markov_rank", 0) or 0,
        mode=mode, rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", 10000.0),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096))
    model = DSparkDraft(arch, embed, lm_head)
    state = {k: v for k, v in state.items() if not (mode == "dflash" and k.startswith("markov_head."))}
    model.load_state_dict(state, strict=True)
    return model


def arch_to_json(arch: DraftArch) -> dict:
    d = asdict(arch)
    d["target_layer_ids"] = list(arch.target_layer_ids)
    return d
