"""``python -m sglang_dspark.evaluate``: acceptance metrics of a DSpark pair, measured
through the real SGLang engine (CPU here, GPU unchanged).

Writes ``OUT/evaluation.json`` (per temperature: tau mean/distribution, per-position
conditional acceptance, verify efficiency, SGLang's own served accounting as a
cross-check), ``OUT/evaluation.png`` and the raw per-step capture
``OUT/capture.jsonl`` (usable by ``python -m sglang_dspark.calibrate --capture``).
Exit status 2 = bad input (the message says what to fix).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sglang_dspark.evaluate.metrics import (acceptance_summary, finite_or_none,
                                            rounds_arrays, served_summary)
from sglang_dspark.evaluate.prompts import PromptSetError, load_prompts
from sglang_dspark.evaluate.rollout import (VERIFY_MODES, EngineConfig, PromptJob, RolloutError,
                                            draft_gamma, job_to_dict, run_rollouts,
                                            validate_model_dirs, validate_pair)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target model directory (HF format)")
    p.add_argument("--draft", required=True, help="DSpark draft directory (Qwen3DSparkModel)")
    p.add_argument("--block-size", type=int, default=None,
                   help="gamma (draft tokens per block); default: the draft's block_size")
    p.add_argument("--max-new-tokens", type=int, default=128, help="per turn (default %(default)s)")
    p.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--max-turns", type=int, default=None, help="use at most N turns per prompt")
    p.add_argument("--ignore-eos", action="store_true", help="generate max-new-tokens every turn")
    p.add_argument("--no-chat-template", action="store_true",
                   help="join turns as plain text instead of applying the chat template")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", default="auto", help="engine dtype (auto, float32, bfloat16, ...)")
    p.add_argument("--verify-mode", choices=VERIFY_MODES, default="verify-all",
                   help="verify-all: every draft token verified (all positions observed) with "
                        "the confidence head running (SGLang cap-accept, no SPS table, online "
                        "planning off); static: SGLang static mode (no confidences); "
                        "cap-accept/compact: SGLang's budgeted modes as served")
    p.add_argument("--max-running-requests", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)


def check_engine_args(p: argparse.ArgumentParser, args, pair: bool = True) -> None:
    """Exit 2 (``p.error``) on a bad engine option or model directory; ``pair``: also run the
    draft/target checks SGLang's start-up would (:func:`check_pair`)."""
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if args.block_size is not None and not 1 <= args.block_size <= 16:
        p.error("--block-size must be within 1..16")
    if args.num_prompts is not None and args.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    if args.max_running_requests < 1:
        p.error("--max-running-requests must be >= 1")
    try:
        validate_model_dirs(args.target, args.draft)
    except RolloutError as e:
        p.error(str(e))
    if pair:
        check_pair(p, args)


def check_pair(p: argparse.ArgumentParser, args) -> None:
    """Exit 2 before any engine starts when the draft does not fit the target (hidden size,
    vocabulary, tensors, ``target_layer_ids``: ``sglang_dspark.checkpoint``)."""
    try:
        validate_pair(args.target, args.draft)
    except RolloutError as e:
        p.error(str(e))


def engine_config(args, sts_path=None) -> EngineConfig:
    return EngineConfig(target=args.target, draft=args.draft, device=args.device,
                        dtype=args.dtype, block_size=args.block_size,
                        verify_mode=args.verify_mode, sts_path=sts_path,
                        max_running_requests=args.max_running_requests,
                        max_total_tokens=args.max_total_tokens, seed=args.seed,
                        chat_template=not args.no_chat_template)


def _temp_label(t: float) -> str:
    return f"T{t:g}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.evaluate",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", required=True,
                   help='JSONL prompt set, one {"turns": ["user msg", ...]} per line')
    p.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0],
                   help="sampling temperatures to evaluate (one engine, one pass each)")
    p.add_argument("--sts", default=None,
                   help="STS JSON passed as --speculative-dspark-confidence-sts-path")
    p.add_argument("--out", required=True, help="output directory")
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    check_engine_args(p, args, pair=False)     # the cheap checks first; the pair's below
    if any(t < 0 for t in args.temperature):
        p.error("--temperature values must be >= 0")
    if len(set(args.temperature)) != len(args.temperature):
        p.error("--temperature values must be distinct")
    if args.sts is not None and not Path(args.sts).is_file():
        p.error(f"--sts {args.sts} does not exist (write one with python -m sglang_dspark.calibrate)")
    try:
        prompts = load_prompts(args.prompts, limit=args.num_prompts)
    except PromptSetError as e:
        p.error(str(e))
    check_pair(p, args)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"cannot create --out {out}: {e}")

    gamma = draft_gamma(args.draft, args.block_size)
    jobs = [PromptJob(label=_temp_label(t), prompts=prompts, temperature=t,
                      max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                      max_turns=args.max_turns) for t in args.temperature]
    t0 = time.monotonic()
    try:
        results = run_rollouts(engine_config(args, args.sts), jobs, out)
    except RolloutError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    wall = time.monotonic() - t0

    report = {"target": args.target, "draft": args.draft, "prompts": args.prompts,
              "num_prompts": len(prompts), "gamma": gamma, "verify_mode": args.verify_mode,
              "sts": args.sts, "wall_s": wall,
              "source": "per-step capture from our worker (SGLANG_DSPARK_CAPTURE): each "
                        "round's accepted draft tokens, paired with the block it verified",
              "results": {}}
    summaries = {}
    for res, job in zip(results, jobs):
        acc, ver, g = rounds_arrays(res.rounds)
        s = acceptance_summary(acc, ver, g or gamma)
        summaries[res.label] = s
        report["results"][res.label] = {"temperature": res.temperature, "job": job_to_dict(job),
                                        "acceptance": s,
                                        "served": served_summary(res.requests, gamma)}
    (out / "evaluation.json").write_text(json.dumps(finite_or_none(report), indent=2) + "\n")
    from sglang_dspark.evaluate.plot import plot_evaluation

    plot_evaluation(summaries, out / "evaluation.png",
                    title=f"{Path(args.draft).name} on {Path(args.prompts).name} (gamma {gamma})")
    for lab, s in summaries.items():
        pp = " ".join(f"{x['p_conditional']:.3f}" for x in s.get("per_position", []))
        print(f"{lab}: rounds {s.get('rounds')} tau {s.get('tau_mean', float('nan')):.3f} "
              f"per-position [{pp}] verify-efficiency {s.get('verify_efficiency', float('nan')):.3f}")
    print(f"wrote {out / 'evaluation.json'} and {out / 'evaluation.png'} ({wall:.0f}s)")
    return 0
