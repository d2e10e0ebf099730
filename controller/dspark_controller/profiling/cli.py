"""``dspark-controller`` subcommands for profiles: profile | show | diff | validate | schema | export | import.

Registered by :func:`add_subcommands` from :mod:`dspark_controller.cli` (same exit codes:
0 success, 1 failure, 2 bad input).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DEFAULT_SCHEMA_PATH = "profiles/schema/profile.schema.json"
STRICT_MAX_HELDOUT_ERROR = 0.25     # = profile_tools.STRICT_MAX_HELDOUT_ERROR (not imported: keeps --help light)


class ProfileUsageError(Exception):
    """Bad command-line input (exit code 2)."""


def _usage(msg: str) -> Exception:
    return ProfileUsageError(msg)


def _guard(fn: Any) -> Any:
    """Exit code 2 with ``dspark-controller CMD: error: ...`` for bad input, like the other commands.

    (Its own exception class: ``python -m dspark_controller.cli`` runs cli.py as ``__main__``,
    whose ``UsageError`` is a different class from ``dspark_controller.cli.UsageError``.)
    """
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except ProfileUsageError as exc:
            print(f"dspark-controller {args.command}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    run.__name__ = fn.__name__
    return run


def _command_line(argv: Optional[list[str]] = None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["dspark-controller"] + [shlex.quote(a) for a in args])[:4096]


def _csv(text: str, kind: type, what: str) -> list[Any]:
    try:
        return [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise _usage(f"{what}: {text!r} is not a comma-separated list of numbers") from None


def _load(path: str) -> Any:
    from dspark_controller.profiling.tools import ProfileToolError, load_any

    try:
        return load_any(path)
    except ProfileToolError as exc:
        raise _usage(str(exc)) from None


# ------------------------------------------------------------------ profile
def cmd_profile(args: argparse.Namespace) -> int:
    active = args.url is not None or args.launch is not None
    if active == (args.from_controller is not None):
        raise _usage("give exactly one source: --url http://HOST:PORT (active: drive a running SGLang DSPARK "
                     "server; or --launch CMD to start one) or --from-controller ADDR (passive: what a running "
                     "controller learned)")
    if args.from_controller is not None:
        return _profile_passive(args)
    return _profile_active(args)


def _profile_passive(args: argparse.Namespace) -> int:
    from dspark_controller.core.profile_file import save_profile
    from dspark_controller.profiling.live import ProfilingError, fetch_from_controller

    from dspark_controller.service.endpoints import ConfigError, check_endpoint

    active_only = [f for f, v in (("--concurrency", args.concurrency), ("--fractions", args.fractions),
                                  ("--resume", args.resume)) if v]
    if active_only:
        raise _usage(f"{', '.join(active_only)} only apply to --url (active profiling)")
    try:
        check_endpoint(args.from_controller, option="--from-controller", example="tcp://127.0.0.1:7152")
    except ConfigError as exc:
        raise _usage(str(exc)) from None
    curve = None
    if args.curve_server_key or args.curve_client_cert:
        from dspark_controller.service.endpoints import curve_client_options

        try:
            server_key, keys = curve_client_options(args.curve_server_key, args.curve_client_cert)
        except Exception as exc:
            raise _usage(str(exc)) from None
        curve = (server_key, keys)
    try:
        pf, info = fetch_from_controller(args.from_controller, profile_key=args.profile_key,
                                         timeout=args.timeout, curve=curve, min_samples=args.min_samples,
                                         command=_command_line(args._argv))
    except ProfilingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    save_profile(args.out, pf)
    err = pf.heldout_error
    print(f"wrote {args.out}: profile {pf.profile_key} from controller {info['controller_id']} "
          f"({pf.samples_seen} samples learned from live telemetry of {', '.join(info['engines']) or 'past engines'}; "
          f"prequential held-out error {'n/a' if err.mape is None else f'{100 * err.mape:.1f}%'} over {err.n} steps)")
    print(f"next: dspark-controller show {args.out} --png {Path(args.out).with_suffix('.png').name}")
    return EXIT_OK


def _profile_active(args: argparse.Namespace) -> int:
    from dspark_controller.profiling.live import ProfileSettings, ProfilingError, Progress

    passive_only = [f for f, v in (("--profile-key", args.profile_key),) if v]
    if passive_only:
        raise _usage(f"{', '.join(passive_only)} only applies to --from-controller")
    s = ProfileSettings(
        url=args.url or "http://127.0.0.1:0", out=args.out,
        concurrency=_csv(args.concurrency, int, "--concurrency") if args.concurrency else None,
        fractions=_csv(args.fractions, float, "--fractions") if args.fractions else [1.0, 0.75, 0.5, 0.25, 0.0],
        steps_per_round=args.steps_per_round, warmup_steps=args.warmup_steps, precision=args.precision,
        min_passes=args.min_passes, max_passes=args.max_passes, max_time_s=args.max_time,
        round_timeout_s=args.round_timeout, restart_wait_s=args.restart_wait, max_retries=args.max_retries,
        heldout_frac=args.heldout, seed=args.seed, device_name=args.device_name, time_field=args.time_field,
        clear_records=not args.keep_records, checkpoint=args.checkpoint, resume=args.resume,
        command=_command_line(args._argv))
    try:
        s.validate()
    except ValueError as exc:
        raise _usage(str(exc)) from None
    if args.resume and not s.checkpoint_path().is_file():
        raise _usage(f"--resume: no checkpoint at {s.checkpoint_path()} (it is written next to -o as "
                     "OUT.partial.json unless --checkpoint says otherwise)")
    if not args.resume and s.checkpoint_path().is_file():
        print(f"note: {s.checkpoint_path()} exists from an earlier interrupted run; starting afresh "
              "(use --resume to continue it instead)", file=sys.stderr)
    progress = Progress(enabled=not args.quiet)
    if args.launch:
        from dspark_controller.profiling.live import LaunchedServer

        try:
            launched = LaunchedServer(args.launch, message=progress.message)
        except ValueError as exc:
            raise _usage(str(exc)) from None
        try:
            with launched:
                s.url = launched.url
                return _run_active(s, progress, args)
        except ProfilingError as exc:
            print(f"error: {exc}\nno profile was written.", file=sys.stderr)
            return EXIT_FAIL
    return _run_active(s, progress, args)


def _run_active(s: Any, progress: Any, args: argparse.Namespace) -> int:
    from dspark_controller.profiling.tools import format_table
    from dspark_controller.profiling.live import ActiveProfiler, ProfilingError

    prof = ActiveProfiler(s, progress=progress)
    try:
        res = prof.run()
    except KeyboardInterrupt:
        prof.release()
        if prof.ctx is not None and prof.rounds:
            prof.checkpoint()
            print(f"\ninterrupted: {len(prof.rounds)} rounds kept in {s.checkpoint_path()}; continue with the same "
                  "command plus --resume", file=sys.stderr)
        return 130
    except ProfilingError as exc:
        prof.release()
        kept = ""
        if prof.ctx is not None and prof.rounds:
            try:
                prof.checkpoint()
                kept = (f"\n{len(prof.rounds)} rounds ({len(prof.samples)} samples) are kept in "
                        f"{s.checkpoint_path()}; fix the problem and rerun the same command with --resume.")
            except OSError:
                pass
        print(f"error: {exc}{kept}\nno profile was written.", file=sys.stderr)
        return EXIT_FAIL
    rows = [[str(c["R"]), f"{c['frac']:g}", str(c["rounds"]), str(c["steps"]),
             "-" if c["median_ms"] is None else f"{c['median_ms']:.2f}",
             "-" if c["rel_se"] == float("inf") else f"{100 * c['rel_se']:.1f}%"] for c in res.cells]
    if not args.quiet:
        print(format_table(["R", "frac", "rounds", "steps at R", "median ms", "rel. SE"], rows))
    h = res.heldout
    print(f"wrote {res.out}: profile {res.profile.profile_key}, {res.samples} samples in {res.rounds} rounds "
          f"({res.passes} passes, {res.wall_s:.0f}s), {'converged' if res.converged else 'NOT converged'} at "
          f"{100 * s.precision:g}%; held-out step-time error {100 * h['mape']:.1f}% (n={h['n']})"
          if h.get("n") else f"wrote {res.out} ({res.samples} samples, no held-out split)")
    print(f"next: dspark-controller show {res.out} --png {Path(res.out).with_suffix('.png').name}")
    return EXIT_OK


# ------------------------------------------------------------------ show / diff / validate
def cmd_show(args: argparse.Namespace) -> int:
    from dspark_controller.profiling.tools import budget_rows, budget_table, format_table, summary_table

    lp = _load(args.file)
    if not lp.model.ready:
        print(f"error: {args.file} has no data (the model is not ready)", file=sys.stderr)
        return EXIT_FAIL
    confs = _csv(args.confidence, float, "--confidence")
    if not confs or any(not 0.0 <= c <= 1.0 for c in confs):
        raise _usage("--confidence takes probabilities in [0, 1], e.g. 0.6,0.8,0.9")
    levels = _csv(args.levels, int, "--levels") if args.levels else None
    brows = budget_rows(lp, confs, levels=levels)
    if args.json:
        from dspark_controller.profiling.tools import sample_cells

        out = {"file": args.file, "kind": lp.kind, "description": lp.describe(), "cells": sample_cells(lp.samples),
               "budgets": brows}
        if lp.profile is not None:
            out["heldout_error"] = lp.profile.heldout_error.model_dump()
            out["provenance"] = lp.profile.provenance.model_dump()
        print(json.dumps(out))
    else:
        print(lp.describe())
        if lp.profile is not None:
            e = lp.profile.heldout_error
            print(f"  {lp.profile.samples_seen} samples learned, held-out step-time error "
                  f"{'n/a' if e.mape is None else f'{100 * e.mape:.1f}% (n={e.n}, p90 {100 * (e.p90_abs_rel or 0):.1f}%)'}")
            print(f"  made by: {lp.profile.provenance.command or '?'} ({lp.profile.provenance.created_at})")
        print()
        print("step time per (R running requests, B verified tokens): measured median vs the fitted model")
        print(format_table(*summary_table(lp, max_rows=args.max_rows)))
        print()
        print("budget the scheduler would pick (compute_lagged_budget; every request has per-position "
              "confidence c)")
        print(format_table(*budget_table(brows)))
    if args.png:
        from dspark_controller.profiling.plots import plot_profile
        from dspark_controller.profiling.tools import ProfileToolError

        try:
            plot_profile(lp, args.png, confidences=confs, levels=levels)
        except ProfileToolError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAIL
        print(f"wrote {args.png}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from dspark_controller.profiling.tools import ProfileToolError, diff_profiles, format_table

    a, b = _load(args.a), _load(args.b)
    levels = _csv(args.levels, int, "--levels") if args.levels else None
    try:
        d = diff_profiles(a, b, levels=levels)
    except ProfileToolError as exc:
        raise _usage(str(exc)) from None
    sm = d.summary
    if args.json:
        print(json.dumps(d.to_dict()))
    else:
        print(f"A: {a.describe()}\nB: {b.describe()}")
        for k, (va, vb) in d.fingerprint_changes.items():
            print(f"  fingerprint differs: {k}: {va!r} -> {vb!r}")
        rows = [[str(x["R"]), str(x["B"]), f"{x['a_ms']:.2f}", f"{x['b_ms']:.2f}", f"{100 * x['rel_diff']:+.1f}%",
                 ("A" if x["measured_a"] else "-") + ("B" if x["measured_b"] else "-")] for x in d.rows]
        print(format_table(["R", "B", "A ms", "B ms", "(B-A)/A", "measured"], rows))

        def pct(v: Any) -> str:
            return "n/a" if v is None else f"{100 * v:.1f}%"

        print(f"summary: mean |diff| {pct(sm['mean_abs_rel_diff'])}, median diff {100 * sm['median_rel_diff']:+.1f}%, "
              f"max |diff| {pct(sm['max_abs_rel_diff'])} at R={sm['max_at']['R']} B={sm['max_at']['B']}; "
              f"where both measured ({sm['points_measured_in_both']} points): "
              f"{pct(sm['mean_abs_rel_diff_measured_in_both'])}; held-out error A {pct(sm['heldout_error_a'])}, "
              f"B {pct(sm['heldout_error_b'])}")
    if args.png:
        from dspark_controller.profiling.plots import plot_diff

        try:
            plot_diff(a, b, d.rows, args.png)
        except ProfileToolError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAIL
        print(f"wrote {args.png}", file=sys.stderr if args.json else sys.stdout)
    if args.fail_above is not None and sm["max_abs_rel_diff"] > args.fail_above:
        print(f"max |diff| {100 * sm['max_abs_rel_diff']:.1f}% exceeds --fail-above {100 * args.fail_above:g}%",
              file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from dspark_controller.profiling.tools import validate_file

    if not 0.0 < args.max_error:
        raise _usage(f"--max-error {args.max_error:g}: give the largest acceptable held-out error as a fraction "
                     "> 0, e.g. 0.25 for 25%")
    bad = 0
    for f in args.files:
        chk = validate_file(f, max_error=args.max_error)
        if not chk.ok:
            verdict = "INVALID"
        elif chk.warnings and args.strict:
            verdict = f"FAILS --strict ({len(chk.warnings)} warning{'s' if len(chk.warnings) > 1 else ''})"
        elif chk.warnings:
            verdict = f"OK, with {len(chk.warnings)} warning{'s' if len(chk.warnings) > 1 else ''}"
        else:
            verdict = "OK"
        print(f"{f}: {verdict}")
        for n in chk.notes:
            print(f"  {n}")
        for w in chk.warnings:
            print(f"  warning: {w}")
        for p in chk.problems:
            print(f"  problem: {p}")
        bad += (not chk.ok) or (args.strict and bool(chk.warnings))
    return EXIT_OK if bad == 0 else EXIT_FAIL


# ------------------------------------------------------------------ schema / export / import
def cmd_schema(args: argparse.Namespace) -> int:
    from dspark_controller.profiling.tools import schema_text

    text = schema_text()
    if args.check:
        p = Path(args.check)
        try:
            cur = p.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"{p}: cannot read ({exc}); regenerate with: dspark-controller schema -o {p}", file=sys.stderr)
            return EXIT_FAIL
        if cur != text:
            print(f"{p} is out of date; regenerate with: dspark-controller schema -o {p}", file=sys.stderr)
            return EXIT_FAIL
        print(f"{p} is up to date")
        return EXIT_OK
    if args.out:
        from dspark_controller.profiling.tools import write_text_atomic

        write_text_atomic(args.out, text)
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from dspark_controller.profiling.tools import ProfileToolError, default_num_requests, export_table, write_json_atomic

    lp = _load(args.file)
    try:
        table = export_table(lp, args.format, num_requests=args.num_requests, b_min=args.b_min, b_max=args.b_max)
    except ProfileToolError as exc:
        raise _usage(str(exc)) from None
    from dspark_controller.profiling.tools import extrapolation_warnings

    for w in extrapolation_warnings(lp, num_requests=args.num_requests, b_max=args.b_max):
        print(f"warning: {w}", file=sys.stderr)
    if args.out == "-":
        print(json.dumps(table))
        return EXIT_OK
    write_json_atomic(args.out, table, indent=None)
    from dspark_controller.profiling.tools import sglang_table_loader

    load_sps_table_from_path = sglang_table_loader()
    if load_sps_table_from_path is None:
        check = "SGLang not installed here, not checked with its loader"
    else:
        try:
            load_sps_table_from_path(args.out)
            check = "SGLang's load_sps_table_from_path accepts it"
        except Exception as exc:
            print(f"error: SGLang's loader rejects the exported table: {exc}", file=sys.stderr)
            return EXIT_FAIL
    what = ("SpsAdditiveCostTable" if args.format == "additive" else
            f"SpsCostTable at R={args.num_requests or default_num_requests(lp)}")
    print(f"wrote {args.out}: SGLang {what} ({check}); use it with "
          f"--speculative-dspark-sps-table-path {args.out}")
    if args.format == "additive":
        gap, at = lp.model.row_correction_extent()
        if gap > 0.01:
            print(f"note: SGLang's additive format cannot hold this profile's per-row corrections (up to "
                  f"{100 * gap:.1f}% of a step at R={at}); for one load, --format cost --num-requests R is exact")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    from dspark_controller.core.profile_file import EngineFingerprint, save_profile
    from dspark_controller.profiling.tools import ProfileToolError, import_table

    try:
        fp = EngineFingerprint(target_model=args.target_model, draft_model=args.draft_model or "", gamma=args.gamma,
                               device_name=args.device_name, tp_size=args.tp_size, dtype=args.dtype or "",
                               attention_backend=args.attention_backend or "", sglang_version=args.sglang_version or "")
    except Exception as exc:
        raise _usage(f"invalid fingerprint: {str(exc).splitlines()[0]}") from None
    try:
        pf = import_table(args.table, fingerprint=fp, command=_command_line(args._argv))
    except ProfileToolError as exc:
        raise _usage(str(exc)) from None
    save_profile(args.out, pf)
    print(f"wrote {args.out}: profile {pf.profile_key} whose curve is the table {args.table} (a prior: no measured "
          "samples; the controller refines it with live telemetry)")
    return EXIT_OK


# ------------------------------------------------------------------ parser
def add_subcommands(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure a profile: actively (--url) or from a controller's telemetry",
                       description="Active: sweep concurrency x verify-budget fraction on a running SGLang DSPARK "
                                   "server (launched with SGLANG_DSPARK_ENABLE_SPS_RECORD=1 and "
                                   "SGLANG_RAGGED_VERIFY_MODE=compact) until the estimates are stable. Passive: "
                                   "turn what a running controller learned into a profile file.")
    src = p.add_argument_group("source (exactly one)").add_mutually_exclusive_group()
    src.add_argument("--url", help="active: a running SGLang server, e.g. http://127.0.0.1:30000")
    src.add_argument("--launch", metavar="CMD",
                     help="active: start this server command (with SGLANG_DSPARK_ENABLE_SPS_RECORD=1 and "
                          "SGLANG_RAGGED_VERIFY_MODE=compact unless set), profile it at the port it serves on, "
                          "stop it; e.g. \"python -m sglang.launch_server --model-path ... "
                          "--speculative-algorithm DSPARK ...\"")
    src.add_argument("--from-controller", metavar="ADDR",
                     help="passive: the controller's CLI endpoint, e.g. tcp://127.0.0.1:7152")
    p.add_argument("-o", "--out", required=True, help="profile file to write (JSON)")
    g = p.add_argument_group("active profiling")
    g.add_argument("--concurrency", help="running-request counts to sweep, e.g. 1,2,4,8,16 "
                                         "(default: powers of two up to the server's max running requests)")
    g.add_argument("--fractions", help="verify-budget fractions K/(R*gamma), e.g. 1,0.75,0.5,0.25,0 (default)")
    g.add_argument("--precision", type=float, default=0.05,
                   help="stop when every cell's relative standard error and the fit's change between passes "
                        "are below this (default: %(default)s)")
    g.add_argument("--max-time", type=float, default=600.0, help="seconds; stop there (default: %(default)s)")
    g.add_argument("--min-passes", type=int, default=2)
    g.add_argument("--max-passes", type=int, default=8)
    g.add_argument("--steps-per-round", type=int, default=12, help="decode steps at R per round (default: 12)")
    g.add_argument("--warmup-steps", type=int, default=2, help="timed steps dropped at the start of each round")
    g.add_argument("--round-timeout", type=float, default=120.0, help="seconds per round before aborting it")
    g.add_argument("--restart-wait", type=float, default=300.0,
                   help="seconds to wait for a server that went away before giving up (default: %(default)s)")
    g.add_argument("--max-retries", type=int, default=3, help="retries of a failed round (default: %(default)s)")
    g.add_argument("--heldout", type=float, default=0.1, help="share of steps kept out of the fit to measure its "
                                                              "error (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device-name", help="device name for the fingerprint (default: derived; needed for remote GPUs)")
    g.add_argument("--time-field", default="step_cpu_ms", choices=("step_cpu_ms", "step_gpu_ms"),
                   help="which per-step time of SGLang's records to use (default: %(default)s)")
    g.add_argument("--keep-records", action="store_true",
                   help="do not clear SGLang's step records before each round (by default they are cleared: "
                        "/server_info stays small, so polling it does not slow the steps being measured)")
    g.add_argument("--checkpoint", help="checkpoint file (default: OUT.partial.json)")
    g.add_argument("--resume", action="store_true", help="continue an interrupted run from its checkpoint")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    pg = p.add_argument_group("passive profiling")
    pg.add_argument("--profile-key", help="which of the controller's profiles (default: the only one with data)")
    pg.add_argument("--min-samples", type=int, default=0, help="refuse profiles with fewer learned samples")
    pg.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the controller")
    pg.add_argument("--curve-server-key", help="controller public key (Z85 or .key file) for CurveZMQ")
    pg.add_argument("--curve-client-cert", help="this client's .key_secret certificate for CurveZMQ")
    p.set_defaults(func=_guard(cmd_profile))

    s = sub.add_parser("show", help="a profile (or SGLang table) as tables, and a PNG with --png")
    s.add_argument("file")
    s.add_argument("--png", help="write the picture here")
    s.add_argument("--confidence", default="0.6,0.8,0.9",
                   help="per-position draft confidences for the budget table/plot (default: %(default)s)")
    s.add_argument("--levels", help="request counts to show budgets for (default: those with data)")
    s.add_argument("--max-rows", type=int, default=60)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_guard(cmd_show))

    d = sub.add_parser("diff", help="compare two profiles (per-bin relative step-time difference)")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--levels", help="request counts to compare at (default: those with data)")
    d.add_argument("--png", help="write a comparison picture here")
    d.add_argument("--json", action="store_true")
    d.add_argument("--fail-above", type=float, help="exit 1 if the max |relative difference| exceeds this")
    d.set_defaults(func=_guard(cmd_diff))

    v = sub.add_parser("validate", help="check profile files (or SGLang tables)",
                       description="Exit 1 when a file is INVALID (unreadable, inconsistent, or predicting "
                                   "non-positive or falling step times). Warnings (held-out error above "
                                   "--max-error, a measurement that did not converge, no held-out error, no "
                                   "provenance) are printed always and fail only with --strict.")
    v.add_argument("files", nargs="+")
    v.add_argument("--strict", action="store_true",
                   help="exit 1 on warnings too: use in CI before shipping a profile")
    v.add_argument("--max-error", type=float, default=STRICT_MAX_HELDOUT_ERROR,
                   help="largest acceptable held-out step-time error, a fraction (default: %(default)s = 25%%)")
    v.set_defaults(func=_guard(cmd_validate))

    sc = sub.add_parser("schema", help="the JSON Schema of profile files")
    sc.add_argument("-o", "--out", help=f"write it here (the repository keeps it in {DEFAULT_SCHEMA_PATH})")
    sc.add_argument("--check", metavar="FILE", help="exit 1 if FILE differs from the current schema")
    sc.set_defaults(func=_guard(cmd_schema))

    e = sub.add_parser("export", help="write a profile as an SGLang SpsCostTable or SpsAdditiveCostTable")
    e.add_argument("file")
    e.add_argument("--format", choices=("cost", "additive"), default="additive",
                   help="additive: every R and B (default); cost: the 1-D curve at --num-requests")
    e.add_argument("--num-requests", type=int, help="cost: R the curve is for (default: the largest R measured)")
    e.add_argument("--b-min", type=int)
    e.add_argument("--b-max", type=int, help="cost: last B (default: R * (gamma + 1))")
    e.add_argument("-o", "--out", required=True, help="output JSON ('-' for stdout)")
    e.set_defaults(func=_guard(cmd_export))

    im = sub.add_parser("import", help="turn an SGLang SPS table into a profile file (as a prior)")
    im.add_argument("table")
    im.add_argument("-o", "--out", required=True)
    im.add_argument("--target-model", default="unknown")
    im.add_argument("--draft-model", default="")
    im.add_argument("--gamma", type=int, default=7)
    im.add_argument("--device-name", default="unknown")
    im.add_argument("--tp-size", type=int, default=1)
    im.add_argument("--dtype")
    im.add_argument("--attention-backend")
    im.add_argument("--sglang-version")
    im.set_defaults(func=_guard(cmd_import))
