"""Build a tiny Qwen3 target and a tiny DSpark draft locally, deterministically.

No hub, no downloads: the tokenizer is a byte-level BPE trained on a few files of
the running Python's standard library, and the weights are constructed from a seed.

The pair has *structure*, so speculation is meaningful on a CPU:

* The target is a real 4-layer Qwen3 (attention, MLP, RMSNorm, RoPE) whose residual
  stream is dominated by the token embedding, so its next-token distribution is
  mostly a bigram table ``next(x)`` encoded as ``lm_head @ norm(embed[x])``.  The
  attention/MLP blocks add a small context-dependent perturbation (``--context-mix``).
  ``--sharpness`` sets how peaked the distribution is (large: greedy margins far
  above bf16 rounding; small: a real distribution for temperature-1 tests).
* The draft is a DeepSpec/SGLang-format ``Qwen3DSparkModel``.  Its final norm is
  zero, so the parallel backbone contributes no logits and the Markov head
  ``W1[x_{k-1}] @ W2`` carries the bigram table, except that for a
  ``--draft-error-rate`` fraction of previous tokens it points at a wrong token.
  One extra Markov dimension flags those rows and the confidence head reads it, so
  confidences are informative (about ``--confidence-hi`` / ``--confidence-lo``).

Constraints (checked, with clear errors): ``target_layer_ids`` must be below
``num_target_layers - 1`` (SGLang's Qwen3 captures hidden states "before layer
k+1", so the last layer yields nothing); draft and target share ``hidden_size`` and
vocabulary; ``markov_rank`` >= 2.

CLI: ``python -m sglang_dspark.tiny_models --out DIR [--seed 0] ...`` writes
``DIR/target`` and ``DIR/draft``.  Re-running with the same arguments yields
byte-identical safetensors.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

BUILDER_VERSION = 2  # bump when the construction changes, so cached pairs are rebuilt
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Standard-library files that exist in every CPython >= 3.11.
_CORPUS_FILES = ("textwrap.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py",
                 "colorsys.py", "shlex.py", "calendar.py", "difflib.py", "glob.py")


@dataclass(frozen=True)
class TinySpec:
    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_target_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    num_draft_layers: int = 1
    target_layer_ids: tuple[int, ...] = (1, 2)
    block_size: int = 4
    markov_rank: int = 64
    sharpness: float = 3.0
    context_mix: float = 0.02
    eos_rate: float = 0.01
    draft_error_rate: float = 0.25
    confidence_hi: float = 0.92
    confidence_lo: float = 0.08
    dtype: str = "float32"

    def validate(self) -> None:
        if self.num_target_layers < 3:
            raise ValueError("num_target_layers must be >= 3 so target layers can be captured.")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers - 1]
        if bad or not self.target_layer_ids:
            raise ValueError(
                f"target_layer_ids {list(self.target_layer_ids)} must be non-empty and each "
                f"below num_target_layers - 1 = {self.num_target_layers - 1}: SGLang's Qwen3 "
                "captures hidden states before layer k+1, so the last layer yields nothing."
            )
        if self.markov_rank < 2:
            raise ValueError("markov_rank must be >= 2 (one dimension carries the confidence flag).")
        if self.num_heads * self.head_dim <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads.")
        if not 0.0 <= self.draft_error_rate <= 1.0:
            raise ValueError("draft_error_rate must be within [0, 1].")
        if not 0.0 < self.confidence_lo < self.confidence_hi < 1.0:
            raise ValueError("need 0 < confidence_lo < confidence_hi < 1.")
        if self.block_size < 1 or self.block_size > 16:
            raise ValueError("block_size (gamma) must be within 1..16.")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError("dtype must be float32 or bfloat16.")


PRESETS = {
    "tiny": TinySpec(),
    # hidden 768: big enough that step time grows with verify tokens even on a CPU
    "bench": TinySpec(hidden_size=768, intermediate_size=3072, num_heads=12, num_kv_heads=4,
                      head_dim=64),
    # bench's layers, 12 of them: a larger target for the no-draft benchmark (issue 21); on
    # this CPU a 5-token verify at one request still costs about 1.4x a 1-token decode
    "deep": TinySpec(hidden_size=768, intermediate_size=3072, num_heads=12, num_kv_heads=4,
                     head_dim=64, num_target_layers=12),
    # deep's target with a weaker drafter (half its Markov rows wrong): verifying every
    # draft makes 2.0 tokens per step, 1.14x plain decoding at one request and 0.88x at 32
    # on a 2-core CPU (2026-12-05), both regimes of the no-draft benchmark
    "deep-weak": TinySpec(hidden_size=768, intermediate_size=3072, num_heads=12, num_kv_heads=4,
                          head_dim=64, num_target_layers=12, draft_error_rate=0.5),
}


def _corpus_text() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in _CORPUS_FILES:
        path = stdlib / name
        if path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    if not parts:
        raise RuntimeError(f"no corpus files found under {stdlib}; cannot train the tokenizer.")
    return "\n".join(parts)


def build_tokenizer(out_dir: Path, spec: TinySpec):
    """Train a byte-level BPE on the stdlib corpus and save HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - 16,  # leave room; model vocab is padded to vocab_size
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = _corpus_text()
    chunks = [text[i:i + 4096] for i in range(0, len(text), 4096)]
    tok.train_from_iterator(chunks, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|mask|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def _unit_rows(gen, n: int, d: int):
    import torch

    rows = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return rows / rows.norm(dim=1, keepdim=True)


def _qwen3_fields(spec: TinySpec, num_layers: int) -> dict:
    """config.json fields shared by the target and the draft (same shapes)."""
    return {
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "hidden_act": "silu", "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
        "attention_bias": False, "tie_word_embeddings": False,
    }


def _save_safetensors(state: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sorted(state.items())}, str(path),
              metadata={"format": "pt"})


def build_pair(out: Path, spec: TinySpec = TinySpec()) -> dict:
    """Write ``out/target`` and ``out/draft``; return a manifest dict."""
    import torch

    spec.validate()
    out = Path(out)
    tdir, ddir = out / "target", out / "draft"
    tdir.mkdir(parents=True, exist_ok=True)
    ddir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(tdir, spec)
    n_tok = len(tokenizer)
    if n_tok > spec.vocab_size:
        raise ValueError(f"tokenizer has {n_tok} tokens > vocab_size {spec.vocab_size}.")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    special_ids = {tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    V, H, r = spec.vocab_size, spec.hidden_size, spec.markov_rank
    gen = torch.Generator().manual_seed(spec.seed)

    # ---- bigram table next(x): one random cycle through all ordinary tokens (no
    #      short loops, so generations stay diverse), a few tokens lead to EOS.
    ordinary = torch.tensor([i for i in range(n_tok) if i not in special_ids])
    order = ordinary[torch.randperm(len(ordinary), generator=gen)]
    nxt = ordinary[torch.randint(len(ordinary), (V,), generator=gen)]  # non-ordinary rows
    nxt[order] = torch.roll(order, -1)
    to_eos = torch.rand(V, generator=gen) < spec.eos_rate
    nxt = torch.where(to_eos, torch.full_like(nxt, eos_id), nxt)

    # ---- target weights (HF Qwen3 names).
    u = _unit_rows(gen, V, H)                       # lm_head directions
    embed = torch.randn(V, H, generator=gen, dtype=torch.float64) * 0.1
    embed += u[nxt] * (H ** 0.5)                    # norm(embed[x]) ~ sqrt(H) * u[next(x)]
    lm_head = u * spec.sharpness
    q = H // 1
    kv = spec.num_kv_heads * spec.head_dim
    qd = spec.num_heads * spec.head_dim
    std = 0.02

    def rnd(*shape, scale=std):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    tstate = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head,
              "model.norm.weight": torch.ones(H, dtype=torch.float64)}
    mix = spec.context_mix
    for i in range(spec.num_target_layers):
        p = f"model.layers.{i}."
        tstate.update({
            p + "self_attn.q_proj.weight": rnd(qd, H, scale=0.5 / H ** 0.5),
            p + "self_attn.k_proj.weight": rnd(kv, H, scale=0.5 / H ** 0.5),
            p + "self_attn.v_proj.weight": rnd(kv, H, scale=1.0 / H ** 0.5),
            p + "self_attn.o_proj.weight": rnd(H, qd, scale=mix / qd ** 0.5),
            p + "self_attn.q_norm.weight": torch.ones(spec.head_dim, dtype=torch.float64),
            p + "self_attn.k_norm.weight": torch.ones(spec.head_dim, dtype=torch.float64),
            p + "mlp.gate_proj.weight": rnd(spec.intermediate_size, H, scale=1.0 / H ** 0.5),
            p + "mlp.up_proj.weight": rnd(spec.intermediate_size, H, scale=1.0 / H ** 0.5),
            p + "mlp.down_proj.weight": rnd(H, spec.intermediate_size,
                                            scale=mix / spec.intermediate_size ** 0.5),
            p + "input_layernorm.weight": torch.ones(H, dtype=torch.float64),
            p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.float64),
        })
    dt = getattr(torch, spec.dtype)
    _save_safetensors({k: v.to(dt) for k, v in tstate.items()}, tdir / "model.safetensors")
    tconfig = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        **_qwen3_fields(spec, spec.num_target_layers),
        "attention_dropout": 0.0, "use_cache": True,
        "use_sliding_window": False, "sliding_window": None,
        "bos_token_id": None, "eos_token_id": eos_id, "pad_token_id": tokenizer.pad_token_id,
        "torch_dtype": spec.dtype,
    }
    (tdir / "config.json").write_text(json.dumps(tconfig, indent=2) + "\n")
    (tdir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos_id, "pad_token_id": tokenizer.pad_token_id,
         "do_sample": False}, indent=2) + "\n")

    # ---- draft weights (DeepSpec / SGLang Qwen3DSparkModel names).
    wrong = torch.rand(V, generator=gen) < spec.draft_error_rate
    shift = torch.randint(1, len(ordinary), (V,), generator=gen)
    pos_in_ord = torch.full((V,), -1, dtype=torch.long)
    pos_in_ord[ordinary] = torch.arange(len(ordinary))
    # A wrong row points at another ordinary token (never the true next token).
    base_idx = torch.where(pos_in_ord[nxt] >= 0, pos_in_ord[nxt], torch.zeros_like(nxt))
    wrong_next = ordinary[(base_idx + shift) % len(ordinary)]
    draft_next = torch.where(wrong & (nxt != eos_id), wrong_next, nxt)
    is_right = draft_next == nxt
    w2_dirs = torch.zeros(V, r, dtype=torch.float64)
    w2_dirs[:, : r - 1] = _unit_rows(gen, V, r - 1)
    w1 = torch.zeros(V, r, dtype=torch.float64)
    w1[:, : r - 1] = w2_dirs[draft_next, : r - 1] * (spec.sharpness * H ** 0.5)
    w1[:, r - 1] = torch.where(is_right, 1.0, -1.0).double()
    logit_hi = torch.logit(torch.tensor(spec.confidence_hi, dtype=torch.float64))
    logit_lo = torch.logit(torch.tensor(spec.confidence_lo, dtype=torch.float64))
    conf_w = torch.zeros(1, H + r, dtype=torch.float64)
    conf_w[0, H + r - 1] = (logit_hi - logit_lo) / 2
    conf_b = torch.tensor([(logit_hi + logit_lo) / 2], dtype=torch.float64)
    K = len(spec.target_layer_ids)
    dstate = {
        "fc.weight": rnd(H, K * H, scale=1.0 / (K * H) ** 0.5),
        "hidden_norm.weight": torch.ones(H, dtype=torch.float64),
        "norm.weight": torch.zeros(H, dtype=torch.float64),  # backbone adds no logits
        "markov_head.markov_w1.weight": w1,
        "markov_head.markov_w2.weight": w2_dirs,
        "confidence_head.proj.weight": conf_w,
        "confidence_head.proj.bias": conf_b,
    }
    for i in range(spec.num_draft_layers):
        p = f"layers.{i}."
        dstate.update({
            p + "self_attn.q_proj.weight": rnd(qd, H),
            p + "self_attn.k_proj.weight": rnd(kv, H),
            p + "self_attn.v_proj.weight": rnd(kv, H),
            p + "self_attn.o_proj.weight": rnd(H, qd),
            p + "self_attn.q_norm.weight": torch.ones(spec.head_dim, dtype=torch.float64),
            p + "self_attn.k_norm.weight": torch.ones(spec.head_dim, dtype=torch.float64),
            p + "mlp.gate_proj.weight": rnd(spec.intermediate_size, H),
            p + "mlp.up_proj.weight": rnd(spec.intermediate_size, H),
            p + "mlp.down_proj.weight": rnd(H, spec.intermediate_size),
            p + "input_layernorm.weight": torch.ones(H, dtype=torch.float64),
            p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.float64),
        })
    _save_safetensors({k: v.to(dt) for k, v in dstate.items()}, ddir / "model.safetensors")
    dconfig = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
        **_qwen3_fields(spec, spec.num_draft_layers), "torch_dtype": spec.dtype,
        "block_size": spec.block_size, "num_target_layers": spec.num_target_layers,
        "dflash_config": {"target_layer_ids": list(spec.target_layer_ids),
                          "mask_token_id": mask_id, "block_size": spec.block_size},
        "mask_token_id": mask_id, "target_layer_ids": list(spec.target_layer_ids),
        "markov_rank": r, "markov_head_type": "vanilla",
        "enable_confidence_head": True, "confidence_head_with_markov": True,
    }
    (ddir / "config.json").write_text(json.dumps(dconfig, indent=2) + "\n")

    manifest = {
        "builder_version": BUILDER_VERSION,
        "spec": dataclasses.asdict(spec),
        "eos_token_id": eos_id, "mask_token_id": mask_id, "tokenizer_size": n_tok,
        "draft_row_accuracy": float(is_right[ordinary].double().mean()),
        "sha256": {
            "target": hashlib.sha256((tdir / "model.safetensors").read_bytes()).hexdigest(),
            "draft": hashlib.sha256((ddir / "model.safetensors").read_bytes()).hexdigest(),
        },
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def ensure_pair(out: Path, spec: TinySpec = TinySpec()) -> dict:
    """Build the pair unless ``out`` already holds one built from the same spec."""
    mf = Path(out) / "manifest.json"
    if mf.is_file():
        try:
            manifest = json.loads(mf.read_text())
            if (manifest.get("builder_version") == BUILDER_VERSION
                    and manifest.get("spec") == json.loads(json.dumps(dataclasses.asdict(spec)))):
                return manifest
        except (OSError, ValueError):
            pass
    return build_pair(out, spec)


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.tiny_models",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="output directory")
    d = TinySpec()
    for f in dataclasses.fields(TinySpec):
        if f.name == "target_layer_ids":
            p.add_argument("--target-layer-ids", default=",".join(map(str, d.target_layer_ids)),
                           help="comma-separated target layer ids (default %(default)s)")
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(d, f.name)),
                       default=getattr(d, f.name), help="default %(default)s")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinySpec)
          if f.name != "target_layer_ids"}
    try:
        ids = tuple(int(x) for x in args.target_layer_ids.split(",") if x.strip())
        spec = TinySpec(target_layer_ids=ids, **kw)
        manifest = build_pair(args.out, spec)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(args.out), **{k: manifest[k] for k in
                      ("eos_token_id", "mask_token_id", "draft_row_accuracy")}}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
