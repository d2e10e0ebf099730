"""``dspark-controller`` command line: serve | status | set | plan, and the profile commands
(profile | show | diff | validate | schema | export | import, in :mod:`.profile_cli`).

Exit codes: 0 success, 1 the controller did not answer or refused, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from dspark_controller import __version__
from dspark_controller.service.endpoints import DEFAULT_BASE, ConfigError, Endpoints

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


# ------------------------------------------------------------------ helpers
def _policy_from_args(mode: str, args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from dspark_controller.service.protocol import PolicySpec

    floor = getattr(args, "floor", None)
    frac = getattr(args, "frac", None)
    mx = getattr(args, "max", None)
    extras = {"sla": ("--floor", floor), "fixed": ("--frac", frac), "cap": ("--max", mx)}
    for m, (flag, val) in extras.items():
        if m != mode and val is not None:
            raise UsageError(f"{flag} only applies to policy '{m}', not '{mode}'")
    try:
        return PolicySpec(mode=mode, floor_tok_s=floor, frac=frac, max_tokens=mx,
                          explore_prob=getattr(args, "explore", None) or 0.0)
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = str(first.get("msg", ""))
        raise UsageError(f"invalid policy: {msg.removeprefix('Value error, ')}") from None


def _curve_client_opts(args: argparse.Namespace) -> tuple[Optional[bytes], Optional[tuple[bytes, bytes]]]:
    from dspark_controller.service.endpoints import curve_client_options

    try:
        return curve_client_options(getattr(args, "curve_server_key", None),
                                    getattr(args, "curve_client_cert", None))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _check_connect(args: argparse.Namespace) -> None:
    """``--connect`` must be a ZeroMQ address (one line and exit 2, not ZeroMQ's traceback)."""
    from dspark_controller.service.endpoints import check_endpoint

    try:
        check_endpoint(args.connect, option="--connect", example=Endpoints.derive(DEFAULT_BASE).cli)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _check_binds(args: argparse.Namespace) -> None:
    """``--bind`` / ``--pub-bind`` / ``--cli-bind`` and the endpoints derived from them."""
    from dspark_controller.service.endpoints import check_endpoint

    try:
        for opt, val in (("--bind", args.bind), ("--pub-bind", args.pub_bind), ("--cli-bind", args.cli_bind)):
            if val is not None:
                check_endpoint(val, option=opt, bind=True)
        eps = Endpoints.derive(args.bind, pub=args.pub_bind, cli=args.cli_bind)
        for opt, given, val in (("--pub-bind", args.pub_bind, eps.pub), ("--cli-bind", args.cli_bind, eps.cli)):
            if given is None:
                check_endpoint(val, option=f"{opt} (derived from --bind)", bind=True)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _request(args: argparse.Namespace, msg: Any) -> Any:
    import zmq

    from dspark_controller.service.protocol import DecodeError, decode_frames, encode

    _check_connect(args)
    server_key, keys = _curve_client_opts(args)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            sock.curve_publickey, sock.curve_secretkey = keys
            sock.curve_serverkey = server_key
        sock.connect(args.connect)
        sock.send_multipart(encode(msg))
        if not sock.poll(int(args.timeout * 1000), zmq.POLLIN):
            print(f"error: no reply from the controller at {args.connect} within {args.timeout:g}s; is "
                  "`dspark-controller serve` running there (the CLI endpoint is the base port + 2)?",
                  file=sys.stderr)
            return None
        frames = sock.recv_multipart()
        try:
            return decode_frames(frames)
        except DecodeError as exc:
            print(f"error: unreadable reply from the controller ({exc}); version mismatch?", file=sys.stderr)
            return None
    finally:
        sock.close(0)
        ctx.term()


def _read_json_arg(value: str, what: str) -> Any:
    if value == "-":
        text = sys.stdin.read()
        src = "stdin"
    elif value.lstrip().startswith(("[", "{")):
        text, src = value, "argument"
    elif Path(value).is_file():
        try:
            text = Path(value).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {what} file {value}: {exc}") from None
        src = value
    else:
        raise UsageError(f"{what}: {value!r} is neither JSON, an existing file, nor '-' (stdin); "
                         "pass e.g. '[[0.9, 0.8], [0.5]]'")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{what} from {src} is not valid JSON ({exc}); expected a list of per-request "
                         "lists such as [[0.9, 0.8], [0.5]]") from None


def _parse_sps_pairs(text: str) -> list[tuple[int, float]]:
    pairs = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        b, sep, s = item.partition(":")
        if not sep:
            raise UsageError(f"--sps item {item!r} is not B:steps_per_sec (e.g. --sps 1:1.0,2:0.5,3:0.45)")
        try:
            pairs.append((int(b), float(s)))
        except ValueError:
            raise UsageError(f"--sps item {item!r}: B must be an integer and steps_per_sec a number") from None
    if not pairs:
        raise UsageError("--sps needs at least one B:steps_per_sec pair")
    return pairs


def _sps_from_profile(path: str, num_requests: int) -> tuple[Callable[[Any], Any], str]:
    from dspark_controller.core.method import sps_from_pairs
    from dspark_controller.core.profile_file import ProfileFile
    from dspark_controller.core.sps_model import SpsModel

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read profile {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object (a DSpark profile or an SGLang SPS table)")
    if "profile_key" in data:
        try:
            pf = ProfileFile.model_validate(data)
            model = SpsModel.from_state(pf.model.model_dump())
        except Exception as exc:
            raise UsageError(f"{path} is not a valid DSpark profile: {str(exc).splitlines()[0]}") from None
        if not model.ready:
            raise UsageError(f"profile {path} has no data yet; let the controller learn first or use --sps")
        return model.sps_function(num_requests), f"profile {pf.profile_key} ({path}) at R={num_requests}"
    if "sample_batch_tokens" in data:
        try:
            pairs = list(zip(data["sample_batch_tokens"], data["sample_steps_per_sec"]))
            return sps_from_pairs(pairs), f"SGLang SpsCostTable {path}"
        except Exception as exc:
            raise UsageError(f"{path}: bad SpsCostTable: {exc}") from None
    if "bias_seconds" in data:
        from dspark_controller.core.sps_model import PriorCurve
        import numpy as np

        try:
            pc = PriorCurve.from_sglang_table(data)
        except ValueError as exc:
            raise UsageError(f"{path}: {exc}") from None
        return (lambda b: 1.0 / pc.step_time(np.full(np.shape(b), num_requests), b)), \
            f"SGLang SpsAdditiveCostTable {path} at R={num_requests}"
    raise UsageError(f"{path}: not a DSpark profile, SpsCostTable or SpsAdditiveCostTable")


# ------------------------------------------------------------------ commands
def cmd_plan(args: argparse.Namespace) -> int:
    from dspark_controller.core.method import PlanError, plan, sps_from_pairs

    confidences = _read_json_arg(args.confidences, "confidences")
    if not isinstance(confidences, list):
        raise UsageError("confidences must be a JSON list with one list per request, e.g. [[0.9, 0.8], [0.5]]")
    if (args.sps is None) == (args.profile is None):
        raise UsageError("give the SPS curve with exactly one of --sps B:steps_per_sec,... or --profile FILE")
    if args.sps is not None:
        try:
            sps = sps_from_pairs(_parse_sps_pairs(args.sps))
        except PlanError as exc:
            raise UsageError(f"--sps: {exc}") from None
        source = f"--sps {args.sps}"
    else:
        sps, source = _sps_from_profile(args.profile, max(1, len(confidences)))
    policy = _policy_from_args(args.policy, args)
    lagged = None
    if args.lagged_confidences is not None:
        lagged = _read_json_arg(args.lagged_confidences, "lagged confidences")
    if args.algorithm == "lagged" and lagged is None and args.budget is None:
        lagged = confidences   # steady-state illustration: old confidences == these
    if args.algorithm == "exact" and (args.lagged_confidences is not None or args.budget is not None):
        raise UsageError("--lagged-confidences/--budget only apply to --algorithm lagged")
    try:
        if policy.mode == "no_draft":
            if args.lagged_confidences is not None or args.budget is not None:
                raise UsageError("--lagged-confidences/--budget do not apply to policy no_draft "
                                 "(no drafts are made, so no budget is planned)")
            p = _plan_no_draft(confidences, sps)
        else:
            p = plan(confidences, sps, policy=policy, algorithm=args.algorithm, lagged_confidences=lagged,
                     budget=args.budget, max_trace=args.max_trace)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        out = p.to_dict()
        out["sps_source"] = source
        print(json.dumps(out))
        return EXIT_OK
    print(f"DSpark plan ({p.algorithm}, policy {p.policy}) with SPS from {source}")
    if args.algorithm == "lagged" and args.lagged_confidences is None and args.budget is None \
            and p.policy != "no_draft":
        print("note: no --lagged-confidences given, so the budget uses these same confidences "
              "(what a steady state looks like); a worker uses confidences from two steps earlier")
    for line in p.explanation:
        print("  " + line)
    print(f"lengths: {list(p.lengths)}")
    return EXIT_OK


def _plan_no_draft(confidences: Any, sps: Callable[[Any], Any]) -> Any:
    """Policy no_draft: no draft is made, so none is verified (every length 0). The inputs
    are checked as for any plan; the prediction is the curve's at B = R, a lower bound,
    since a profile's step time includes the draft forward a no-draft step skips."""
    import dataclasses

    from dspark_controller.core.method import plan_fixed_fraction

    p = plan_fixed_fraction(confidences, sps, frac=0.0)    # lengths 0, B = R, tau = R
    R = len(p.lengths)
    expl = ("policy no_draft: no drafts are made, so none is verified: every length is 0 "
            "(plain decoding, one token per request per step, no draft forward)",
            f"R={R}: {R} tokens per step; predicted throughput {p.predicted_throughput:.4g} tok/s is "
            f"R * SPS(B=R), a lower bound: the curve's step time includes the draft forward that a "
            "no-draft step skips")
    return dataclasses.replace(p, algorithm="no_draft", policy="no_draft", explanation=expl)


def cmd_status(args: argparse.Namespace) -> int:
    from dspark_controller.service.protocol import ErrorReply, StatusReply, StatusRequest

    reply = _request(args, StatusRequest())
    if reply is None:
        return EXIT_FAIL
    if isinstance(reply, ErrorReply):
        print(f"error: controller refused: {reply.message}", file=sys.stderr)
        return EXIT_FAIL
    if not isinstance(reply, StatusReply):
        print(f"error: unexpected reply {reply.type!r}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(reply.model_dump_json())
        return EXIT_OK
    c = reply.counters
    print(f"controller {reply.controller_id} up {reply.uptime_s:.0f}s, policy {reply.policy.describe()}"
          + (" (decode without drafting)" if reply.policy.mode == "no_draft" else ""))
    print(f"  endpoints: {reply.endpoints}")
    print(f"  telemetry {c.get('telemetry_steps', 0):.0f} steps ({c.get('telemetry_steps_per_s', 0):.1f}/s), "
          f"decisions {c.get('decisions_published', 0):.0f}, p50 latency "
          f"{1e3 * c.get('decision_latency_p50_s', float('nan')):.3f} ms")
    if reply.dropped:
        print("  dropped: " + ", ".join(f"{k}={v}" for k, v in sorted(reply.dropped.items())))
    print(f"profiles ({len(reply.profiles)}):")
    for p in reply.profiles:
        err = p.heldout_error.mape
        print(f"  {p.profile_key} {p.target_model} on {p.device_name} gamma={p.gamma}: {p.samples_seen} samples, "
              f"{'ready' if p.ready else 'warming up'}, held-out error "
              f"{'n/a' if err is None else f'{100 * err:.1f}%'}, drift x{p.drift_scale:.3f}, "
              f"engines {', '.join(p.engines) or '-'}")
    print(f"engines ({len(reply.engines)}):")
    for e in reply.engines:
        budget = ("no draft" if e.policy == "no_draft" else "verify all" if e.verify_all
                  else ("-" if e.budget_tokens is None else f"K={e.budget_tokens}"))
        print(f"  {e.engine_id} [{e.state}] R={e.num_requests} {budget} policy {e.policy}, {e.steps} steps, "
              f"seen {e.last_seen_s_ago:.1f}s ago")
    return EXIT_OK


def cmd_set(args: argparse.Namespace) -> int:
    from dspark_controller.service.protocol import ErrorReply, SetPolicy, SetPolicyReply

    policy = _policy_from_args(args.mode, args)
    try:
        msg = SetPolicy(policy=policy, engine_id=args.engine)
    except Exception as exc:
        raise UsageError(f"invalid request: {str(exc).splitlines()[0]}") from None
    reply = _request(args, msg)
    if reply is None:
        return EXIT_FAIL
    if isinstance(reply, SetPolicyReply):
        print(reply.message, file=sys.stdout if reply.ok else sys.stderr)
        return EXIT_OK if reply.ok else EXIT_FAIL
    if isinstance(reply, ErrorReply):
        print(f"error: controller refused: {reply.message}", file=sys.stderr)
    return EXIT_FAIL


def cmd_serve(args: argparse.Namespace) -> int:
    from dspark_controller.core.profile_file import default_profiles_dir
    from dspark_controller.service.server import ControllerConfig, serve
    from dspark_controller.core.sps_model import SpsModelConfig

    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _check_binds(args)
    policy = _policy_from_args(args.policy, args)
    try:
        model_cfg = SpsModelConfig(half_life_steps=args.half_life_steps, max_batch_tokens=args.max_batch_tokens,
                                   max_requests=args.max_requests)
        model_cfg.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cfg = ControllerConfig(
        bind=args.bind, pub_bind=args.pub_bind, cli_bind=args.cli_bind,
        profiles_dir=None if args.no_persist else (args.profiles_dir or default_profiles_dir()),
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr, curve_secret_key_file=args.curve_secret_key,
        curve_authorized_dir=args.curve_authorized_dir, policy=policy, heartbeat_s=args.heartbeat_s,
        engine_timeout_s=args.engine_timeout_s, decision_interval_s=args.decision_interval_s,
        decision_refresh_s=args.decision_refresh_s,
        decision_valid_s=args.decision_valid_s, profile_publish_s=args.profile_publish_s,
        persist_interval_s=args.persist_interval_s, model=model_cfg, prior_file=args.prior,
        max_learn_steps_per_s=args.max_learn_rate,
        command=" ".join([Path(sys.argv[0]).name] + sys.argv[1:])[:4096])
    try:
        return serve(cfg)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


# ------------------------------------------------------------------ parser
def _add_connect(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect", default=Endpoints.derive(DEFAULT_BASE).cli,
                   help="the controller's CLI endpoint (default: %(default)s, i.e. base port + 2)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the reply")
    p.add_argument("--curve-server-key", help="controller public key (Z85 or .key file) for CurveZMQ")
    p.add_argument("--curve-client-cert", help="this client's .key_secret certificate for CurveZMQ")


def _add_policy_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--floor", type=float, help="sla: per-user tokens/s floor")
    p.add_argument("--frac", type=float, help="fixed: fraction of draft tokens to verify, in [0, 1]")
    p.add_argument("--max", type=int, help="cap: max draft tokens per step")


# core.method.PlanPolicy.MODES (kept literal here so the parser does not import numpy).
# off = verify every draft token (scheduling off; the name is historical);
# no_draft = no drafting at all (plain decoding)
POLICIES = ("throughput", "sla", "fixed", "cap", "off", "no_draft")
POLICY_HELP = ("throughput: max expected tokens/s; sla: keep --floor tok/s per user; fixed: verify --frac of "
               "the draft tokens; cap: throughput with at most --max draft tokens; off: verify every draft "
               "token (scheduling off, drafting on); no_draft: decode without drafting (plain decoding)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dspark-controller",
                                 description="DSpark budget controller: learns SPS profiles from worker telemetry "
                                             "and broadcasts verify budgets.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the controller")
    s.add_argument("--bind", default=DEFAULT_BASE, help="worker endpoint; publisher and CLI derive from it "
                                                        "(tcp port+1/+2, ipc path.pub/.cli) (default: %(default)s)")
    s.add_argument("--pub-bind", help="publisher endpoint override")
    s.add_argument("--cli-bind", help="CLI endpoint override")
    s.add_argument("--profiles-dir",
                   help="where profiles load from and persist (default: a per-user state folder, "
                        "$XDG_STATE_HOME/sglang-dspark/profiles, else ~/.local/state/sglang-dspark/profiles; "
                        "never the working directory). Files in it that are not profiles are ignored")
    s.add_argument("--no-persist", action="store_true", help="do not load or save profiles")
    s.add_argument("--prior", help="prior for new profiles: a DSpark profile file or an SGLang SPS table JSON")
    s.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    s.add_argument("--metrics-addr", default="127.0.0.1", help="metrics bind address (default: %(default)s)")
    s.add_argument("--curve-secret-key", help="controller .key_secret certificate (enables CurveZMQ)")
    s.add_argument("--curve-authorized-dir", help="directory of authorised client public .key files")
    s.add_argument("--policy", choices=POLICIES, default="throughput", help=POLICY_HELP)
    _add_policy_opts(s)
    s.add_argument("--explore", type=float, help="fraction of steps with a random budget (profile exploration)")
    s.add_argument("--heartbeat-s", type=float, default=1.0)
    s.add_argument("--engine-timeout-s", type=float, default=10.0)
    s.add_argument("--decision-interval-s", type=float, default=0.1,
                   help="min seconds between decisions per engine (after its request count changed)")
    s.add_argument("--decision-refresh-s", type=float, default=0.5,
                   help="min seconds between decisions per engine while its request count stays the same")
    s.add_argument("--decision-valid-s", type=float, default=5.0)
    s.add_argument("--profile-publish-s", type=float, default=1.0)
    s.add_argument("--persist-interval-s", type=float, default=10.0)
    s.add_argument("--half-life-steps", type=float, default=2000.0, help="profile memory half-life in steps")
    s.add_argument("--max-batch-tokens", type=int, default=8192)
    s.add_argument("--max-requests", type=int, default=1024)
    s.add_argument("--max-learn-rate", type=float, default=5000.0,
                   help="steps/s per profile fed to the model (the rest only update counters); 0 = all")
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=cmd_serve)

    st = sub.add_parser("status", help="show engines, profiles and counters")
    _add_connect(st)
    st.add_argument("--json", action="store_true", help="print the raw status reply as JSON")
    st.set_defaults(func=cmd_status)

    se = sub.add_parser("set", help="change the policy at runtime")
    se.add_argument("mode", choices=POLICIES, help=POLICY_HELP)
    _add_policy_opts(se)
    se.add_argument("--explore", type=float, help="fraction of steps with a random budget")
    se.add_argument("--engine", help="only this engine (default: all engines)")
    _add_connect(se)
    se.set_defaults(func=cmd_set)

    pl = sub.add_parser("plan", help="plan verify lengths for given confidences (offline, no controller)")
    pl.add_argument("confidences", help="JSON list of per-request confidence lists, a file, or '-' for stdin")
    pl.add_argument("--sps", help="inline curve B:steps_per_sec,... (floor lookup), e.g. 1:1.0,2:0.5,3:0.45")
    pl.add_argument("--profile", help="a DSpark profile file or an SGLang SPS table JSON")
    pl.add_argument("--algorithm", choices=("exact", "lagged"), default="exact")
    pl.add_argument("--policy", choices=POLICIES, default="throughput", help=POLICY_HELP)
    _add_policy_opts(pl)
    pl.add_argument("--lagged-confidences", help="lagged: confidences from two steps earlier (JSON/file/'-')")
    pl.add_argument("--budget", type=int, help="lagged: a precomputed draft-token budget K")
    pl.add_argument("--max-trace", type=int, default=24, help="admissions listed in the explanation")
    pl.add_argument("--json", action="store_true", help="print one JSON object")
    pl.set_defaults(func=cmd_plan)

    from dspark_controller.profiling.cli import add_subcommands

    add_subcommands(sub)

    from dspark_controller.sim.simulate import add_subcommand as add_simulate

    add_simulate(sub)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args._argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"dspark-controller {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        print(f"dspark-controller {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
