"""CLI: ``python -m sglang_dspark.train {draft,tiny-pair,export-dflash,conf-finetune} ...``

  draft        train a DSpark (or --mode dflash) drafter for a local HF causal-LM target
  tiny-pair    build the tiny stdlib-trained target + both drafters + tau report
  export-dflash  make a DFlash-mode draft servable by SGLang's DSPARK (zero Markov head)
  conf-finetune  refit only a DSpark draft's confidence head on its own sampled rollouts
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path


class CliError(Exception):
    pass


def _layer_ids(s: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints like 1,2 — got {s!r}")
    if not ids:
        raise argparse.ArgumentTypeError("give at least one target layer id")
    return ids


def _pos_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _pos_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s}")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("draft", help="train a drafter against a local HF target")
    d.add_argument("--target", required=True, type=Path, help="local HF model directory")
    d.add_argument("--data", required=True, nargs="+", type=Path,
                   help="chat .jsonl ({'messages': [...]}, assistant tokens trained) and/or "
                        "plain-text files (.txt/.py/.md; every token trained)")
    d.add_argument("--out", required=True, type=Path, help="output draft directory")
    d.add_argument("--mode", choices=("dspark", "dflash"), default="dspark")
    d.add_argument("--block-size", type=_pos_int, default=8, help="gamma (default %(default)s)")
    d.add_argument("--target-layer-ids", type=_layer_ids, default=None,
                   help="comma-separated; each in [0, num_layers-2] (default: spread)")
    d.add_argument("--num-layers", type=_pos_int, default=1)
    d.add_argument("--markov-rank", type=_pos_int, default=256)
    d.add_argument("--steps", type=_pos_int, default=300)
    d.add_argument("--batch-size", type=_pos_int, default=8)
    d.add_argument("--seq-len", type=_pos_int, default=256)
    d.add_argument("--anchors-per-seq", type=_pos_int, default=32)
    d.add_argument("--lr", type=float, default=1e-3)
    d.add_argument("--ce-label", choices=("target", "data"), default="target")
    d.add_argument("--conf-label", choices=("tv", "greedy"), default="tv",
                   help="confidence head label: 1 - TV (paper; acceptance at T = 1) or greedy "
                        "argmax agreement (acceptance at T = 0)")
    d.add_argument("--max-sequences", type=_pos_int, default=None)
    d.add_argument("--cache-target", action="store_true",
                   help="keep target features in memory (repeat batches skip the target)")
    d.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=_pos_int, default=None, help="torch CPU threads")

    t = sub.add_parser("tiny-pair", help="tiny stdlib-trained target + DSpark/DFlash drafters")
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--fast", action="store_true", help="minutes-scale smoke version (tests)")
    t.add_argument("--no-engine", action="store_true", help="skip the SGLang engine tau")
    t.add_argument("--device", default="cpu")
    t.add_argument("--threads", type=_pos_int, default=2)
    t.add_argument("--target-steps", type=_pos_int, default=None)
    t.add_argument("--draft-steps", type=_pos_int, default=None)
    t.add_argument("--block-size", type=_pos_int, default=None)
    t.add_argument("--conf-label", choices=("tv", "greedy"), default=None,
                   help="the DSpark drafter's confidence label (default tv, the paper's)")
    t.add_argument("--conf-finetune", choices=("tv", "survival", "accept", "none"), default=None,
                   help="refit the DSpark draft's confidence head on its own T = 1 rollouts "
                        "with this label (default tv; none skips; see `conf-finetune`)")
    t.add_argument("--reuse-target", action="store_true",
                   help="keep OUT/target if a previous run trained it (drafters only)")

    e = sub.add_parser("export-dflash", help="serve a DFlash-mode draft under SGLang DSPARK")
    e.add_argument("--draft", required=True, type=Path)
    e.add_argument("--out", required=True, type=Path)

    from .conf_finetune import LABELS, POSITION_WEIGHTS, PREFIX_MODES, ConfFinetuneConfig

    c0 = ConfFinetuneConfig()
    c = sub.add_parser(
        "conf-finetune",
        help="refit only the confidence head on the draft's own sampled rollouts "
             "(drafting and the served distribution are unchanged)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    c.add_argument("--target", required=True, type=Path, help="local HF target directory")
    c.add_argument("--draft", required=True, type=Path, help="DSpark draft directory (input)")
    c.add_argument("--out", required=True, type=Path,
                   help="output draft directory: the input with new confidence-head tensors")
    c.add_argument("--data", nargs="+", type=Path, default=None,
                   help="context corpus (.jsonl chat / plain text, as for `draft`); default: "
                        "the tiny pair's drafter corpus (training stdlib files, never held-out)")
    c.add_argument("--rollouts", type=_pos_int, default=c0.rollouts,
                   help="drafted blocks (one anchor each)")
    c.add_argument("--rollout-batch", type=_pos_int, default=c0.rollout_batch,
                   help="windows per target forward")
    c.add_argument("--min-context", type=_pos_int, default=c0.min_context,
                   help="shortest context window (tokens, anchor included)")
    c.add_argument("--max-context", type=_pos_int, default=c0.max_context)
    c.add_argument("--generate", type=int, default=c0.generate,
                   help="extend each corpus window by 0..N tokens the target samples at "
                        "--temperature, so anchors lie in generated text as when serving")
    c.add_argument("--temperature", type=_pos_float, default=c0.temperature,
                   help="sampling temperature the head is calibrated for (> 0)")
    c.add_argument("--steps", type=_pos_int, default=c0.steps, help="Adam steps")
    c.add_argument("--batch-size", type=_pos_int, default=c0.batch_size, help="rollouts per step")
    c.add_argument("--lr", type=_pos_float, default=c0.lr)
    c.add_argument("--label", choices=LABELS, default=c0.label,
                   help="tv: soft label 1 - TV(q_k, p_k) (paper); accept: realised acceptance; "
                        "survival: fit prod_{i<=k} c_k to the block's survival prod_{i<=k} "
                        "min(1, p/q) (the quantity STS calibrates; --prefix is ignored)")
    c.add_argument("--prefix", choices=PREFIX_MODES, default=c0.prefix,
                   help="sampled: train position k only where positions < k were accepted "
                        "in the simulated rejection sampling; expected: weight by that probability")
    c.add_argument("--position-weight", choices=POSITION_WEIGHTS, default=c0.position_weight,
                   help="decay: exp(-(k-1)/decay) like the drafter loss; uniform")
    c.add_argument("--decay", type=_pos_float, default=c0.decay)
    c.add_argument("--eval-frac", type=float, default=c0.eval_frac,
                   help="fraction of rollouts held out for the offline ECE report, in [0, 1)")
    c.add_argument("--seq-len", type=_pos_int, default=512,
                   help="corpus chunk length (windows are cut inside chunks)")
    c.add_argument("--device", default="cpu")
    c.add_argument("--seed", type=int, default=c0.seed)
    c.add_argument("--threads", type=_pos_int, default=None, help="torch CPU threads")
    return p


def _check_device(dev: str) -> None:
    import torch

    try:
        d = torch.device(dev)
    except RuntimeError:
        raise CliError(f"--device {dev!r} is not a torch device; use cpu, cuda or cuda:N.")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda requested but no CUDA device is available; use --device cpu.")


def main(argv=None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return _run(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # DataError, TargetError, DraftCheckpointError, config errors
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.cmd == "export-dflash":
        from .model import export_dflash_as_neutral_dspark

        if not (args.draft / "config.json").is_file():
            raise CliError(f"{args.draft} is not a draft directory (no config.json).")
        export_dflash_as_neutral_dspark(args.draft, args.out)
        print(json.dumps({"out": str(args.out)}))
        return 0
    _check_device(args.device)
    if args.cmd == "conf-finetune":
        return _conf_finetune(args)
    if args.cmd == "tiny-pair":
        from .tiny_pair import FAST, TinyPairConfig, run_tiny_pair

        cfg = FAST if args.fast else TinyPairConfig()
        over = {"device": args.device}
        if args.no_engine:
            over["engine_eval"] = False
        if args.draft_steps:
            over["draft_steps"] = args.draft_steps
        if args.block_size:
            over["block_size"] = args.block_size
        if args.conf_label:
            over["conf_label"] = args.conf_label
        if args.conf_finetune:
            over["conf_finetune"] = "" if args.conf_finetune == "none" else args.conf_finetune
        cfg = replace(cfg, **over)
        if args.target_steps:
            cfg = replace(cfg, target=replace(cfg.target, steps=args.target_steps))
        rep = run_tiny_pair(args.out, cfg, reuse_target=args.reuse_target)
        print(json.dumps({"out": str(args.out), "wall_s": round(rep["wall_s"], 1),
                          **{k: v for k, v in rep["eval"].items() if "tau" in k}}))
        return 0
    # draft
    from sglang_dspark.checkpoint import validate_draft

    from .data import load_corpus
    from .loss import LossWeights
    from .target import Target
    from .trainer import DraftTrainConfig, train_draft

    if not args.target.is_dir():
        raise CliError(f"--target {args.target} is not a directory; pass a local HF model dir.")
    if args.lr <= 0:
        raise CliError("--lr must be > 0.")
    target = Target(args.target, device=args.device)
    if args.target_layer_ids:
        bad = [i for i in args.target_layer_ids if not 0 <= i < target.num_layers - 1]
        if bad:
            raise CliError(f"--target-layer-ids {bad} out of range for a {target.num_layers}-layer "
                           f"target; use ids in [0, {target.num_layers - 2}].")
    seqs = load_corpus(target.tokenizer, args.data, args.seq_len, args.max_sequences)
    w = replace(LossWeights.for_mode(args.mode), ce_label=args.ce_label, conf_label=args.conf_label)
    cfg = DraftTrainConfig(mode=args.mode, block_size=args.block_size,
                           target_layer_ids=args.target_layer_ids, num_layers=args.num_layers,
                           markov_rank=args.markov_rank, steps=args.steps,
                           batch_size=args.batch_size, anchors_per_seq=args.anchors_per_seq,
                           lr=args.lr, seed=args.seed, device=args.device,
                           cache_target=args.cache_target, weights=w)
    res = train_draft(target, seqs, cfg, args.out)
    if args.mode == "dspark":
        validate_draft(args.out, args.target)
    print(json.dumps({"out": str(args.out), "wall_s": round(res.wall_s, 1),
                      "final": res.history[-1]}))
    return 0


def _conf_finetune(args) -> int:
    from .conf_finetune import (ConfFinetuneConfig, check_draft, run_conf_finetune,
                                stdlib_draft_corpus)
    from .data import load_corpus

    for flag, d in (("--target", args.target), ("--draft", args.draft)):
        if not (d / "config.json").is_file():
            raise CliError(f"{flag} {d} is not a model directory (no config.json).")
    if args.out.resolve() == args.draft.resolve():
        raise CliError("--out must differ from --draft (the input draft is left untouched).")
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"--out {args.out} exists and is not a directory.")
    if not 0 <= args.eval_frac < 1:
        raise CliError(f"--eval-frac must be in [0, 1), got {args.eval_frac}.")
    if args.min_context < 2 or args.max_context < args.min_context:
        raise CliError(f"need 2 <= --min-context <= --max-context, got {args.min_context} "
                       f"and {args.max_context}.")
    if args.generate < 0:
        raise CliError(f"--generate must be >= 0, got {args.generate}.")
    if args.seq_len < args.max_context:
        raise CliError(f"--seq-len {args.seq_len} must be >= --max-context {args.max_context}.")
    check_draft(args.draft)
    cfg = ConfFinetuneConfig(
        rollouts=args.rollouts, rollout_batch=args.rollout_batch, min_context=args.min_context,
        max_context=args.max_context, generate=args.generate, temperature=args.temperature,
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, label=args.label,
        prefix=args.prefix, position_weight=args.position_weight, decay=args.decay,
        eval_frac=args.eval_frac, seed=args.seed, device=args.device)
    cfg.validate()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    if args.data:
        seqs = load_corpus(tok, args.data, args.seq_len)
        desc = "files: " + ", ".join(map(str, args.data))
    else:
        seqs, desc = stdlib_draft_corpus(tok, args.seq_len)
    rep = run_conf_finetune(target_dir=args.target, draft_dir=args.draft, out_dir=args.out,
                            seqs=seqs, cfg=cfg, data_desc=desc)
    summary = {"out": str(args.out), "wall_s": rep["wall_s"], "rollouts": rep["rollouts"],
               "loss_before": round(rep["loss_before"], 5),
               "loss_after": round(rep["loss_after"], 5)}
    for tag in ("before", "after"):
        m = rep.get(f"offline_{tag}")
        if m:
            summary[f"offline_heldout_ece_after_sts_{tag}"] = [
                round(x["ece_after"], 4) for x in m["heldout"]]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
