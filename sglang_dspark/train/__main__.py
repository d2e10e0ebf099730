"""CLI: ``python -m sglang_dspark.train {draft,tiny-pair,export-dflash} ...``

  draft        train a DSpark (or --mode dflash) drafter for a local HF causal-LM target
  tiny-pair    build the tiny stdlib-trained target + both drafters + tau report
  export-dflash  make a DFlash-mode draft servable by SGLang's DSPARK (zero Markov head)
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
    t.add_argument("--reuse-target", action="store_true",
                   help="keep OUT/target if a previous run trained it (drafters only)")

    e = sub.add_parser("export-dflash", help="serve a DFlash-mode draft under SGLang DSPARK")
    e.add_argument("--draft", required=True, type=Path)
    e.add_argument("--out", required=True, type=Path)
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


if __name__ == "__main__":
    raise SystemExit(main())
