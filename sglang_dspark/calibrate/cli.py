"""``python -m sglang_dspark.calibrate``: fit SGLang's STS temperatures for a DSpark
draft's confidence head from real rollouts, and check them on held-out rollouts.

1. Rollouts through the real SGLang engine (verify-all: every position observed),
   capturing per step the confidence logits and the realised acceptance of the same
   block (:mod:`sglang_dspark.capture`).  Or reuse captures: ``--capture FILE``.
2. Prompts (not rounds) are split into a fitting set and a held-out set
   (``--heldout-prompts FILE`` or a seeded ``--heldout-frac``), so no conversation
   is in both.
3. STS fit on the fitting set (:mod:`sglang_dspark.calibrate.sts`); ECE / AUC per
   position before and after on the held-out set; reliability diagram PNG.
4. ``OUT/sts.json`` in SGLang's format, read back with SGLang's own loader; unless
   ``--no-check-sts``, a second engine is started with
   ``--speculative-dspark-confidence-sts-path OUT/sts.json`` on the held-out prompts,
   and the confidences it served are checked to be sigmoid(raw / T_k).

Exit status: 0 ok, 1 engine/run failure, 2 bad input, 3 the fit missed ``--max-ece``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from sglang_dspark.calibrate.sts import (DEFAULT_BINS, StsData, default_grid, ece, fit_sts,
                                         position_metrics, survival)
from sglang_dspark.evaluate.cli import add_engine_args, check_engine_args, engine_config
from sglang_dspark.evaluate.metrics import finite_or_none
from sglang_dspark.evaluate.prompts import PromptSetError, load_prompts
from sglang_dspark.evaluate.rollout import PromptJob, RolloutError, read_capture, run_rollouts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.calibrate",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_argument_group("data source (rollouts, or existing captures)")
    src.add_argument("--prompts", help="JSONL prompt set for rollouts")
    src.add_argument("--heldout-prompts", help="separate JSONL prompt set for held-out rollouts")
    src.add_argument("--heldout-frac", type=float, default=0.5,
                     help="without --heldout-prompts: fraction of prompts held out (seeded)")
    src.add_argument("--capture", nargs="+",
                     help="capture file(s) from an earlier run (SGLANG_DSPARK_CAPTURE or "
                          "evaluate's OUT/capture.jsonl) instead of new rollouts; split by "
                          "conversation with --heldout-frac")
    src.add_argument("--rid-prefix", default=None,
                     help="with --capture: use only requests whose id starts with this "
                          "(evaluate's captures hold one label per temperature: T0-, T1-)")
    eng = p.add_argument_group("engine (rollouts only)")
    add_engine_args(eng)
    for a in eng._group_actions:
        if a.dest in ("target", "draft"):
            a.required = False
    eng.add_argument("--temperature", type=float, default=0.0,
                     help="sampling temperature of the rollouts (calibrate for the one you serve)")
    fit = p.add_argument_group("fit")
    fit.add_argument("--bins", type=int, default=DEFAULT_BINS, help="ECE bins (equal width)")
    fit.add_argument("--grid", type=float, nargs=3, default=[0.02, 50.0, 161],
                     metavar=("MIN", "MAX", "SIZE"), help="log-spaced temperature grid")
    fit.add_argument("--max-ece", type=float, default=None,
                     help="exit 3 if any held-out position's ECE after STS exceeds this")
    fit.add_argument("--no-check-sts", action="store_true",
                     help="skip the second engine run with the fitted STS file")
    p.add_argument("--out", required=True, help="output directory")
    return p


def _conversation(rid: str) -> str:
    return rid.rsplit("-t", 1)[0]


def _split_rounds(rounds: list[dict], frac: float, seed: int) -> tuple[list, list]:
    convs = sorted({_conversation(r["rid"]) for r in rounds})
    rng = random.Random(seed)
    rng.shuffle(convs)
    n_held = max(1, int(round(frac * len(convs))))
    if n_held >= len(convs):
        raise ValueError(f"only {len(convs)} conversations captured; cannot hold out "
                         f"{frac:.0%} and still fit")
    held = set(convs[:n_held])
    return ([r for r in rounds if _conversation(r["rid"]) not in held],
            [r for r in rounds if _conversation(r["rid"]) in held])


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.bins < 2:
        p.error("--bins must be >= 2")
    if not 0.0 < args.heldout_frac < 1.0:
        p.error("--heldout-frac must be within (0, 1)")
    lo, hi, size = args.grid
    if not 0 < lo < hi or size < 3:
        p.error("--grid needs 0 < MIN < MAX and SIZE >= 3")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"cannot create --out {out}: {e}")
    t0 = time.monotonic()
    run_info: dict = {}

    if args.capture:
        if args.prompts or args.heldout_prompts:
            p.error("pass either --capture or --prompts, not both")
        rounds = []
        for f in args.capture:
            if not Path(f).is_file():
                p.error(f"--capture {f} does not exist")
            try:
                rounds += read_capture(f)
            except (ValueError, KeyError) as e:
                p.error(f"--capture {f} is not a capture file ({e})")
        if args.rid_prefix:
            rounds = [r for r in rounds if r["rid"].startswith(args.rid_prefix)]
        if not rounds:
            p.error("the capture files hold no verify rounds"
                    + (f" with request ids starting {args.rid_prefix!r}" if args.rid_prefix else ""))
        try:
            fit_rounds, held_rounds = _split_rounds(rounds, args.heldout_frac, args.seed)
        except ValueError as e:
            p.error(str(e))
        run_info["source"] = {"capture": args.capture}
    else:
        if not args.prompts or not args.target or not args.draft:
            p.error("rollouts need --target, --draft and --prompts (or pass --capture FILE)")
        check_engine_args(p, args)
        if args.temperature < 0:
            p.error("--temperature must be >= 0")
        try:
            prompts = load_prompts(args.prompts, limit=args.num_prompts)
            held_prompts = load_prompts(args.heldout_prompts) if args.heldout_prompts else None
        except PromptSetError as e:
            p.error(str(e))
        if held_prompts is None:
            idx = list(range(len(prompts)))
            random.Random(args.seed).shuffle(idx)
            n_held = max(1, int(round(args.heldout_frac * len(prompts))))
            if n_held >= len(prompts):
                p.error(f"--prompts has {len(prompts)} prompts: too few to split off "
                        f"{args.heldout_frac:.0%} for held-out and still fit")
            held_set = set(idx[:n_held])
            held_prompts = [prompts[i] for i in sorted(held_set)]
            prompts = [prompts[i] for i in range(len(prompts)) if i not in held_set]
        common = dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                      ignore_eos=args.ignore_eos, max_turns=args.max_turns)
        jobs = [PromptJob(label="fit", prompts=prompts, **common),
                PromptJob(label="heldout", prompts=held_prompts, **common)]
        try:
            fit_res, held_res = run_rollouts(engine_config(args), jobs, out)
        except RolloutError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        fit_rounds, held_rounds = fit_res.rounds, held_res.rounds
        run_info["source"] = {"prompts": args.prompts, "heldout_prompts": args.heldout_prompts,
                              "fit_prompts": len(prompts), "heldout_prompts_n": len(held_prompts),
                              "temperature": args.temperature,
                              "max_new_tokens": args.max_new_tokens,
                              "verify_mode": args.verify_mode}
    if not fit_rounds or not held_rounds:
        print("error: no captured rounds in the fitting or the held-out set", file=sys.stderr)
        return 1
    fit_data, held_data = StsData.from_rounds(fit_rounds), StsData.from_rounds(held_rounds)
    grid = default_grid(lo, hi, int(size))
    temps = fit_sts(fit_data, grid=grid, bins=args.bins)
    held = position_metrics(held_data, temps, args.bins)
    fitm = position_metrics(fit_data, temps, args.bins)

    from sglang.srt.speculative.dspark_components.dspark_sts import (
        DSparkStsCalibration, load_sts_calibration_from_path)

    sts_path = out / "sts.json"
    cal = DSparkStsCalibration(
        temperatures=[float(t) for t in temps],
        dataset=str(args.prompts or ",".join(args.capture)), num_samples=int(fit_data.n),
        ece_before=[float(m["ece_before"]) for m in held],
        ece_after=[float(m["ece_after"]) for m in held])
    sts_path.write_text(cal.to_json() + "\n")
    loaded = load_sts_calibration_from_path(str(sts_path))
    if list(loaded.temperatures) != [float(t) for t in temps]:
        print("error: SGLang's loader read different temperatures back", file=sys.stderr)
        return 1

    report = {"sts_path": str(sts_path), "temperatures": temps, "gamma": fit_data.gamma,
              "bins": args.bins, "fit_rounds": fit_data.n, "heldout_rounds": held_data.n,
              **run_info, "sglang_loader": "ok",
              "heldout": [{k: v for k, v in m.items() if not k.startswith("reliability")}
                          for m in held],
              "fit": [{k: v for k, v in m.items() if not k.startswith("reliability")}
                      for m in fitm]}

    if not args.no_check_sts and not args.capture:
        check_dir = out / "sts_check"
        job = PromptJob(label="stscheck", prompts=held_prompts,
                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                        ignore_eos=args.ignore_eos, max_turns=args.max_turns)
        try:
            (res,) = run_rollouts(engine_config(args, str(sts_path)), [job], check_dir)
        except RolloutError as e:
            print(f"error: engine with --speculative-dspark-confidence-sts-path failed: {e}",
                  file=sys.stderr)
            return 1
        report["sts_check"] = _check_served(res.rounds, temps, args.bins)
        if not report["sts_check"]["applied"]:
            print("error: the engine did not apply the STS temperatures", file=sys.stderr)
            return 1
    report["wall_s"] = time.monotonic() - t0
    (out / "calibration.json").write_text(json.dumps(finite_or_none(report), indent=2) + "\n")
    from sglang_dspark.evaluate.plot import plot_reliability

    plot_reliability([{"position": m["position"], "before": m["reliability_before"],
                       "after": m["reliability_after"], "ece_before": m["ece_before"],
                       "ece_after": m["ece_after"]} for m in held],
                     out / "reliability.png",
                     title=f"held-out reliability ({held_data.n} rounds), STS T = "
                           + ", ".join(f"{t:.3g}" for t in temps))
    for m in held:
        print(f"position {m['position']}: T {m['temperature']:.3f}  held-out ECE "
              f"{100 * m['ece_before']:.2f}% -> {100 * m['ece_after']:.2f}%  AUC "
              f"{m['auc_before']:.3f} -> {m['auc_after']:.3f}  (n={m['rounds']})")
    print(f"wrote {sts_path}, {out / 'calibration.json'}, {out / 'reliability.png'}")
    if args.max_ece is not None:
        worst = max(m["ece_after"] for m in held)
        if worst > args.max_ece:
            print(f"error: held-out ECE after STS {worst:.4f} > --max-ece {args.max_ece}",
                  file=sys.stderr)
            return 3
    return 0


def _check_served(rounds: list[dict], temps, bins: int) -> dict:
    """Confidences the STS-loaded engine served vs sigmoid(raw / T_k)."""
    served = [r for r in rounds if r.get("conf") is not None]
    if not served:
        return {"applied": False, "reason": "no served confidences captured"}
    data = StsData.from_rounds(served)
    conf = np.array([r["conf"] for r in served], dtype=np.float64)
    expect = 1.0 / (1.0 + np.exp(-data.logits / np.asarray(temps)[None, :]))
    raw = 1.0 / (1.0 + np.exp(-data.logits))
    err, err_raw = float(np.abs(conf - expect).max()), float(np.abs(conf - raw).max())
    surv = np.cumprod(conf, axis=1)
    served_ece = [ece(surv[data.observed[:, k], k], data.prefix[data.observed[:, k], k], bins)
                  for k in range(data.gamma)]
    applied = err < 1e-3 and (err_raw > 1e-3 or np.allclose(temps, 1.0, atol=1e-3))
    return {"applied": bool(applied), "rounds": data.n, "max_abs_err_vs_sts": err,
            "max_abs_err_vs_raw": err_raw, "served_ece": served_ece}


_ = survival  # re-exported for callers
