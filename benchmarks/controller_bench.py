"""DSpark controller benchmark (one command; not a timed test).

    python benchmarks/controller_bench.py [--duration 8] [--workers 1,8,64] [--json out.json]
                                         [--sections host,interference,ingest,learning]

Measures, on this machine:

1. Telemetry ingest (steps/s the controller learned from) and decision latency p50/p99
   (controller-side: plan + serialise + publish one BudgetDecision) with 1, 8 and 64
   simulated workers. The controller is a real ``dspark-controller serve`` process; the
   workers are real ``ControllerClient`` instances spread over a few processes, replaying
   telemetry drawn from known curves as fast as their bounded queues allow.
2. Learned-profile error vs steps seen (replay, smooth and jagged step-wise curves), the
   recovery from a 30% drift, and decision quality against an oracle that knows the true
   curve (true throughput of the learned-curve plan / true throughput of the oracle plan).
3. Host cost of the controller mode: CPU of the controller process and of the client's
   thread (which lives in the engine's scheduler process) per second, with one engine
   idle and reporting 12 steps/s at R = 1 (a CPU decode loop) and 40 steps/s at R = 32.
   On a host whose cores the engine uses, this CPU is the engine's. And what that costs a
   two-thread OpenMP loop (torch GEMVs, as SGLang's CPU decode runs) on this host, beside
   the controller mode at 12 steps/s against alone, in alternating chunks.

Targets (issue 3): profile within 5% of the true step time after 2000 steps; recovery from
a 30% drift within 500 steps; decision quality >= 98% of the oracle.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
try:
    import dspark_controller  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "controller"))

import numpy as np  # noqa: E402

from dspark_controller.service.protocol import EngineFingerprint, StatusReply, StatusRequest, StepTelemetry  # noqa: E402
from dspark_controller.sim.synthetic import CURVES, decision_quality, random_confidences, synth_step  # noqa: E402
from dspark_controller.core.sps_model import SpsModel  # noqa: E402

GAMMA = 7


# ------------------------------------------------------------------ helpers
def _status(endpoint: str, timeout: float = 5.0):
    import zmq

    from dspark_controller.service.protocol import decode_frames, encode

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(endpoint)
        s.send_multipart(encode(StatusRequest()))
        if not s.poll(int(timeout * 1000)):
            return None
        msg = decode_frames(s.recv_multipart())
        return msg if isinstance(msg, StatusReply) else None
    finally:
        s.close(0)
        ctx.term()


def _fingerprint(kind: str, rank: int) -> EngineFingerprint:
    return EngineFingerprint(target_model="Qwen/Qwen3-8B", draft_model="dspark", gamma=GAMMA, block_size=GAMMA + 1,
                             device_name=f"sim-{kind}", tp_rank=rank % 8, tp_size=8, dtype="bfloat16",
                             attention_backend="sim", sglang_version="0.5.23")


def _worker_proc(address: str, engine_ids: list, duration: float, seed: int, out: "mp.Queue",
                 rate: float = 0.0) -> None:
    from dspark_controller.service.client import ControllerClient

    rng = np.random.default_rng(seed)
    pool = {}
    clients = []
    for i, eid in enumerate(engine_ids):
        kind = "smooth" if i % 2 == 0 else "jagged"
        steps = [synth_step(rng, CURVES[kind]) for _ in range(400)]
        pool[eid] = steps
        clients.append(ControllerClient(address=address, fingerprint=_fingerprint(kind, i), engine_id=eid,
                                        heartbeat_s=0.5, queue_max=2048, poll_interval_s=0.02).start())
    deadline = time.monotonic() + 30
    while any(c.link_state != "connected" for c in clients) and time.monotonic() < deadline:
        time.sleep(0.05)
    out.put(("ready", len(clients)))
    seqs = [0] * len(clients)
    start = time.monotonic()
    end = start + duration + 1.0
    while time.monotonic() < end:
        busy = True
        for k, c in enumerate(clients):
            if rate > 0:        # paced: each engine publishes `rate` steps per second
                n = int((time.monotonic() - start) * rate) - seqs[k]
            else:               # flood: as fast as the bounded queue allows
                n = 64 if c.counters["queue_len"] <= 512 else 0
            if n <= 0:
                continue
            busy = False
            steps = pool[c.engine_id]
            for _ in range(n):
                s = steps[seqs[k] % len(steps)]
                c.publish_step(StepTelemetry(seq=seqs[k], num_running_requests=s.num_requests,
                                             verify_tokens=s.verify_tokens, step_time_s=s.step_time_s,
                                             accepted_lens=s.accepted_lens, verify_lens=s.verify_lens,
                                             timestamp=time.time()))
                seqs[k] += 1
        if busy:
            time.sleep(0.002 if rate > 0 else 0.001)
    time.sleep(0.5)
    counters = [c.counters for c in clients]
    got_decision = sum(1 for c in clients if c.latest_decision(10.0) is not None)
    for c in clients:
        c.close()
    out.put(("done", {"published": sum(seqs), "sent": sum(x.get("steps_sent", 0) for x in counters),
                      "dropped": sum(x.get("dropped_queue_full", 0) + x.get("dropped_send", 0) for x in counters),
                      "with_decision": got_decision}))


def _start_controller(base: str, log: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """A real ``dspark-controller serve`` on ``base`` (no persistence), once it answers status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "controller") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    ctl = subprocess.Popen([sys.executable, "-m", "dspark_controller.cli", "serve", "--bind", base, "--no-persist",
                            "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while _status(base + ".cli", 0.5) is None:
        if time.monotonic() > deadline or ctl.poll() is not None:
            _stop_controller(ctl)
            raise RuntimeError("controller did not start")
    return ctl


def _stop_controller(ctl: subprocess.Popen) -> None:
    ctl.send_signal(signal.SIGTERM)
    try:
        ctl.wait(15)
    except subprocess.TimeoutExpired:
        ctl.kill()


def bench_ingest(n_workers: int, duration: float, workdir: Path, *, rate: float = 0.0) -> dict:
    base = f"ipc://{workdir}/bench{n_workers}r{int(rate)}"
    cli = base + ".cli"
    log = open(workdir / f"ctl{n_workers}.log", "wb")
    try:
        ctl = _start_controller(base, log)
    except BaseException:
        log.close()
        raise
    try:
        n_procs = min(n_workers, 4)
        ids = [f"w{i}" for i in range(n_workers)]
        groups = [ids[i::n_procs] for i in range(n_procs)]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_worker_proc, args=(base, g, duration, 100 + i, q, rate))
                 for i, g in enumerate(groups)]
        for p in procs:
            p.start()
        for _ in procs:
            q.get(timeout=60)
        s0 = _status(cli)
        t0 = time.monotonic()
        time.sleep(duration)
        s1 = _status(cli)
        t1 = time.monotonic()
        results = [q.get(timeout=120)[1] for _ in procs]
        for p in procs:
            p.join(30)
        if s0 is None or s1 is None:
            raise RuntimeError(f"controller stopped answering status with {n_workers} workers")
        rate_offered = rate
        ingested = (s1.counters["telemetry_steps"] - s0.counters["telemetry_steps"]) / (t1 - t0)
        learned = (s1.counters.get("telemetry_learned", 0) - s0.counters.get("telemetry_learned", 0)) / (t1 - t0)
        shed = (s1.counters.get("telemetry_shed", 0) - s0.counters.get("telemetry_shed", 0)) / (t1 - t0)
        msgs = (s1.counters["telemetry_batches"] - s0.counters["telemetry_batches"]) / (t1 - t0)
        decisions = (s1.counters["decisions_published"] - s0.counters["decisions_published"]) / (t1 - t0)
        return {
            "workers": n_workers, "offered_per_worker": rate_offered, "steps_per_s": ingested,
            "learned_per_s": learned, "shed_per_s": shed,
            "messages_per_s": msgs, "decisions_per_s": decisions,
            "decision_latency_p50_ms": 1e3 * s1.counters.get("decision_latency_p50_s", float("nan")),
            "decision_latency_p99_ms": 1e3 * s1.counters.get("decision_latency_p99_s", float("nan")),
            "published": sum(r["published"] for r in results), "dropped_client_side": sum(r["dropped"] for r in results),
            "engines_with_decision": sum(r["with_decision"] for r in results),
            "profiles": [(p.profile_key, p.samples_seen, p.heldout_error.mape) for p in s1.profiles],
            "controller_dropped": s1.dropped,
        }
    finally:
        _stop_controller(ctl)
        log.close()


def _cpu_s(pid: int, tid: Optional[int] = None) -> float:
    """utime + stime of a process (or one of its threads) from /proc, in seconds."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _paced_client(base: str, rate: float, R: int, go: Any, stop: Any, out: "mp.Queue") -> None:
    """A worker's side of the controller mode in its own process: one ControllerClient
    reporting ``rate`` steps/s at ``R`` requests between ``go`` and ``stop`` (after a
    warm-up that makes the profile ready); puts its client thread's CPU seconds and the
    decisions it received in that window."""
    from dspark_controller.service.client import ControllerClient

    c = ControllerClient(address=base, fingerprint=_fingerprint("smooth", 0), engine_id="e0").start()
    deadline = time.monotonic() + 30
    while c.link_state != "connected" and time.monotonic() < deadline:
        time.sleep(0.05)
    rng = np.random.default_rng(0)
    seq = 0

    def step() -> None:
        nonlocal seq
        seq += 1
        B = int(rng.integers(0, R * GAMMA + 1))
        c.publish_step(StepTelemetry(seq=seq, num_running_requests=R, verify_tokens=R + B,
                                     step_time_s=0.05 + 0.002 * B,
                                     accepted_lens=[int(x) for x in rng.integers(0, GAMMA + 1, R)],
                                     verify_lens=[GAMMA] * R, timestamp=time.time()))
    for i in range(600):            # a ready profile first (600 steps in ~1.2 s)
        step()
        if i % 50 == 49:
            time.sleep(0.1)
    out.put("ready")
    while not go.wait(0.5):
        if stop.is_set():
            c.close()
            return
    tid = c._thread.native_id
    w0, n0, t0, s0 = _cpu_s(os.getpid(), tid), c.counters.get("decisions_received", 0), time.monotonic(), seq
    while not stop.is_set():
        while seq < s0 + int((time.monotonic() - t0) * rate):
            step()
        # sleep until the next step is due (a decode loop does not poll)
        stop.wait(max(0.0, t0 + (seq - s0 + 1) / rate - time.monotonic()) if rate > 0 else 0.25)
    out.put({"client_thread_cpu_s": _cpu_s(os.getpid(), tid) - w0,
             "decisions": c.counters.get("decisions_received", 0) - n0})
    c.close()


class _ControllerMode:
    """A real controller process and a paced client process (:func:`_paced_client`):
    ``with _ControllerMode(...) as m: m.go(); ...; result = m.stop()``."""

    def __init__(self, rate: float, R: int, workdir: Path, tag: str) -> None:
        self.rate, self.R = rate, R
        self.base = f"ipc://{workdir}/{tag}"
        self._ctx = mp.get_context("spawn")

    def __enter__(self) -> "_ControllerMode":
        self.ctl = _start_controller(self.base)
        self.proc = None
        try:
            self._go, self._stop, self._q = self._ctx.Event(), self._ctx.Event(), self._ctx.Queue()
            self.proc = self._ctx.Process(target=_paced_client,
                                          args=(self.base, self.rate, self.R, self._go, self._stop, self._q))
            self.proc.start()
            if self._q.get(timeout=60) != "ready":
                raise RuntimeError("client did not warm up")
            time.sleep(2.0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def go(self) -> None:
        self._c0, self._t0 = _cpu_s(self.ctl.pid), time.monotonic()
        self._go.set()

    def stop(self) -> dict:
        self._stop.set()
        c1, t1 = _cpu_s(self.ctl.pid), time.monotonic()
        got = self._q.get(timeout=30)
        dt = t1 - self._t0
        return {"rate": self.rate, "R": self.R, "controller_cpu_ms_per_s": 1e3 * (c1 - self._c0) / dt,
                "client_thread_cpu_ms_per_s": 1e3 * got["client_thread_cpu_s"] / dt,
                "decisions_per_s": got["decisions"] / dt}

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self._stop.set()
            self.proc.join(15)
            if self.proc.is_alive():
                self.proc.kill()
        _stop_controller(self.ctl)


def bench_host_cost(rate: float, R: int, duration: float, workdir: Path) -> dict:
    """CPU per second of a real controller process and of one ControllerClient's thread
    while it reports ``rate`` steps/s (0: idle, heartbeats only) at ``R`` requests."""
    with _ControllerMode(rate, R, workdir, f"host{int(rate)}r{R}") as m:
        m.go()
        time.sleep(duration)
        return m.stop()


def bench_interference(rounds: int, chunk_s: float, workdir: Path, rate: float = 12.0, R: int = 1) -> dict:
    """How much the controller mode slows a two-thread OpenMP loop on this host: torch
    GEMVs (4 x 1024 by 1024 x 4096, a CPU decode step's kind of op) per second while a
    controller and a client reporting ``rate`` steps/s run, over the same loop without
    them; chunks alternate (the order rotates each round) so drift cancels."""
    import torch

    torch.set_num_threads(2)
    x, w = torch.randn(4, 1024), torch.randn(4096, 1024)

    def loop_rate() -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < chunk_s:
            for _ in range(20):
                torch.nn.functional.linear(x, w)
            n += 20
        return n / (time.perf_counter() - t0)
    ratios = []
    for r in range(rounds):
        got = {}
        for arm in (("plain", "controller") if r % 2 == 0 else ("controller", "plain")):
            if arm == "plain":
                time.sleep(1.0)
                got[arm] = loop_rate()
            else:
                with _ControllerMode(rate, R, workdir, f"omp{r}") as m:
                    m.go()
                    time.sleep(1.0)
                    got[arm] = loop_rate()
                    m.stop()
        ratios.append(got["controller"] / got["plain"])
    a = np.asarray(ratios)
    return {"rate": rate, "R": R, "rounds": rounds, "chunk_s": chunk_s, "ratios": ratios,
            "mean": float(a.mean()), "two_se": float(2 * a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else None}


def _holdout(curve, n=2000, seed=999):
    rng = np.random.default_rng(seed)
    st = [synth_step(rng, curve, noise_sigma=0.0, outlier_prob=0.0) for _ in range(n)]
    R = np.array([s.num_requests for s in st])
    B = np.array([s.verify_tokens for s in st])
    return R, B, curve.step_time(R, B)


def bench_learning(seeds: int = 5) -> dict:
    checkpoints = [100, 250, 500, 1000, 2000, 4000]
    out: dict = {"error_vs_steps": {}, "drift": {}, "quality": {}}
    for name, curve in CURVES.items():
        errs = np.zeros((seeds, len(checkpoints)))
        drift_steps = []
        drift_err_500 = []
        q_lag, q_exact = [], []
        for sd in range(seeds):
            rng = np.random.default_rng(10 + sd)
            R, B, T = _holdout(curve, seed=500 + sd)
            m = SpsModel()
            ci = 0
            for i in range(1, checkpoints[-1] + 1):
                s = synth_step(rng, curve)
                m.update(s.num_requests, s.verify_tokens, s.step_time_s)
                if i == checkpoints[ci]:
                    errs[sd, ci] = m.evaluate(R, B, T).mape
                    ci += 1
                if i == 2000:
                    qr = np.random.default_rng(77 + sd)
                    for _ in range(100):
                        r = int(qr.integers(1, 65))
                        c = random_confidences(qr, r, GAMMA)
                        q_lag.append(decision_quality(m.sps_function(r), curve.sps_function(r), c, algorithm="lagged"))
                        q_exact.append(decision_quality(m.sps_function(r), curve.sps_function(r), c, algorithm="exact"))
            # drift: a fresh model, 2000 steps, then the same curve 30% slower
            m = SpsModel()
            rng = np.random.default_rng(900 + sd)
            for _ in range(2000):
                s = synth_step(rng, curve)
                m.update(s.num_requests, s.verify_tokens, s.step_time_s)
            recovered = None
            for k in range(1, 1001):
                s = synth_step(rng, curve, mult=1.3)
                m.update(s.num_requests, s.verify_tokens, s.step_time_s)
                if k % 25 == 0:
                    e = m.evaluate(R, B, 1.3 * T).mape
                    if recovered is None and e < 0.05:
                        recovered = k
                    if k == 500:
                        drift_err_500.append(e)
            drift_steps.append(recovered if recovered is not None else float("inf"))
        out["error_vs_steps"][name] = {str(c): float(errs[:, i].mean()) for i, c in enumerate(checkpoints)}
        out["error_vs_steps"][name + "_worst"] = {str(c): float(errs[:, i].max()) for i, c in enumerate(checkpoints)}
        out["drift"][name] = {"steps_to_5pct_mean": float(np.mean(drift_steps)), "steps_to_5pct_worst": float(np.max(drift_steps)),
                              "error_at_500": float(np.mean(drift_err_500))}
        out["quality"][name] = {"lagged_mean": float(np.mean(q_lag)), "lagged_min": float(np.min(q_lag)),
                                "exact_mean": float(np.mean(q_exact)), "exact_min": float(np.min(q_exact))}
    return out


def bench_update_cost() -> dict:
    m = SpsModel()
    rng = np.random.default_rng(0)
    st = [synth_step(rng, CURVES["jagged"]) for _ in range(4000)]
    t0 = time.perf_counter()
    for s in st:
        m.update(s.num_requests, s.verify_tokens, s.step_time_s)
    per_update = (time.perf_counter() - t0) / len(st)
    t0 = time.perf_counter()
    for _ in range(50):
        m.refit()
    refit = (time.perf_counter() - t0) / 50
    fn = m.sps_function(64)
    from dspark_controller.core.method import plan_exact, plan_lagged

    c = random_confidences(rng, 64, GAMMA)
    t0 = time.perf_counter()
    for _ in range(200):
        plan_exact(c, fn, max_trace=0)
    exact = (time.perf_counter() - t0) / 200
    t0 = time.perf_counter()
    for _ in range(200):
        plan_lagged(c, fn, lagged_confidences=c)
    lag = (time.perf_counter() - t0) / 200
    return {"sps_update_us": per_update * 1e6, "sps_refit_ms": refit * 1e3, "plan_exact_R64_us": exact * 1e6,
            "plan_lagged_R64_us": lag * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of measured ingest per worker count")
    ap.add_argument("--workers", default="1,8,64")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--paced-rate", type=float, default=50.0,
                    help="steps/s per worker in the paced runs (a decode step every 20 ms)")
    ap.add_argument("--sections", default="host,interference,ingest,learning",
                    help="which parts to run (comma-separated): host, interference, ingest, learning")
    ap.add_argument("--interference-rounds", type=int, default=6,
                    help="rounds of the interference section (two 10 s chunks each)")
    ap.add_argument("--host-duration", type=float, default=20.0,
                    help="seconds measured per host-cost row (CPU times tick every 10 ms)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    sections = {x.strip() for x in args.sections.split(",") if x.strip()}
    unknown = sections - {"ingest", "learning", "host", "interference"}
    if unknown or not sections:
        ap.error(f"--sections {args.sections!r}: choose from host, interference, ingest, learning")
    workdir = Path(tempfile.mkdtemp(prefix="dscb", dir="/tmp"))
    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "platform": platform.platform()}, "ingest": []}
    try:
        print(f"# DSpark controller benchmark ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
        if "host" in sections:
            print("Host cost of the controller mode (CPU ms per second; the client thread runs in the "
                  "engine's process):\n")
            print("| engine reports | controller process | client thread | together | decisions/s |")
            print("|---|---:|---:|---:|---:|")
            results["host"] = []
            for rate, R in ((0.0, 1), (12.0, 1), (40.0, 32)):
                h = bench_host_cost(rate, R, args.host_duration, workdir)
                results["host"].append(h)
                load = "nothing (idle)" if rate <= 0 else f"{rate:g} steps/s at R = {R}"
                print(f"| {load} | {h['controller_cpu_ms_per_s']:.1f} | {h['client_thread_cpu_ms_per_s']:.1f} | "
                      f"{h['controller_cpu_ms_per_s'] + h['client_thread_cpu_ms_per_s']:.1f} | "
                      f"{h['decisions_per_s']:.1f} |", flush=True)
            print()
        if "interference" in sections:
            f = bench_interference(args.interference_rounds, 10.0, workdir)
            results["interference"] = f
            print(f"A two-thread OpenMP loop (torch GEMVs) beside the controller mode, the engine reporting "
                  f"{f['rate']:g} steps/s at R = {f['R']}: {f['mean']:.3f} +- {f['two_se']:.3f} of its rate "
                  f"alone (+-2 SE over {f['rounds']} rounds; per round "
                  f"{', '.join(f'{x:.3f}' for x in f['ratios'])})\n", flush=True)
        if "ingest" in sections:
            _ingest(args, results, workdir)
        if "learning" in sections:
            _learning(args, results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _ingest(args: argparse.Namespace, results: dict, workdir: Path) -> None:
    cost = bench_update_cost()
    results["cost"] = cost
    print(f"SpsModel.update {cost['sps_update_us']:.0f} us/step (amortised, incl. refits), refit "
          f"{cost['sps_refit_ms']:.2f} ms; plan_exact R=64 {cost['plan_exact_R64_us']:.0f} us, "
          f"plan_lagged R=64 {cost['plan_lagged_R64_us']:.0f} us\n")
    print("| workers | offered load | steps/s ingested | of which learned | shed (stale) steps/s | messages/s | "
          "decisions/s | decision p50 ms | decision p99 ms | client drops |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    runs = [(int(x), 0.0) for x in args.workers.split(",")]
    runs += [(int(x), args.paced_rate) for x in args.workers.split(",")]
    for n, rate in runs:
        r = bench_ingest(n, args.duration, workdir, rate=rate)
        results["ingest"].append(r)
        load = "flood" if rate <= 0 else f"{rate:g} steps/s/worker"
        print(f"| {n} | {load} | {r['steps_per_s']:.0f} | {r['learned_per_s']:.0f} | {r['shed_per_s']:.0f} | "
              f"{r['messages_per_s']:.0f} | "
              f"{r['decisions_per_s']:.0f} | "
              f"{r['decision_latency_p50_ms']:.3f} | {r['decision_latency_p99_ms']:.3f} | "
              f"{r['dropped_client_side']} |", flush=True)


def _learning(args: argparse.Namespace, results: dict) -> None:
    learn = bench_learning(args.seeds)
    results["learning"] = learn
    cps = list(next(iter(learn["error_vs_steps"].values())).keys())
    print("\nProfile error (mean |pred - true| / true on held-out batches), mean over "
          f"{args.seeds} seeds:\n")
    print("| curve | " + " | ".join(f"{c} steps" for c in cps) + " |")
    print("|---|" + "---:|" * len(cps))
    for name in CURVES:
        row = learn["error_vs_steps"][name]
        worst = learn["error_vs_steps"][name + "_worst"]
        print(f"| {name} | " + " | ".join(f"{100 * row[c]:.2f}% (worst {100 * worst[c]:.2f}%)" for c in cps) + " |")
    print("\n| curve | 30% drift: steps to < 5% (mean / worst) | error 500 steps after drift | "
          "decision quality, lagged (mean / min) | decision quality, exact Alg. 1 (mean / min) |")
    print("|---|---:|---:|---:|---:|")
    for name in CURVES:
        d, q = learn["drift"][name], learn["quality"][name]
        print(f"| {name} | {d['steps_to_5pct_mean']:.0f} / {d['steps_to_5pct_worst']:.0f} | "
              f"{100 * d['error_at_500']:.2f}% | {100 * q['lagged_mean']:.2f}% / {100 * q['lagged_min']:.2f}% | "
              f"{100 * q['exact_mean']:.2f}% / {100 * q['exact_min']:.2f}% |")


if __name__ == "__main__":
    sys.exit(main())
