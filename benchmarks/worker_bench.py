"""Side-by-side serving benchmark on this machine (ratios, one run).

    python benchmarks/worker_bench.py [--json benchmarks/results/worker_bench.json] \
        [--png docs/img/worker_bench.png]

Serves the ``bench`` tiny pair (hidden 768, so step time grows with verify tokens even
on a CPU; built locally) and measures output tokens/s, tokens/s per user and SGLang's
accept length at each concurrency level (closed loop, greedy, ``ignore_eos``):

  nospec      no speculation
  verify_all  DSPARK as SGLang ships it with no table: static mode, every draft verified
  upstream    DSPARK compact + the SpsAdditiveCostTable that SGLang's own
              ``dspark_sps_profiler`` made for this pair (benchmarks/upstream_table.py);
              our online planning off (SGLANG_DSPARK_ONLINE=0) and SGLang's own
              sequential head: SGLang's planner and behaviour
  online      ours: DSPARK compact, NO table, NO controller (the local online profile)
              (every DSPARK config runs SGLang's own sequential head, so rows differ only
              in how the verify budget is chosen)
  fixed@f     the ``online`` server with the verify budget pinned at fraction f of all
              draft tokens (SGLang's dspark_force_budget_frac; lifted again with our
              ``dspark_unpin_budget`` key); the best of these is the "best fixed budget"
              at each level, and fixed@1 (every draft verified, on SGLang's uniform path:
              the static server's path) is verify-all on the online server
  controller  ours: DSPARK compact, NO table, our controller process (throughput policy)
  online_static / online_ragged  (ablations, not in the default set) ``online`` with
              SGLANG_DSPARK_FULL_BUDGET_STATIC=1 / 0
  online_draft  (ablation, not in the default set) ``online`` with SGLANG_DSPARK_NO_DRAFT=0:
              every decode step drafts (no no-draft steps; the worker before they existed)
  online_off  (ablation, not in the default set) ``online`` with drafting pinned off
              (``dspark_draft`` 0: every decode step is a no-draft step): over ``nospec``,
              what a no-draft step costs against a plain decode step
  X~ref       reference chunk of compact server X: the budget pinned at REF_FRAC (0.5);
              the online server's is fixed@0.5

Design (this machine is noisy: a pass run minutes later differs by 10-25%, and two server
processes doing the same work differ by up to ~9% for a whole run): every server is started
once and warmed alone with ``--warm-waves`` ramps (one wave at each level; the online
configurations learn during it, as they would in production); then ``--rounds`` rounds each
visit every server at every level, the servers in alternating order, while the servers not
being measured are stopped (SIGSTOP: an idle SGLang scheduler polls and would take a core).
A visit measures the server's own policy and its pinned chunks (the fixed sweep on the
online server, a reference chunk on the other compact servers), in alternating order.
Every chunk at a level serves the same prompts, so all chunks produce the same greedy
tokens and differ only in how the verify budget was chosen.  Pinned chunks teach no
profile (SGLANG_DSPARK_LEARN_FORCED=0): the online policy learns only from its own steps.

``--levels`` is the order in which a round visits the levels, repeats allowed: ``--levels
1,4,16,32,16,4`` makes each round a ramp up and down (the next round starts at 1 again), so
the online servers adapt to a load that rises and falls; results are pooled per level.

Ratios (``compare``): ours vs the fixed sweep (best fixed budget, verify-all = fixed@1) is a
same-server ratio; ours vs upstream / the controller divides each server by its own
reference chunk (same budget, same prompts), which removes the per-server offset; the
static verify-all server and no speculation have no reference and are reported raw.  At
the end the script prints the tables (wall-time ratios, and output tokens per CPU second
of each server's processes, which leaves out time the VM's other tenants took), checks the
targets of issue 4 (ours >= verify-all and >= upstream at every level, within 2% of the best fixed budget, host overhead per step
within 2% of a step of upstream's planner) and writes JSON and a PNG.  Absolute numbers are
CPU numbers and say nothing about a GPU; only the ratios in one run mean anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sglang_dspark.server_process import SGLangServer, free_port, http_json  # noqa: E402
from sglang_dspark.tiny_models import PRESETS, ensure_pair  # noqa: E402

BENCH_SPEC = PRESETS["bench"]
PAIRS = ("bench", "deep", "deep-weak")     # presets with the same gamma (cap_tokens reads BENCH_SPEC's)
FIXED_FRACS = (1.0, 0.75, 0.5, 0.25)
REF_FRAC = 0.5      # every compact server's reference chunk: this fraction pinned
OURS = ("online", "controller", "online_static", "online_ragged")
COMPACT = ("upstream", "online", "controller", "online_static", "online_ragged", "online_draft")


def cap_tokens(mi: dict, compact: bool = True, gamma: int | None = None) -> float | None:
    """Tokens a request had verified over its rounds, anchor included, or None when SGLang
    reported no cap lengths (static / verify-all servers, no speculation).

    SGLang adds a round's cap length (and a histogram entry) only on ragged steps; a round
    on the uniform full-budget path (docs/worker.md) counts in ``spec_verify_ct`` but adds
    no cap, so ``spec_cap_length`` alone under-counts a server that mixes both (it read
    below zero drafts per round).  Rounds missing from the histogram verified all
    ``gamma`` drafts plus the anchor; on a ``compact`` server a request with no cap at all
    ran every round on that path."""
    gamma = BENCH_SPEC.block_size if gamma is None else gamma
    vct = mi.get("spec_verify_ct") or 0
    hist = mi.get("spec_cap_lens_histogram")
    if hist:
        ragged = sum(hist)
        return sum(k * n for k, n in enumerate(hist)) + max(vct - ragged, 0) * (gamma + 1)
    cap = mi.get("spec_cap_length")
    if cap is None:
        return vct * (gamma + 1) if compact and vct else None
    return cap * vct


def run_level(url: str, concurrency: int, n_requests: int, max_new: int, tag: str = "",
              compact: bool = False) -> dict:
    prompts = [f"def {tag}task_{i}(data):" for i in range(n_requests)]

    def one(p):
        t0 = time.perf_counter()
        r = http_json(url + "/generate", {"text": p, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=900)
        mi = r["meta_info"]
        return (mi["completion_tokens"], time.perf_counter() - t0, mi.get("spec_verify_ct"),
                cap_tokens(mi, compact))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        res = list(ex.map(one, prompts))
    wall = time.perf_counter() - t0
    tokens = sum(x[0] for x in res)
    verify = [x[2] for x in res if x[2]]
    out = {"tok_s": tokens / wall, "tok_s_per_user": sum(x[0] / x[1] for x in res) / len(res),
           "tokens": tokens, "requests": len(res), "wall_s": wall}
    if verify:  # SGLang's accept length: output tokens per verify round (incl. the bonus token)
        out["accept_len"] = sum(x[0] for x in res if x[2]) / sum(verify)
        caps = [x for x in res if x[2] and x[3] is not None]
        if caps:  # draft tokens verified per request per round (the realised budget)
            out["verified_per_round"] = sum(x[3] for x in caps) / sum(x[2] for x in caps) - 1.0
    return out


def plugin_state(srv: SGLangServer) -> dict:
    try:
        st = srv.server_info()["internal_states"][0]["dspark_info_record"]
        return st.get("sglang_dspark", {}) or {}
    except Exception:  # noqa: BLE001 - nospec has no DSpark record
        return {}


def merge(runs: list[dict]) -> dict:
    """The rounds of one (config, level): pooled tokens over pooled wall time, plus the
    per-round figures (paired with the other configs' chunks of the same round)."""
    tokens, wall = sum(r["tokens"] for r in runs), sum(r["wall_s"] for r in runs)
    out = {"tok_s": tokens / wall, "tok_s_per_user": sum(r["tok_s_per_user"] for r in runs) / len(runs),
           "tokens": tokens, "wall_s": wall, "requests": sum(r["requests"] for r in runs),
           "per_round_tok_s": [r["tok_s"] for r in runs],
           "per_round_accept_len": [r.get("accept_len") for r in runs]}
    if all(r.get("cpu_s") for r in runs):   # output tokens per CPU second of the server
        out["tok_per_cpu_s"] = tokens / sum(r["cpu_s"] for r in runs)
        out["per_round_tok_per_cpu_s"] = [r["tokens"] / r["cpu_s"] for r in runs]
    for k in ("accept_len", "verified_per_round"):
        vals = [r[k] for r in runs if r.get(k) is not None]
        if vals:
            out[k] = sum(vals) / len(vals)
    if any("sources" in r for r in runs):
        out["sources"] = dict(sum((Counter(r.get("sources") or {}) for r in runs), Counter()))
    return out


def requests_for(level: int, target_tokens: int, max_new: int) -> int:
    """Whole waves of ``level`` requests, about ``target_tokens`` output tokens (at least one wave)."""
    return level * max(1, math.ceil(target_tokens / (max_new * level)))


def _sources(srv: SGLangServer) -> Counter:
    """Counters of the server's own policy: steps per budget source, boundary checks, and
    the no-draft gate's steps (``nd:drafted`` / ``nd:no_draft`` / ``nd:redraft``) and
    switches (``nd:switch_off`` / ``nd:switch_on``: the on/off transitions)."""
    st = plugin_state(srv)
    c = Counter(st.get("budget_sources") or {})
    c["boundary_checks"] = int(st.get("boundary_checks") or 0)
    gate = (st.get("no_draft") or {}).get("gate") or {}
    for k, v in (gate.get("steps") or {}).items():
        c[f"nd:{k}"] = int(v)
    for k, v in (gate.get("switches") or {}).items():
        c[f"nd:switch_{k}"] = int(v)
    return c


def no_draft_share(sources: dict) -> dict | None:
    """Share of an online server's decode steps that ran no draft, and its on/off
    transitions, from a chunk's (or pooled chunks') ``sources`` counters."""
    steps = {k: int(sources.get(f"nd:{k}", 0)) for k in ("drafted", "no_draft", "redraft")}
    total = sum(steps.values())
    if not total:
        return None
    return {"share": steps["no_draft"] / total, "steps": total,
            "switches_off": int(sources.get("nd:switch_off", 0)),
            "switches_on": int(sources.get("nd:switch_on", 0))}


def run_chunk(srv: SGLangServer, name: str, lv: int, args, raw: dict, policy: str) -> None:
    """One measured chunk.  Every chunk at a level serves the same prompts (greedy, so the
    same output tokens): chunks differ only in how the verify budget was chosen.  ``policy``
    is the server's own configuration; ``name`` differs from it for pinned chunks."""
    ours = policy in OURS and name == policy
    before = _sources(srv) if ours else None   # outside the timed part
    cpu0 = server_cpu_s(srv)
    r = run_level(srv.url, lv, requests_for(lv, args.tokens_per_chunk, args.max_new_tokens),
                  args.max_new_tokens, tag=f"c{lv}_", compact=policy in COMPACT)
    cpu1 = server_cpu_s(srv)
    if cpu0 is not None and cpu1 is not None and cpu1 > cpu0:
        r["cpu_s"] = cpu1 - cpu0            # the server's CPU seconds for this chunk
    if ours:   # who chose K during this chunk (steps per source), e.g. how much was exploration
        r["sources"] = dict(_sources(srv) - before)
    raw.setdefault(name, {}).setdefault(lv, []).append(r)
    acc = f"{r['accept_len']:.2f}" if "accept_len" in r else "   -"
    ver = f"{r['verified_per_round']:.2f}" if "verified_per_round" in r else "-"
    print(f"{name:>16} c={lv:<3} {r['tok_s']:8.1f} tok/s {r['tok_s_per_user']:7.1f} tok/s/user  "
          f"accept {acc}  verified drafts/round {ver}"
          + (f"  K from {r['sources']}" if r.get("sources") else ""), flush=True)


def visit_plan(name: str, fracs: list[float], fixed_sweep: bool) -> list[tuple[str, float | None]]:
    """The chunks one visit of server ``name`` measures: (chunk name, pinned fraction or
    None for the server's own policy).  The ``online`` server also runs the fixed sweep;
    every compact server runs a reference chunk pinned at REF_FRAC (the sweep's chunk at
    that fraction serves as the online server's), which lets ratios between two servers
    be divided by each server's own reference: the same budget, the same prompts."""
    if name not in COMPACT:
        return [(name, None)]
    plan = [(name, None)]
    if name == "online" and fixed_sweep:
        plan += [(f"fixed@{f:g}", f) for f in fracs]
    if not any(f == REF_FRAC for _, f in plan):
        plan.append((f"{name}~ref", REF_FRAC))
    return plan


def server_of(chunk: str) -> str:
    """The server a chunk ran on (fixed@f on the online server, X~ref on X)."""
    return "online" if chunk.startswith("fixed@") else chunk.split("~", 1)[0]


def ref_of(server: str, results: dict) -> str | None:
    """The reference chunk of a server, if it ran one."""
    for c in (f"{server}~ref", f"fixed@{REF_FRAC:g}" if server == "online" else None):
        if c and c in results:
            return c
    return None


def server_cpu_s(srv: SGLangServer) -> float | None:
    """CPU seconds (user + system) every process of a server has used so far: the server
    runs in its own session, so its process group is its launcher's pid (None: unknown).
    Unlike wall time, CPU seconds leave out time the VM's other tenants took."""
    if srv.proc is None:
        return None
    stats = (_proc_stat(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
    group = [f for f in stats if f is not None and int(f[2]) == srv.proc.pid]
    return sum(_cpu_s(f) for f in group) if group else None


def _proc_stat(pid) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 12 else None


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (Linux /proc), or None."""
    fields = _proc_stat(pid)
    return None if fields is None else _cpu_s(fields)


def warm(srv: SGLangServer, levels: list[int], max_new: int, waves: int) -> None:
    for _ in range(waves):
        for lv in levels:
            run_level(srv.url, lv, lv, max_new, tag="warm_")


def pin_fraction(srv: SGLangServer, f: float | None) -> None:
    """Pin the verify budget at fraction f of all draft tokens (SGLang's knob), or lift the
    pin (None: our ``dspark_unpin_budget`` key, sglang_dspark/internal_state.py)."""
    args = {"dspark_unpin_budget": 1} if f is None else {"dspark_force_budget_frac": f}
    if not srv.set_internal_state(args):
        raise SystemExit(f"server refused /set_internal_state {args} (see {srv.log_path})")


def start_controller(work: Path) -> tuple[subprocess.Popen, str]:
    """Our controller process (no persistence, sockets under ``work``) and its address."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "dspark_controller", "serve", "--bind", addr,
                             "--no-persist", "--cli-bind", f"ipc://{work}/cli", "--pub-bind",
                             f"ipc://{work}/pub"], stdout=subprocess.DEVNULL,
                            stderr=open(work / "controller.log", "w"))
    return proc, addr


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def prepare(models: str, table: str, *, need_table: bool, max_batch: int, prefix: str,
            pair: str = "bench") -> tuple[Path, Path, Path]:
    """(model pair folder, scratch folder, SGLang table): builds the ``pair`` preset if
    missing and, when ``need_table``, runs SGLang's profiler for the table if it is missing."""
    m = Path(models)
    ensure_pair(m, PRESETS[pair])
    work = Path(tempfile.mkdtemp(prefix=prefix))
    table_path = Path(table)
    if need_table and not table_path.is_file():
        from upstream_table import make_table

        print(f"[bench] {table_path} missing: running SGLang's dspark_sps_profiler (several minutes)", flush=True)
        make_table(models=m, out=table_path, max_batch=max_batch, log_dir=work, pair=pair)
    return m, work, table_path


def write_outputs(report: dict, json_path: str, png_path: str, plot_fn) -> None:
    """The report as JSON at ``json_path`` and ``plot_fn``'s PNG at ``png_path`` (each if given)."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if png_path:
        plot_fn(report, Path(png_path))


def server_for(name: str, m: Path, table: Path, work: Path, maxrun: list[str]):
    """(server, controller process or None) for one configuration, not started."""
    # one sequential-head implementation for every DSPARK config (SGLang's), so the
    # rows differ only in how the verify budget is chosen
    env = {"SGLANG_DSPARK_LOG_INTERVAL_S": "0", "SGLANG_DSPARK_FUSED_SEQ_HEAD": "upstream"}
    draft = str(m / "draft")
    extra = list(maxrun)
    ctrl = None
    if name == "nospec":
        draft = None
    elif name == "verify_all":
        env["SGLANG_RAGGED_VERIFY_MODE"] = "static"
    elif name == "upstream":
        env.update(SGLANG_RAGGED_VERIFY_MODE="compact", SGLANG_DSPARK_ONLINE="0")
        extra += ["--speculative-dspark-sps-table-path", str(table)]
    elif name == "online":
        env["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
    elif name == "online_off":      # ablation: every step a no-draft step (pinned after start)
        env["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
    elif name == "online_draft":    # ablation: every step drafts
        env.update(SGLANG_RAGGED_VERIFY_MODE="compact", SGLANG_DSPARK_NO_DRAFT="0")
    elif name in ("online_static", "online_ragged"):  # ablations: full-budget steps static / ragged
        env.update(SGLANG_RAGGED_VERIFY_MODE="compact",
                   SGLANG_DSPARK_FULL_BUDGET_STATIC="1" if name == "online_static" else "0")
    elif name == "controller":
        ctrl, addr = start_controller(work)
        env.update(SGLANG_RAGGED_VERIFY_MODE="compact", SGLANG_DSPARK_CONTROLLER=addr)
    if name in COMPACT:   # pinned chunks (fixed sweep, references) teach no profile
        env["SGLANG_DSPARK_LEARN_FORCED"] = "0"
    srv = SGLangServer(model_path=str(m / "target"), draft_path=draft, env=env, extra_args=extra,
                       log_path=work / f"server-{name}.log")
    return srv, ctrl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="bench", choices=PAIRS,
                    help="tiny pair preset: bench (4 target layers), deep (12 layers of the same "
                         "width, a larger target) or deep-weak (deep's target, a drafter with more "
                         "wrong rows); SGLang's profiler made the 12-layer target's table for "
                         "'upstream' in 7.5 min on one 2-core host and timed out at 32 requests on another")
    ap.add_argument("--models", default="", help="pair folder (default artifacts/<pair>)")
    ap.add_argument("--levels", default="1,4,16,32",
                    help="concurrency levels in the order each round visits them; a level may repeat "
                         "(a ramp: 1,4,16,32,16,4 visits 1 -> 32 -> 1 across rounds), results are per level")
    ap.add_argument("--tokens-per-chunk", type=int, default=256,
                    help="output tokens per measured chunk (whole waves, at least one)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--configs", default="nospec,verify_all,upstream,online,fixed,controller")
    ap.add_argument("--table", default="",
                    help="SGLang SPS table for 'upstream' (default benchmarks/results/<pair>-upstream-sps-table.json; "
                         "made by benchmarks/upstream_table.py if missing)")
    ap.add_argument("--rounds", type=int, default=6,
                    help="rounds; each measures one chunk of every (config, level), in alternating order")
    ap.add_argument("--warm-waves", type=int, default=3,
                    help="warm-up ramps (one wave at each level) per server before measuring")
    ap.add_argument("--fixed-fracs", default=",".join(f"{f:g}" for f in FIXED_FRACS),
                    help="budget fractions the 'online' server is pinned at, one chunk each ('fixed')")
    ap.add_argument("--json", default="")
    ap.add_argument("--png", default="")
    args = ap.parse_args(argv)
    try:
        visits = [int(x) for x in args.levels.split(",")]
    except ValueError:
        raise SystemExit(f"--levels must be comma-separated integers, got {args.levels!r}") from None
    if not visits or min(visits) < 1:
        raise SystemExit("--levels must be concurrency levels >= 1")
    levels = sorted(set(visits))     # reported per level; ``visits`` is the order of a round
    try:
        fracs = [float(x) for x in args.fixed_fracs.split(",")]
    except ValueError:
        raise SystemExit(f"--fixed-fracs must be comma-separated numbers, got {args.fixed_fracs!r}") from None
    if not fracs or any(not 0.0 <= f <= 1.0 for f in fracs):
        raise SystemExit("--fixed-fracs must be fractions in [0, 1]")
    configs = args.configs.split(",")
    unknown = set(configs) - {"nospec", "verify_all", "upstream", "online", "online_static", "online_ragged",
                          "online_draft", "online_off", "fixed", "controller"}
    if unknown:
        raise SystemExit(f"unknown configs {sorted(unknown)}")
    if "fixed" in configs and "online" not in configs:
        raise SystemExit("'fixed' runs on the 'online' server: add 'online' to --configs")
    servers_to_start = [c for c in configs if c != "fixed"]
    if args.rounds < 1 or args.warm_waves < 0 or args.tokens_per_chunk < 1:
        raise SystemExit("--rounds and --tokens-per-chunk must be >= 1, --warm-waves >= 0")
    models = args.models or str(HERE.parent / "artifacts" / args.pair)
    table_arg = args.table or str(HERE / "results" / f"{args.pair}-upstream-sps-table.json")
    m, work, table = prepare(models, table_arg, need_table="upstream" in configs, max_batch=max(levels),
                             prefix="dspark-bench-", pair=args.pair)
    maxrun = ["--max-running-requests", str(max(levels))]
    meta = {"command": "python benchmarks/worker_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M"), "host": platform.node(), "cpus": os.cpu_count(),
            "pair": args.pair, "levels": levels, "visits": visits, "max_new_tokens": args.max_new_tokens, "tokens_per_chunk": args.tokens_per_chunk,
            "rounds": args.rounds, "warm_waves": args.warm_waves, "design": "interleaved+references",
            "ref_frac": REF_FRAC,
            "table": str(table), "load_avg_start": os.getloadavg()[0]}
    t_start = time.monotonic()
    servers: dict = {}
    ctrls: list = []
    ctrl_of: dict = {}
    raw: dict = {}
    try:
        for name in servers_to_start:
            print(f"[bench] starting {name}", flush=True)
            srv, ctrl = server_for(name, m, table, work, maxrun)
            if ctrl is not None:
                ctrls.append(ctrl)
                ctrl_of[name] = ctrl
            srv.start()
            if name == "online_off" and not srv.set_internal_state({"dspark_draft": 0}):
                raise SystemExit(f"server refused to pin drafting off (see {srv.log_path})")
            servers[name] = srv
            with srv.running() as s:   # warm alone (the others are stopped), as in production
                warm(s, levels, args.max_new_tokens, args.warm_waves)
        names = list(servers)
        for rnd in range(args.rounds):
            print(f"[bench] round {rnd + 1}/{args.rounds}", flush=True)
            for lv in visits:
                for name in (names if rnd % 2 == 0 else names[::-1]):
                    plan = visit_plan(name, fracs, "fixed" in configs)
                    with servers[name].running() as s:
                        pinned = False
                        for chunk, f in (plan if rnd % 2 == 0 else plan[::-1]):
                            if f is not None:
                                pin_fraction(s, f)
                            elif pinned:
                                pin_fraction(s, None)
                            pinned = f is not None
                            run_chunk(s, chunk, lv, args, raw, policy=name)
                        if pinned:
                            pin_fraction(s, None)
        plugin = {}
        for name, srv in servers.items():
            with srv.running() as s:
                plugin[name] = plugin_state(s)
        for name, ctrl in ctrl_of.items():   # the controller shares these 2 cores with its server
            cpu = process_cpu_s(ctrl.pid)
            steps = (plugin.get(name, {}).get("telemetry") or {}).get("steps")
            if cpu is not None and isinstance(plugin.get(name), dict):
                plugin[name]["controller_process"] = {
                    "cpu_s": round(cpu, 2), "cpu_ms_per_step": round(1e3 * cpu / steps, 3) if steps else None}
    finally:
        for srv in servers.values():
            srv.stop()      # resumes a paused server first
        for ctrl in ctrls:
            stop_process(ctrl)
    meta["load_avg_end"] = os.getloadavg()[0]
    meta["wall_min"] = round((time.monotonic() - t_start) / 60, 1)
    results = {name: {lv: merge(runs) for lv, runs in per.items()} for name, per in raw.items()}
    summary = summarize(results, plugin, levels)
    report = {"meta": meta, "results": results, "plugin": plugin, "summary": summary}
    print_report(report)
    write_outputs(report, args.json, args.png, plot)
    return 0


def _round_stats(r: list[float]) -> dict:
    """Median, min, max and the standard error of the mean of per-round ratios."""
    x = np.array(r, dtype=float)
    if x.size == 0:
        return {}
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None
    return {"n": int(x.size), "median": float(np.median(x)), "min": float(x.min()),
            "max": float(x.max()), "se": se}


def _ref_speed(ref: dict) -> list[float]:
    """A server's speed in each round, from its reference chunk: verify rounds per second
    (output tok/s over accept length).  A pinned fraction fixes K at every step, so the
    step's cost is the same on every server, but which drafts SGLang's top-K admits, and so
    the accept length, moves with how the closed loop's requests happen to batch (2.29 vs
    2.59 in two rounds of one server); rounds per second does not."""
    tok = ref.get("per_round_tok_s") or []
    acc = ref.get("per_round_accept_len") or []
    if len(acc) != len(tok) or any(a is None or a <= 0 for a in acc):
        return list(tok)
    return [t / a for t, a in zip(tok, acc)]


def compare_cpu(results: dict, a: str, b: str, lv) -> dict | None:
    """Chunk ``a`` vs chunk ``b`` in output tokens per CPU second of each server (raw;
    None where a side has no CPU seconds)."""
    A, B = results[a][lv], results[b][lv]
    if not A.get("tok_per_cpu_s") or not B.get("tok_per_cpu_s"):
        return None
    pa, pb = A["per_round_tok_per_cpu_s"], B["per_round_tok_per_cpu_s"]
    per = [x / y for x, y in zip(pa, pb)] if len(pa) == len(pb) else []
    return {"ratio": float(A["tok_per_cpu_s"] / B["tok_per_cpu_s"]), "how": "raw",
            "rounds": _round_stats(per), "per_round": per}


def compare(results: dict, a: str, b: str, lv) -> dict:
    """Chunk ``a`` vs chunk ``b`` at one level, as fairly as the run allows:

    * same server (ours vs the fixed sweep): per-round ratios a_r / b_r;
    * two servers that both ran a reference chunk (the same pinned budget on the same
      prompts): each side divided by its own server's speed in that round's reference
      (:func:`_ref_speed`), (a_r / v_a,r) / (b_r / v_b,r), which removes a per-server speed
      offset (up to ~9% on this VM: docs/benchmarks.md) at the price of the two
      references' noise; the pooled ratio uses the references' mean speeds;
    * otherwise (no speculation, the static verify-all server) the raw ratio, which
      carries that offset.
    ``ratio`` pools tokens over wall time of all rounds, the same way on every side."""
    sa, sb = server_of(a), server_of(b)
    ra, rb = ref_of(sa, results), ref_of(sb, results)
    how = "same server" if sa == sb else ("normalized" if ra and rb else "raw")
    A, B = results[a][lv], results[b][lv]
    pa, pb = A.get("per_round_tok_s") or [], B.get("per_round_tok_s") or []
    ratio = A["tok_s"] / B["tok_s"]
    per = [x / y for x, y in zip(pa, pb)] if len(pa) == len(pb) else []
    if how == "normalized":
        qa, qb = _ref_speed(results[ra][lv]), _ref_speed(results[rb][lv])
        ratio *= float(np.mean(qb)) / float(np.mean(qa))
        per = ([p * y / x for p, x, y in zip(per, qa, qb)]
               if per and len(qa) == len(qb) == len(per) else [])
    return {"ratio": float(ratio), "how": how, "rounds": _round_stats(per), "per_round": per}


def best_fixed_xval(results: dict, fixed: list[str], ours: str, lv) -> dict:
    """Ours vs the best fixed budget, cross-validated: the best is picked on the even rounds
    and compared (paired, per round, as :func:`compare` does) on the odd ones, and the other
    way round.  The plain "best of the sweep" picks, on one run's noise, the luckiest row,
    so it overstates the best fixed budget's throughput (the winner's curse); picking and
    measuring on disjoint rounds does not."""
    n = len(results[ours][lv].get("per_round_tok_s") or [])
    if n < 2 or not fixed or any(len(results[k][lv].get("per_round_tok_s") or []) != n for k in fixed):
        return {}
    halves = (list(range(0, n, 2)), list(range(1, n, 2)))
    ratios, picks = [], []
    for pick_on, test_on in (halves, halves[::-1]):   # the sweep ran on one server: raw is fair
        b = max(fixed, key=lambda k: np.mean([results[k][lv]["per_round_tok_s"][i] for i in pick_on]))
        picks.append(b)
        per = compare(results, ours, b, lv)["per_round"]
        if len(per) != n:
            return {}
        ratios += [per[i] for i in test_on]
    r = np.array(ratios)
    return {"ratio": float(r.mean()), "se": float(r.std(ddof=1) / math.sqrt(r.size)), "picks": picks}


def summarize(results: dict, plugin: dict, levels: list[int]) -> dict:
    s: dict = {"targets": {}, "server_offsets": {}}
    fixed = [k for k in results if k.startswith("fixed@")]
    best = {}
    for lv in levels:
        if fixed:
            b = max(fixed, key=lambda k: results[k][lv]["tok_s"])
            best[lv] = {"config": b, "tok_s": results[b][lv]["tok_s"]}
    s["best_fixed"] = best
    # verify-all on the online server (the fixed sweep's fraction 1: every draft verified on
    # SGLang's uniform path, the static server's path) when the sweep has it, else the
    # static server itself
    va = "fixed@1" if "fixed@1" in results else ("verify_all" if "verify_all" in results else None)
    s["verify_all_chunk"] = va
    for ours in OURS:
        if ours not in results:
            continue
        t = {}
        for lv in levels:
            row = {}
            if va:
                row["vs_verify_all"] = compare(results, ours, va, lv)
            if "verify_all" in results and va != "verify_all":
                row["vs_verify_all_server"] = compare(results, ours, "verify_all", lv)
            if "upstream" in results:
                row["vs_upstream"] = compare(results, ours, "upstream", lv)
            if lv in best:
                row["vs_best_fixed"] = compare(results, ours, best[lv]["config"], lv)
                row["vs_best_fixed_xval"] = best_fixed_xval(results, fixed, ours, lv)
            row["ok"] = (all(row[k]["ratio"] >= 1.0 for k in ("vs_verify_all", "vs_upstream") if k in row)
                         and ("vs_best_fixed" not in row or row["vs_best_fixed"]["ratio"] >= 0.98))
            t[lv] = row
        s["targets"][ours] = t
    # how far apart the servers run on the same work: each server's reference speed vs the
    # online server's, and the static verify-all server vs the sweep's verify-all chunk
    base = ref_of("online", results)
    for lv in levels:
        off = {}
        for srv in ("upstream", "controller", "online_static", "online_ragged"):
            r = ref_of(srv, results)
            if base and r and srv in results:
                off[srv] = float(np.mean(_ref_speed(results[r][lv])) / np.mean(_ref_speed(results[base][lv])))
        if "verify_all" in results and "fixed@1" in results:
            off["verify_all_server"] = results["verify_all"][lv]["tok_s"] / results["fixed@1"][lv]["tok_s"]
        s["server_offsets"][lv] = off
    # host overhead per decode step: our planning + telemetry vs SGLang's planning call
    up = (plugin.get("upstream") or {}).get("host_overhead") or {}
    on = (plugin.get("online") or {}).get("host_overhead") or {}
    step_ms = ((plugin.get("online") or {}).get("telemetry") or {}).get("mean_step_ms")
    if up.get("plan_us_mean") is not None and on.get("plan_us_mean") is not None and step_ms:
        ours_us = on["plan_us_mean"] + (on.get("telemetry_us_mean") or 0.0)
        s["overhead"] = {"upstream_plan_us": up["plan_us_mean"], "ours_plan_us": on["plan_us_mean"],
                         "ours_telemetry_us": on.get("telemetry_us_mean"),
                         "extra_us_per_step": ours_us - up["plan_us_mean"], "mean_step_ms": step_ms,
                         "extra_fraction_of_step": (ours_us - up["plan_us_mean"]) / (1000.0 * step_ms)}
        s["overhead"]["ok"] = s["overhead"]["extra_fraction_of_step"] <= 0.02
    # a no-draft step vs a plain decode step (issue 21: at most 1.10x the time, i.e. at
    # least 1 / 1.10 of the tokens/s); cross-server, raw
    if "online_off" in results and "nospec" in results:
        s["no_draft_vs_plain"] = {}
        for lv in levels:
            c = compare(results, "online_off", "nospec", lv)
            c["ok"] = c["ratio"] >= 1.0 / 1.10
            c["cpu_seconds"] = compare_cpu(results, "online_off", "nospec", lv)
            s["no_draft_vs_plain"][lv] = c
    return s


def _fmt(c: dict) -> str:
    rnd = c.get("rounds") or {}
    pm = f"+-{2 * rnd['se']:.3f}" if rnd.get("se") is not None else ""
    tag = {"same server": "same", "normalized": "norm", "raw": "raw"}[c["how"]]
    return f"{c['ratio']:.3f}{pm} ({tag})"


def print_report(report: dict) -> None:
    res, s = report["results"], report["summary"]
    levels = report["meta"]["levels"]
    base = "verify_all" if "verify_all" in res else next(iter(res))
    print(f"\nRAW output tok/s ratio vs {base} | tok/s-per-user ratio | accept length, same run "
          f"(cross-server ratios carry each server's speed offset):")
    print(f"{'config':>16} " + " ".join(f"{'c=' + str(lv):>20}" for lv in levels))
    for name, row in res.items():
        cells = []
        for lv in levels:
            r, b = row[lv], res[base][lv]
            acc = f"{r['accept_len']:.2f}" if "accept_len" in r else "-"
            cells.append(f"{r['tok_s'] / b['tok_s']:5.2f}|{r['tok_s_per_user'] / b['tok_s_per_user']:5.2f}|{acc:>5}")
        print(f"{name:>16} " + " ".join(f"{c:>20}" for c in cells))
    va = s.get("verify_all_chunk")
    if va and va in res:
        print(f"\nFAIR output tok/s ratio vs {va} (same server, or normalized by each server's "
              f"reference chunk; raw only where a server has none):")
        print(f"{'config':>16} " + " ".join(f"{'c=' + str(lv):>20}" for lv in levels))
        for name in res:
            if "~ref" in name:
                continue
            print(f"{name:>16} " + " ".join(f"{_fmt(compare(res, name, va, lv)):>20}" for lv in levels))
    offs = s.get("server_offsets") or {}
    if any(offs.values()):
        print("server offsets (same budget, same prompts: each server's reference speed / the "
              "online server's; static verify-all server / fixed@1): "
              + "; ".join(f"c={lv}: " + ", ".join(f"{k} {v:.3f}" for k, v in o.items())
                          for lv, o in offs.items() if o))
    cv = [np.std(r["per_round_tok_s"], ddof=1) / np.mean(r["per_round_tok_s"]) for row in res.values()
          for r in row.values() if len(r.get("per_round_tok_s", [])) > 2]
    if cv:
        print(f"chunk-to-chunk noise: coefficient of variation of one (config, level) over the rounds "
              f"{100 * np.median(cv):.1f}% (median), {100 * max(cv):.1f}% (max)")
    for ours, t in s["targets"].items():
        for lv, row in t.items():
            if not any(k.startswith("vs_") for k in row):
                continue     # nothing to compare with in this run (no verify-all, upstream or sweep)
            parts = " ".join(f"{k}={_fmt(v)}" for k, v in row.items()
                             if k.startswith("vs_") and isinstance(v, dict) and "how" in v)
            xv = row.get("vs_best_fixed_xval") or {}
            if xv:
                parts += f" vs_best_fixed_xval={xv['ratio']:.3f}+-{2 * xv['se']:.3f} ({'/'.join(xv['picks'])})"
            bf = s["best_fixed"].get(lv, {}).get("config")
            print(f"target {ours:>10} c={lv:<3} {parts} (best fixed: {bf}) -> {'OK' if row['ok'] else 'MISSED'}")
    for name in res:
        if name not in OURS:
            continue
        cells = {lv: no_draft_share(res[name][lv].get("sources") or {}) for lv in levels}
        if any(cells.values()):
            print(f"no-draft steps of {name} (share of its decode steps; on/off transitions): " + "; ".join(
                f"c={lv} {100 * c['share']:.0f}% of {c['steps']}, {c['switches_off']} off / {c['switches_on']} on"
                for lv, c in cells.items() if c))
    for lv, c in (s.get("no_draft_vs_plain") or {}).items():
        cpu = c.get("cpu_seconds")
        print(f"no-draft steps (online_off) vs plain decoding c={lv:<3} {_fmt(c)}: a no-draft step costs "
              f"{1 / c['ratio']:.2f}x a plain decode step -> {'OK' if c['ok'] else 'MISSED'} (target <= 1.10x)"
              + (f"; per CPU second {_fmt(cpu)}, {1 / cpu['ratio']:.2f}x" if cpu else ""))
    cpu_rows = [(name, lv, compare_cpu(res, name, "nospec", lv)) for name in res if "nospec" in res
                for lv in levels]
    if any(c for _, _, c in cpu_rows):
        print("\noutput tokens per CPU second of each server, over no speculation's (steadier than wall "
              "time on a shared VM: other tenants' time is left out; +-2 SE over the rounds):")
        for name in res:
            if "~ref" in name:
                continue
            cells = [c for n, _, c in cpu_rows if n == name]
            print(f"{name:>16} " + " ".join(f"{(_fmt(c) if c else '-'):>20}" for c in cells))
    if "overhead" in s:
        o = s["overhead"]
        print(f"host overhead per step: ours {o['ours_plan_us']:.0f} us planning + {o['ours_telemetry_us']:.0f} us "
              f"telemetry vs upstream planning {o['upstream_plan_us']:.0f} us; extra {o['extra_us_per_step']:.0f} us "
              f"= {100 * o['extra_fraction_of_step']:.2f}% of a {o['mean_step_ms']:.1f} ms step -> "
              f"{'OK' if o['ok'] else 'MISSED'}")


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res, levels = report["results"], report["meta"]["levels"]
    fig, ax = plt.subplots(1, 3, figsize=(17, 5))
    style = {"nospec": ("k", "--"), "verify_all": ("tab:red", "-"), "upstream": ("tab:orange", "-"),
             "online": ("tab:blue", "-"), "controller": ("tab:green", "-"),
             "online_draft": ("tab:purple", ":"), "online_off": ("tab:gray", "-.")}
    for name, row in res.items():
        if "~ref" in name:   # reference chunks: a normalizer, not a configuration
            continue
        c, ls = style.get(name, ("0.6", ":"))
        lw = 2.5 if name in OURS else 1.3
        xs = [row[lv]["tok_s"] for lv in levels]
        ax[0].plot(levels, xs, ls, color=c, lw=lw, marker="o", label=name)
        ax[1].plot(xs, [row[lv]["tok_s_per_user"] for lv in levels], ls, color=c, lw=lw, marker="o", label=name)
        acc = [row[lv].get("accept_len") for lv in levels]
        if all(a is not None for a in acc):
            ax[2].plot(levels, acc, ls, color=c, lw=lw, marker="o", label=name)
    ax[0].set(xscale="log", xlabel="concurrent requests", ylabel="output tokens/s", title="throughput")
    ax[1].set(xlabel="output tokens/s (aggregate)", ylabel="tokens/s per user", yscale="log",
              title="interactivity vs throughput")
    ax[2].set(xscale="log", xlabel="concurrent requests", ylabel="output tokens per verify round",
              title="SGLang accept length")
    for a in ax:
        a.set_xticks(levels) if a is not ax[1] else None
        a.grid(alpha=0.3)
    ax[0].set_xticklabels([str(lv) for lv in levels])
    ax[2].set_xticklabels([str(lv) for lv in levels])
    ax[1].legend(fontsize=8)
    m = report["meta"]
    fig.suptitle(f"{m.get('pair', 'bench')} tiny pair on {m['cpus']} CPUs, {m['date']} (CPU figures: only ratios mean anything)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
