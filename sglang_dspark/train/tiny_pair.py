"""One command for a tiny target with learned structure and its DSpark / DFlash drafters.

1. stdlib BPE tokenizer (``sglang_dspark.tiny_models.build_tokenizer``);
2. a small Qwen3 target trained as a language model on standard-library sources
   (deterministic file split, fixed seeds; held-out files are never trained on);
3. a DSpark drafter and a DFlash-mode drafter (same backbone size, block size, data,
   steps and seed; only the heads and the loss differ);
4. both checkpoints checked with ``validate_draft``; the DFlash-mode draft is
   exported for serving as a DSPARK draft with a zero Markov head (identical math);
5. the DSpark drafter's confidence head refitted on its own T = 1 rollouts
   (:mod:`.conf_finetune`, ``conf_finetune`` label; only the two head tensors change, so
   drafting and tau are unchanged): ``draft-dspark-confft`` is the calibrated draft;
6. tau on held-out prompts: offline (HF simulation) and through the real SGLang
   engine (greedy, static verify, same block size for both).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .data import Sequence, split_stdlib, text_sequences
from .loss import LossWeights
from .trainer import DraftTrainConfig, train_draft


@dataclass(frozen=True)
class TinyTargetConfig:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 300
    lr: float = 3e-3
    warmup: int = 50
    seed: int = 0
    max_train_chars: int = 1_500_000


@dataclass(frozen=True)
class TinyPairConfig:
    target: TinyTargetConfig = TinyTargetConfig()
    draft_steps: int = 1500
    draft_batch: int = 8
    block_size: int = 8
    markov_rank: int = 128
    anchors_per_seq: int = 24
    draft_lr: float = 2e-3
    conf_label: str = "tv"        # the DSpark drafter's confidence label (loss.LossWeights)
    conf_finetune: str = "tv"     # refit the head on rollouts with this label ("" = skip)
    conf_finetune_rollouts: int = 16384
    eval_prompts: int = 16
    sim_prompts: int = 4          # offline (HF) simulation is slow on CPU: a few prompts
    prompt_len: int = 48
    max_new_tokens: int = 64
    device: str = "cpu"
    engine_eval: bool = True


FAST = TinyPairConfig(target=replace(TinyTargetConfig(), steps=60, batch_size=8,
                                     max_train_chars=200_000),
                      draft_steps=30, eval_prompts=4, sim_prompts=2, max_new_tokens=24, engine_eval=False,
                      conf_finetune_rollouts=512)


def _texts(files) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_target(out: Path, cfg: TinyTargetConfig, device: str = "cpu", log=print) -> dict:
    """Tokenizer + Qwen3 LM trained on stdlib sources; saved as an HF model dir."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sglang_dspark.tiny_models import TinySpec, build_tokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, TinySpec(vocab_size=cfg.vocab_size))
    train_files, _ = split_stdlib()
    text, total = [], 0
    for t in _texts(train_files):
        if total >= cfg.max_train_chars:
            break
        text.append(t)
        total += len(t)
    seqs = text_sequences(tok, text, cfg.seq_len)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    conf = Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=eos,
        pad_token_id=tok.pad_token_id, bos_token_id=None, use_cache=True)
    model = Qwen3ForCausalLM(conf).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    data = torch.tensor([s.tokens for s in seqs if len(s.tokens) == cfg.seq_len])
    t0 = time.time()
    hist = []
    for step in range(cfg.steps):
        idx = torch.randint(len(data), (cfg.batch_size,), generator=gen)
        x = data[idx].to(device)
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / cfg.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        hist.append(loss.item())
        if log and (step % 50 == 0 or step == cfg.steps - 1):
            log(f"[target] step {step:4d} loss={hist[-1]:.4f} ({time.time() - t0:.0f}s)")
    model.eval()
    model.config.torch_dtype = "float32"
    model.save_pretrained(str(out), safe_serialization=True)
    cfgj = json.loads((out / "config.json").read_text())
    cfgj["architectures"] = ["Qwen3ForCausalLM"]
    cfgj["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfgj, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos, "pad_token_id": tok.pad_token_id, "do_sample": False}, indent=2) + "\n")
    info = {"train_files": len(train_files), "train_sequences": len(data), "steps": cfg.steps,
            "final_loss": sum(hist[-20:]) / max(1, len(hist[-20:])), "wall_s": time.time() - t0}
    (out / "train_target.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def heldout_prompts(tokenizer, n: int, prompt_len: int) -> list[list[int]]:
    """n prompts of prompt_len tokens from held-out stdlib files (deterministic)."""
    _, held = split_stdlib()
    prompts = []
    per_file = max(1, math.ceil(n / len(held)))
    for f in held:
        ids = tokenizer(f.read_text(encoding="utf-8", errors="replace"),
                        add_special_tokens=False)["input_ids"]
        step = max(prompt_len, len(ids) // (per_file + 1))
        for j in range(per_file):
            s = (j + 1) * step - prompt_len
            if 0 <= s and s + prompt_len <= len(ids):
                prompts.append(ids[s:s + prompt_len])
        if len(prompts) >= n:
            break
    return prompts[:n]


def run_tiny_pair(out: Path, cfg: TinyPairConfig = TinyPairConfig(), log=print,
                  reuse_target: bool = False) -> dict:
    from sglang_dspark.checkpoint import validate_draft

    from .engine_eval import run_engine
    from .model import export_dflash_as_neutral_dspark, load_draft
    from .simulate import simulate_greedy, simulated_tau
    from .target import Target

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    report: dict = {"config": json.loads(json.dumps(asdict(cfg))),
                    "torch_threads": torch.get_num_threads()}
    tdir = out / "target"
    if reuse_target and (tdir / "train_target.json").is_file():
        report["target"] = {**json.loads((tdir / "train_target.json").read_text()), "reused": True}
    else:
        report["target"] = train_target(tdir, cfg.target, cfg.device, log)

    target = Target(tdir, device=cfg.device)
    train_files, _ = split_stdlib()
    # drafter data: the same training split the target saw (never the held-out files)
    seqs: list[Sequence] = text_sequences(target.tokenizer, _texts(train_files[::2]),
                                          cfg.target.seq_len, max_sequences=4000)
    dirs = {}
    for mode in ("dspark", "dflash"):
        dcfg = DraftTrainConfig(mode=mode, block_size=cfg.block_size, steps=cfg.draft_steps,
                                batch_size=cfg.draft_batch, anchors_per_seq=cfg.anchors_per_seq,
                                markov_rank=cfg.markov_rank, lr=cfg.draft_lr,
                                seed=cfg.target.seed, device=cfg.device,
                                weights=replace(LossWeights.for_mode(mode), conf_label=cfg.conf_label)
                                if mode == "dspark" else LossWeights.for_mode(mode))
        res = train_draft(target, seqs, dcfg, out / f"draft-{mode}", log=log)
        report[f"train_{mode}"] = {"wall_s": res.wall_s, "final": res.history[-1]}
        dirs[mode] = out / f"draft-{mode}"
    served = {"dspark": dirs["dspark"],
              "dflash": export_dflash_as_neutral_dspark(dirs["dflash"], out / "draft-dflash-served")}
    if cfg.conf_finetune and cfg.conf_label == "tv":   # a greedy-label head is for T = 0
        from .conf_finetune import ConfFinetuneConfig, run_conf_finetune, stdlib_draft_corpus

        cseqs, desc = stdlib_draft_corpus(target.tokenizer)
        ccfg = replace(ConfFinetuneConfig(), label=cfg.conf_finetune, device=cfg.device,
                       rollouts=cfg.conf_finetune_rollouts)
        crep = run_conf_finetune(target_dir=tdir, draft_dir=dirs["dspark"],
                                 out_dir=out / "draft-dspark-confft", seqs=cseqs, cfg=ccfg,
                                 data_desc=desc, log=log)
        report["conf_finetune"] = {"label": cfg.conf_finetune, "wall_s": crep["wall_s"],
                                   "out": "draft-dspark-confft"}
        served["dspark"] = out / "draft-dspark-confft"
    for mode, d in served.items():
        validate_draft(d, tdir)

    prompts = heldout_prompts(target.tokenizer, cfg.eval_prompts, cfg.prompt_len)
    report["eval"] = {"prompts": len(prompts), "prompt_len": cfg.prompt_len,
                      "max_new_tokens": cfg.max_new_tokens, "block_size": cfg.block_size}
    t_eval = time.time()
    for mode, d in served.items():
        draft = load_draft(d, target.embed.float(), target.lm_head.float()).eval()
        sims = [simulate_greedy(target, draft, p, cfg.max_new_tokens)
                for p in prompts[:cfg.sim_prompts]]
        report["eval"][f"sim_tau_{mode}"] = simulated_tau(sims)
        report["eval"][f"sim_verify_ct_{mode}"] = [s.verify_ct for s in sims]
        log(f"[eval] simulated tau {mode}: {report['eval'][f'sim_tau_{mode}']:.3f}")
    if cfg.engine_eval:
        for mode, d in served.items():
            res = run_engine(str(tdir), str(d), prompts, cfg.max_new_tokens, out / "engine")
            report["eval"][f"engine_tau_{mode}"] = res["tau"]
            report["eval"][f"engine_verify_ct_{mode}"] = [
                r["meta_info"].get("spec_verify_ct") for r in res["results"]]
            log(f"[eval] SGLang tau {mode}: {res['tau']:.3f}")
        e = report["eval"]
        e["engine_tau_ratio"] = e["engine_tau_dspark"] / e["engine_tau_dflash"]
    e = report["eval"]
    e["sim_tau_ratio"] = e["sim_tau_dspark"] / e["sim_tau_dflash"]
    e["wall_s"] = time.time() - t_eval
    report["wall_s"] = time.time() - t_all
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
