"""Fleet what-if simulator: DSpark budget policies on simulated engines.

``dspark-controller simulate`` runs a discrete-event simulation of one or more serving
engines under a request arrival process and compares verify-budget policies side by side
(no speculation, MTP-1, verify-all, SGLang's static-table planner, our online profile, our
controller in throughput and SLA mode, and an oracle that knows the true curve).

What is simulated
-----------------
* **Arrivals**: closed loop (``concurrency`` users, each sends its next request when the
  previous one finishes; optionally a fixed number of requests per user, like
  ``benchmarks/worker_bench.py``) or open-loop Poisson (``rate`` requests/s).
* **Requests**: prompt and output lengths drawn from distributions; a domain per request
  (weights), each with a per-position conditional acceptance curve ``p_j``.
* **Drafts**: every step, each running request has a drafted block of ``gamma`` tokens.
  The true conditional acceptance of position j is ``q_j ~ Beta(kappa p_j, kappa (1-p_j))``
  (mean ``p_j``: per-token difficulty varies), the drafter's confidence is
  ``c_j = clip(q_j + N(0, noise))`` (calibrated up to noise), and token j survives with
  probability ``q_j`` given the tokens before it survived. Alternatively a *trace* (measured
  confidence rows and accepted lengths) is resampled.
* **Policies** pick K from confidences two steps old and verify the global top-K of the
  live survival products (the production structure; see :mod:`.sim_policies`, which runs
  the worker's and controller's own code). Accepted tokens are sampled; each request gains
  ``accepted + 1`` tokens.
* **No-draft steps**: before each decode step our policies are asked ``draft_step(R)``
  (``BudgetPolicy``, as the worker asks it); a no-draft step costs the cost model's plain
  decode step at ``R`` requests (``nospec``: no drafter forward), gains one token per
  request, and is reported through ``observe_off_step`` only (never the profile or the
  calibration).
* **Step time** comes from a cost model at (R, B, context): a measured profile
  (:class:`~.sim_roofline.ProfileCost`) or the analytic roofline of a named GPU and model
  (:class:`~.sim_roofline.RooflineCost`, MODELLED), times log-normal noise, optionally
  drifting mid-run (:class:`~.sim_roofline.Drift`). Learning policies learn from these
  simulated times.
* **Prefill**: ``colocated`` (a prefill step on the engine, stalling decode) or
  ``disaggregated`` (prefill elsewhere; requests arrive with their KV, as in the paper's
  production setting).

Outputs: aggregate tokens/s vs tokens/s per user (the paper's Figure 7), verify budget per
request vs concurrency (Figure 8), a drift timeline, tables, and throughput at SLA anchors.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import time as _time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dspark_controller.core.policy import PolicyConfig
from dspark_controller.sim.policies import POLICY_NAMES, Backend, make_policy, resolve_backend
from dspark_controller.sim.roofline import CostModel, Drift, ProfileCost, RooflineCost, build_roofline

__all__ = ["PAPER_TAU", "acceptance_from_tau", "Domain", "LengthDist", "Workload", "Scenario", "SCENARIOS",
           "load_scenario", "build_cost", "LevelResult", "run_frontier", "run_timeline", "frontier_anchors",
           "DEFAULT_POLICIES"]

# DSpark paper, Qwen3-8B, block 7, T = 1: accepted tokens per round (tau) per benchmark.
PAPER_TAU = {"gsm8k": 6.17, "math": 5.78, "humaneval": 5.52, "mtbench": 3.72, "alpaca": 3.58}
DEFAULT_POLICIES = ("nospec", "mtp1", "verify_all", "upstream", "online", "sla", "oracle")


def acceptance_from_tau(tau: float, gamma: int, *, decay: float = 0.985, ref_gamma: int = 7,
                        cap: float = 0.995) -> list[float]:
    """Per-position conditional acceptance ``p_j = min(a * decay^(j-1), cap)`` whose tau over
    ``ref_gamma`` positions (bonus included) equals ``tau``; returns the first ``gamma``."""
    if not 1.0 <= tau <= ref_gamma + 1:
        raise ValueError(f"tau {tau} must be in [1, {ref_gamma + 1}] for {ref_gamma} draft positions")

    def curve(a: float, n: int) -> np.ndarray:
        return np.minimum(a * decay ** np.arange(n), cap)

    def tau_of(a: float) -> float:
        return 1.0 + float(np.cumprod(curve(a, ref_gamma)).sum())

    lo, hi = 0.0, 1.0 / decay ** ref_gamma
    if tau_of(hi) < tau:
        raise ValueError(f"tau {tau} is not reachable with decay {decay} and cap {cap}")
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if tau_of(mid) < tau else (lo, mid)
    return [round(float(x), 5) for x in curve(0.5 * (lo + hi), gamma)]


# ------------------------------------------------------------------ workload
@dataclass(frozen=True)
class LengthDist:
    """``fixed`` (value), ``uniform`` (lo..hi), ``lognormal`` (mean, sigma; clipped to lo..hi)."""

    kind: str = "fixed"
    value: int = 256
    mean: float = 256.0
    sigma: float = 0.5
    lo: int = 1
    hi: int = 1 << 20

    def sample(self, rng: np.random.Generator, scale: float = 1.0) -> int:
        if self.kind == "fixed":
            x = self.value * scale
        elif self.kind == "uniform":
            x = rng.integers(self.lo, self.hi + 1) * scale
        elif self.kind == "lognormal":
            mu = math.log(self.mean) - 0.5 * self.sigma ** 2
            x = rng.lognormal(mu, self.sigma) * scale
        else:
            raise ValueError(f"unknown length distribution {self.kind!r}; use fixed, uniform or lognormal")
        return int(min(max(round(x), self.lo), self.hi * max(scale, 1.0)))

    @property
    def expected(self) -> float:
        if self.kind == "fixed":
            return float(self.value)
        if self.kind == "uniform":
            return 0.5 * (self.lo + self.hi)
        return float(self.mean)

    @staticmethod
    def from_spec(spec: Any) -> "LengthDist":
        if isinstance(spec, LengthDist):
            return spec
        if isinstance(spec, (int, float)):
            return LengthDist(kind="fixed", value=int(spec))
        spec = dict(spec)
        kind = spec.pop("dist", spec.pop("kind", "fixed"))
        return LengthDist(kind=kind, **spec)


@dataclass
class Domain:
    """A traffic class: per-position conditional acceptance and confidence behaviour.

    Either ``acceptance`` (``p_1..p_gamma``; or ``tau`` to derive it with
    :func:`acceptance_from_tau`) with ``concentration`` (Beta kappa of the per-token true
    acceptance; smaller = more spread, more informative confidences) and ``conf_noise``
    (std of the confidence error), or a ``trace``: measured rows of confidences
    ``conf [N, gamma]`` and accepted draft lengths under full verification ``acc [N]``.
    """

    name: str
    weight: float = 1.0
    acceptance: Optional[list[float]] = None
    concentration: float = 2.0
    conf_noise: float = 0.05
    trace_conf: Optional[np.ndarray] = None
    trace_acc: Optional[np.ndarray] = None

    def draw(self, rng: np.random.Generator, n: int, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` drafted blocks: confidences [n, gamma] and accepted draft lengths [n]."""
        if self.trace_conf is not None:
            idx = rng.integers(0, self.trace_conf.shape[0], size=n)
            return self.trace_conf[idx], self.trace_acc[idx]
        p = np.asarray(self.acceptance[:gamma], dtype=np.float64)
        k = self.concentration
        q = rng.beta(np.maximum(k * p, 1e-3), np.maximum(k * (1.0 - p), 1e-3), size=(n, gamma))
        ok = rng.random((n, gamma)) < q
        acc = np.where(ok.all(axis=1), gamma, np.argmin(ok, axis=1))
        conf = np.clip(q + rng.normal(0.0, self.conf_noise, size=(n, gamma)), 0.01, 0.99)
        return conf, acc

    def expected_tau(self, gamma: int) -> float:
        if self.trace_acc is not None:
            return 1.0 + float(np.mean(np.minimum(self.trace_acc, gamma)))
        return 1.0 + float(np.cumprod(np.asarray(self.acceptance[:gamma])).sum())

    def summary(self, gamma: int) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "weight": self.weight, "tau": round(self.expected_tau(gamma), 3)}
        if self.trace_conf is not None:
            d["trace_rows"] = int(self.trace_conf.shape[0])
        else:
            d.update(acceptance=list(self.acceptance[:gamma]), concentration=self.concentration,
                     conf_noise=self.conf_noise)
        return d

    @staticmethod
    def from_spec(spec: Any, gamma: int, base_dir: Optional[Path] = None) -> "Domain":
        if isinstance(spec, Domain):
            return spec
        if isinstance(spec, str):
            if spec not in PAPER_TAU:
                raise ValueError(f"unknown domain {spec!r}; built in: {', '.join(PAPER_TAU)}")
            return Domain(name=spec, acceptance=acceptance_from_tau(PAPER_TAU[spec], gamma))
        spec = dict(spec)
        name = str(spec.pop("name", "domain"))
        trace = spec.pop("trace", None)
        tau = spec.pop("tau", None)
        if trace is not None:
            data = trace
            if isinstance(trace, str):
                path = Path(trace)
                if base_dir is not None and not path.is_absolute() and not path.exists():
                    path = base_dir / path
                data = json.loads(path.read_text())
            conf = np.asarray(data["conf"], dtype=np.float64)
            acc = np.asarray(data["acc"], dtype=np.int64)
            if conf.ndim != 2 or conf.shape[0] != acc.shape[0] or conf.shape[0] == 0:
                raise ValueError(f"domain {name}: a trace needs conf [N, gamma] and acc [N] with N > 0")
            if conf.shape[1] != gamma:
                raise ValueError(f"domain {name}: trace has {conf.shape[1]} positions, the scenario gamma is {gamma}")
            return Domain(name=name, weight=float(spec.pop("weight", 1.0)), trace_conf=conf,
                          trace_acc=np.minimum(acc, gamma))
        if tau is not None and "acceptance" not in spec:
            spec["acceptance"] = acceptance_from_tau(float(tau), gamma)
        if "acceptance" not in spec:
            raise ValueError(f"domain {name}: give 'acceptance' (per-position list), 'tau' or 'trace'")
        acc = [float(x) for x in spec.pop("acceptance")]
        if len(acc) < gamma:
            acc = acc + [acc[-1]] * (gamma - len(acc))
        if any(not 0.0 <= x <= 1.0 for x in acc):
            raise ValueError(f"domain {name}: acceptance values must be probabilities")
        return Domain(name=name, acceptance=acc, **spec)


@dataclass(frozen=True)
class Workload:
    arrival: str = "closed"                 # closed | poisson
    prompt: LengthDist = LengthDist("lognormal", mean=1024, sigma=0.7, lo=32, hi=8192)
    output: LengthDist = LengthDist("lognormal", mean=384, sigma=0.6, lo=16, hi=4096)
    think_s: float = 0.0                     # closed loop: pause between a user's requests
    requests_per_user: Optional[int] = None  # closed loop: finite job (None = steady state)
    request_overhead_s: float = 0.0          # outside the engine (HTTP, tokenisation), per request


@dataclass
class Scenario:
    name: str
    gamma: int = 7
    engines: int = 1
    max_running: int = 256
    cost: dict = field(default_factory=lambda: {"kind": "roofline", "gpu": "h200", "model": "llama-70b",
                                                "dtype": "fp8"})
    workload: Workload = field(default_factory=Workload)
    domains: list = field(default_factory=lambda: list(PAPER_TAU))
    prefill: str = "disaggregated"           # disaggregated | colocated
    max_prefill_tokens: int = 16384
    levels: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256])
    steps: int = 1200                        # decode steps per level (engine 0), steady state
    warmup_frac: float = 0.25
    warmup_level: Any = 8                    # a warm-up run before the sweep at this level, or a
                                             # list of levels run in order (a ramp, as worker_bench does)
    warmup_requests_per_user: Optional[int] = None  # finite warm-up runs: requests per user (None: the workload's)
    warmup_steps: int = 400
    step_noise: float = 0.03                 # log-normal sigma of measured step times
    sla_floor: Optional[float] = 80.0        # the 'sla' policy's floor (tokens/s per user)
    anchors: list = field(default_factory=lambda: [80.0, 120.0])
    controller_explore: float = 0.03         # explore_prob of the controller policies
    send_verify_lens: bool = True            # telemetry with verify_lens, as the worker sends it since
                                             # 23b6a16 (False: the older telemetry, a what-if)
    # overrides of the policy's PolicyConfig (dspark_controller.core.policy), e.g. {"probe": false}:
    # an ablation of our policy is a scenario setting
    policy_config: dict = field(default_factory=dict)
    # named variants of a built-in policy with their own PolicyConfig overrides (on top of
    # policy_config), run like any policy: {"online-always-draft": {"policy": "online",
    # "policy_config": {"no_draft": false}, "label": "..."}}
    variants: dict = field(default_factory=dict)
    policies: Optional[list] = None          # this scenario's default policies (None: DEFAULT_POLICIES)
    upstream_table: Any = "static-probe"     # 'static-probe' (measured at start) | path | dict
    lag_steps: int = 2
    # our worker's SGLANG_DSPARK_FULL_BUDGET_STATIC (default on for CPU devices): its steps whose
    # budget covers every draft token run SGLang's static path and cost a static-mode step
    full_budget_static: bool = False
    seed: int = 0
    description: str = ""
    base_dir: Optional[str] = None           # where a scenario file's relative paths resolve

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("base_dir", None)
        d["workload"] = asdict(self.workload)
        d["domains"] = [dm if isinstance(dm, (str, dict)) else dm.summary(self.gamma) for dm in self.domains]
        return d


def _gpu_scenario(name: str, cost: dict, **kw: Any) -> Scenario:
    return Scenario(name=name, cost=cost, **kw)


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "gpu-70b-h200": lambda: _gpu_scenario(
        "gpu-70b-h200", {"kind": "roofline", "gpu": "h200", "model": "llama-70b", "dtype": "fp8"},
        description="MODELLED: Llama-3.1-70B-class dense target, FP8 weights and KV, one H200, DSpark gamma=7 "
                    "(1-layer drafter), paper-tau domain mix, decode engine with disaggregated prefill"),
    "gpu-8b-h100": lambda: _gpu_scenario(
        "gpu-8b-h100", {"kind": "roofline", "gpu": "h100", "model": "qwen3-8b", "dtype": "bf16"},
        anchors=[120.0, 200.0], sla_floor=120.0,
        description="MODELLED: Qwen3-8B, BF16, one H100, gamma=7, paper-tau domain mix"),
    "gpu-moe-8xh200": lambda: _gpu_scenario(
        "gpu-moe-8xh200", {"kind": "roofline", "gpu": "h200", "model": "deepseek-v3", "dtype": "fp8",
                           "num_gpus": 8},
        description="MODELLED: DeepSeek-V3-class MoE (671B, 37B active), FP8, 8x H200 (EP/TP 8), gamma=7"),
    "gpu-70b-h200-heavy-draft": lambda: _gpu_scenario(
        "gpu-70b-h200-heavy-draft",
        {"kind": "roofline", "gpu": "h200", "model": "llama-70b", "dtype": "fp8", "draft_layers": 4},
        domains=["mtbench", "alpaca"],
        workload=Workload(prompt=LengthDist("lognormal", mean=512, sigma=0.7, lo=32, hi=4096),
                          output=LengthDist("lognormal", mean=256, sigma=0.6, lo=16, hi=2048)),
        levels=[1, 8, 32, 64, 96, 128, 192, 256], steps=800, warmup_steps=300,
        policies=["nospec", "verify_all", "upstream", "online", "online-always-draft", "oracle"],
        variants={"online-always-draft": {"policy": "online", "policy_config": {"no_draft": False},
                                          "label": "ours: online, no-draft steps off (ablation)"}},
        description="MODELLED: speculation stops paying at high load: Llama-3.1-70B-class target, FP8, one "
                    "H200, an expensive 4-layer drafter (gamma=7) and modest acceptance (chat domains, "
                    "tau ~3.6), short prompts; with and without no-draft steps"),
    "cpu-tiny": lambda: Scenario(
        name="cpu-tiny", gamma=7, max_running=32, levels=[1, 2, 4, 8, 16, 32], steps=400, warmup_steps=200,
        cost={"kind": "profile", "path": "profiles/tiny-cpu-2core.sglang-sps-table.json"},
        workload=Workload(prompt=LengthDist("fixed", value=8), output=LengthDist("fixed", value=48)),
        prefill="colocated", anchors=[20.0, 40.0], sla_floor=20.0, upstream_table="cost-path",
        description="the tiny CPU engine's measured SPS table (profiles/), paper-tau domains"),
}


def load_scenario(spec: str) -> Scenario:
    """A built-in name or a JSON file (fields of :class:`Scenario`; ``base`` names a built-in
    to start from). Relative paths inside the file resolve against the file's directory
    when they do not exist relative to the working directory."""
    if spec in SCENARIOS:
        return SCENARIOS[spec]()
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"scenario {spec!r} is neither a built-in ({', '.join(SCENARIOS)}) nor a JSON file")
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{spec}: a scenario file holds one JSON object")
    return scenario_from_dict(data, base_dir=path.parent)


def scenario_from_dict(data: dict, base_dir: Optional[Path] = None) -> Scenario:
    data = dict(data)
    base = data.pop("base", None)
    sc = SCENARIOS[base]() if base else Scenario(name=str(data.get("name", "custom")))
    wl = data.pop("workload", None)
    if wl is not None:
        wl = dict(wl)
        for key in ("prompt", "output"):
            if key in wl:
                wl[key] = LengthDist.from_spec(wl[key])
        data["workload"] = replace(sc.workload, **wl)
    cost = data.get("cost")
    if isinstance(cost, dict) and cost.get("kind") == "profile" and base_dir is not None:
        p = Path(cost["path"])
        if not p.is_absolute() and not p.exists() and (base_dir / p).exists():
            data["cost"] = dict(cost, path=str(base_dir / p))
    known = set(Scenario.__dataclass_fields__)
    bad = set(data) - known
    if bad:
        raise ValueError(f"unknown scenario field(s) {sorted(bad)}; known: {sorted(known)}")
    out = replace(sc, base_dir=None if base_dir is None else str(base_dir), **data)
    _warmup_levels(out)   # validate here, with the file's name in the caller's error
    return out


def build_cost(sc: Scenario) -> CostModel:
    spec = dict(sc.cost)
    kind = spec.pop("kind", "roofline")
    if kind == "roofline":
        return build_roofline(spec)
    if kind == "profile":
        from dspark_controller.profiling.tools import load_any

        path = spec.pop("path")
        lp = load_any(str(path))
        model = lp.model
        return ProfileCost(step_time=model.predict_step_time, source=lp.describe(), **spec)
    raise ValueError(f"unknown cost kind {kind!r}; use roofline or profile")


# ------------------------------------------------------------------ requests and engines
_BLOCK = 32
_NREC = 9       # fields of a step record (_Run.records)


class _Request:
    __slots__ = ("rid", "user", "domain", "prompt", "out_len", "submit", "arrival", "first_token", "finish",
                 "generated", "rng", "buf_conf", "buf_acc", "pos", "hist", "decode_tokens")

    def __init__(self, rid: int, user: int, domain: Domain, prompt: int, out_len: int, submit: float,
                 seed: int) -> None:
        self.rid, self.user, self.domain = rid, user, domain
        self.prompt, self.out_len = prompt, out_len
        self.submit = submit
        self.arrival = submit
        self.first_token = math.nan
        self.finish = math.nan
        self.generated = 0
        self.rng = np.random.default_rng([seed, rid, 7])
        self.buf_conf: Optional[np.ndarray] = None
        self.buf_acc: Optional[np.ndarray] = None
        self.pos = _BLOCK
        self.hist: deque = deque(maxlen=2)
        self.decode_tokens = 0

    def next_block(self, gamma: int) -> tuple[np.ndarray, int]:
        if self.pos >= _BLOCK:
            self.buf_conf, self.buf_acc = self.domain.draw(self.rng, _BLOCK, gamma)
            self.pos = 0
        i = self.pos
        self.pos += 1
        return self.buf_conf[i], int(self.buf_acc[i])

    @property
    def ctx(self) -> int:
        return self.prompt + self.generated


class _Engine:
    def __init__(self, idx: int, policy: Any, max_running: int, kv_cap: Optional[float]) -> None:
        self.idx = idx
        self.policy = policy
        self.max_running = max_running
        self.kv_cap = kv_cap
        self.waiting: deque = deque()
        self.running: list[_Request] = []
        self.kv_reserved = 0.0
        self.decode_steps = 0
        self.busy = False

    def load(self) -> int:
        return len(self.running) + len(self.waiting)


@dataclass
class LevelResult:
    policy: str
    level: float
    arrival: str
    throughput: float = 0.0            # output tokens/s, all engines
    per_user: float = 0.0              # decode tokens/s per running request (time-weighted)
    per_user_e2e: float = 0.0          # mean completion tokens / request latency (worker_bench's)
    per_user_p10: float = 0.0          # 10th percentile of per-request decode rates
    budget_per_request: float = 0.0    # draft tokens verified per request per step (K / R)
    tau: float = 0.0                   # tokens per request per decode step (bonus included)
    mean_running: float = 0.0
    mean_batch_tokens: float = 0.0
    mean_step_ms: float = 0.0
    decode_steps: int = 0
    prefill_time_frac: float = 0.0
    completed: int = 0
    sla_floor: Optional[float] = None
    sla_met_frac: Optional[float] = None
    model_error: Optional[float] = None
    sources: dict = field(default_factory=dict)
    no_draft_frac: float = 0.0         # decode steps without a draft forward (no-draft steps; 1 for nospec)
    gate_switches: Optional[int] = None  # drafting <-> no-draft switches of the gate during the level
    window_s: float = 0.0
    makespan_s: float = 0.0
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class _Run:
    """One simulated run of one policy at one load level (policies persist across runs)."""

    def __init__(self, sc: Scenario, cost: CostModel, domains: list[Domain], engines: list[_Engine], *,
                 arrival: str, level: float, t0: float, seed: int, steps: Optional[int], warmup_steps: int,
                 drift: Drift, drift_at_step: Optional[int], prompt_scale_after_drift: float,
                 record_timeline: bool = False) -> None:
        self.sc, self.cost, self.domains, self.engines = sc, cost, domains, engines
        self.arrival, self.level, self.t0 = arrival, level, t0
        self.seed = seed
        self.rng = np.random.default_rng([seed, int(level * 1000), 11])
        self.noise_rng = np.random.default_rng([seed, int(level * 1000), 13])
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.drift = drift
        self.drift_at_step = drift_at_step
        self.drift_t: Optional[float] = drift.at_s
        self.prompt_scale_after = prompt_scale_after_drift
        self.weights = np.asarray([d.weight for d in domains], dtype=np.float64)
        self.weights /= self.weights.sum()
        self.events: list = []
        self._eseq = 0
        self.next_rid = 0
        self.t_warm: Optional[float] = t0 if warmup_steps <= 0 else None
        self.records: list[tuple] = []      # (t_end, dt, kind, R, K, tokens, running, engine, drafted)
        self.finished: list[_Request] = []
        self.user_left: dict[int, int] = {}
        self.stop_arrivals = False
        self.record_timeline = record_timeline
        self.quality: list[tuple[int, float]] = []   # (engine-0 step, decision quality) when recording
        self.gamma = sc.gamma

    # -- events
    def push(self, t: float, kind: str, data: Any) -> None:
        self._eseq += 1
        heapq.heappush(self.events, (t, self._eseq, kind, data))

    def new_request(self, user: int, now: float) -> _Request:
        rng = self.rng
        dom = self.domains[int(rng.choice(len(self.domains), p=self.weights))] if len(self.domains) > 1 \
            else self.domains[0]
        scale = self.prompt_scale_after if (self.drift_t is not None and now >= self.drift_t) else 1.0
        wl = self.sc.workload
        r = _Request(self.next_rid, user, dom, wl.prompt.sample(rng, scale), wl.output.sample(rng), now, self.seed)
        self.next_rid += 1
        return r

    def submit(self, user: int, now: float) -> None:
        if self.stop_arrivals:
            return
        r = self.new_request(user, now)
        r.arrival = now + 0.5 * self.sc.workload.request_overhead_s
        self.push(r.arrival, "arrive", r)

    def route(self, r: _Request) -> None:
        eng = min(self.engines, key=lambda e: (e.load(), e.idx))
        eng.waiting.append(r)
        if not eng.busy:
            eng.busy = True
            self.push(r.arrival, "engine", eng)

    # -- cost with drift and noise
    def true_step(self, kind: str, R: int, B: Any, ctx_sum: float, now: float) -> Any:
        """The true (noise-free) step time, drift included."""
        t_b = self.cost.decode(kind, R, B, ctx_sum, self.gamma)
        if self.drift_t is not None and now >= self.drift_t:
            t_r = self.cost.decode(kind, R, R, ctx_sum, self.gamma)
            return self.drift.scale * (t_r + self.drift.marginal * (t_b - t_r))
        return t_b

    def noisy(self, t: float) -> float:
        s = self.sc.step_noise
        return float(t * self.noise_rng.lognormal(0.0, s)) if s > 0 else float(t)

    # -- one engine step
    def engine_step(self, eng: _Engine, now: float) -> Optional[float]:
        sc = self.sc
        # admission (KV reservation: prompt + output)
        admitted: list[_Request] = []
        ptoks = 0
        while eng.waiting and len(eng.running) + len(admitted) < eng.max_running:
            r = eng.waiting[0]
            need = r.prompt + r.out_len
            if eng.kv_cap is not None and eng.kv_reserved + need > eng.kv_cap and (eng.running or admitted):
                break
            if admitted and sc.prefill == "colocated" and ptoks + r.prompt > sc.max_prefill_tokens:
                break
            eng.waiting.popleft()
            eng.kv_reserved += need
            admitted.append(r)
            ptoks += r.prompt
        if admitted and sc.prefill == "colocated":
            dt = self.noisy(float(self.cost.prefill([r.prompt for r in admitted], len(eng.running), self.gamma)))
            if self.drift_t is not None and now >= self.drift_t:
                dt *= self.drift.scale
            end = now + dt
            for r in admitted:
                r.generated = 1
                r.first_token = end
            self.records.append((end, dt, 1, len(eng.running), 0, len(admitted), len(eng.running), eng.idx, 0))
            eng.running.extend(admitted)
            self._finish_done(eng, end)
            return dt
        for r in admitted:          # disaggregated: the first token comes with the request
            r.generated = 1
            r.first_token = now
        eng.running.extend(admitted)
        self._finish_done(eng, now)
        if not eng.running:
            return None
        return self.decode_step(eng, now)

    def decode_step(self, eng: _Engine, now: float) -> float:
        g = self.gamma
        reqs = eng.running
        R = len(reqs)
        pol = eng.policy
        kind = pol.kind
        ctx_sum = float(sum(r.prompt + r.generated for r in reqs))
        if kind == "dspark" and not pol.draft(now=now, R=R):
            return self._off_step(eng, now, R, ctx_sum)
        if kind == "nospec":
            lengths = np.zeros(R, dtype=np.int64)
            accepted = np.zeros(R, dtype=np.int64)
            K = 0
        else:
            blocks = [r.next_block(g) for r in reqs]
            live = np.stack([b[0] for b in blocks])
            acc_full = np.fromiter((b[1] for b in blocks), dtype=np.int64, count=R)
            if kind == "mtp1":
                lengths = np.ones(R, dtype=np.int64)
                K = R
            else:
                lag = np.ones((R, g), dtype=np.float32)
                L = self.sc.lag_steps
                for i, r in enumerate(reqs):
                    if len(r.hist) >= L:
                        lag[i] = r.hist[-L]
                lagged_survival = np.cumprod(lag, axis=1)
                true_sps = self._true_sps(R, ctx_sum, now)
                k = pol.budget(now=now, R=R, gamma=g, lagged_survival=lagged_survival, true_sps=true_sps)
                full = R * g
                K = full if k is None else max(0, min(int(k), full))
                if self.record_timeline and eng.idx == 0:
                    self.quality.append((eng.decode_steps, decision_quality(lagged_survival, K, true_sps)))
                lengths = eng_admit(self._backend, live, K, g)
                K = int(lengths.sum())
                for i, r in enumerate(reqs):
                    r.hist.append(live[i].astype(np.float32))
            accepted = np.minimum(acc_full, lengths)
        B = R + K
        step_kind = kind
        if (kind == "dspark" and self.sc.full_budget_static and getattr(pol, "worker_brain", False)
                and K >= R * g):
            step_kind = "static"
        t_true = float(self.true_step(step_kind, R, B, ctx_sum, now))
        dt = self.noisy(t_true)
        end = now + dt
        gained = accepted + 1
        tokens = 0
        for i, r in enumerate(reqs):
            add = min(int(gained[i]), r.out_len - r.generated)
            r.generated += add
            r.decode_tokens += add
            tokens += add
        eng.decode_steps += 1
        self.records.append((end, dt, 0, R, K, tokens, R, eng.idx, 0 if kind == "nospec" else 1))
        pol.observe(now=end, R=R, B=B, t=dt, accepted=accepted, lengths=lengths, uniform=step_kind == "static"
                    and kind == "dspark")
        self._after_decode(eng, end)
        return dt

    def _after_decode(self, eng: _Engine, end: float) -> None:
        self._finish_done(eng, end)
        if eng.idx == 0:
            if self.t_warm is None and eng.decode_steps >= self.warmup_steps:
                self.t_warm = end
            if self.drift_at_step is not None and self.drift_t is None and eng.decode_steps >= self.drift_at_step:
                self.drift_t = end

    def _off_step(self, eng: _Engine, now: float, R: int, ctx_sum: float) -> float:
        """A no-draft step (the policy's ``draft_step`` said no): the engine's plain decode
        step at ``R`` requests (the cost model's ``nospec`` kind: the target over ``B = R``
        tokens, no drafter forward), one token per request, no draft block drawn (each
        request's draft stream and its relayed confidences stay where they were); the
        policy hears of it through ``observe_off`` only."""
        reqs = eng.running
        dt = self.noisy(float(self.true_step("nospec", R, R, ctx_sum, now)))
        end = now + dt
        tokens = 0
        for r in reqs:
            if r.generated < r.out_len:
                r.generated += 1
                r.decode_tokens += 1
                tokens += 1
        eng.decode_steps += 1
        self.records.append((end, dt, 0, R, 0, tokens, R, eng.idx, 0))
        eng.policy.observe_off(now=end, R=R, t=dt)
        self._after_decode(eng, end)
        return dt

    _backend: Backend

    def _true_sps(self, R: int, ctx_sum: float, now: float) -> Callable[[Any], Any]:
        def fn(b: Any) -> Any:
            return 1.0 / np.asarray(self.true_step("dspark", R, b, ctx_sum, now), dtype=np.float64) \
                if not np.isscalar(b) else 1.0 / float(self.true_step("dspark", R, b, ctx_sum, now))
        return fn

    def _finish_done(self, eng: _Engine, t: float) -> None:
        done = [r for r in eng.running if r.generated >= r.out_len]
        if not done:
            return
        eng.running = [r for r in eng.running if r.generated < r.out_len]
        o = self.sc.workload.request_overhead_s
        for r in done:
            r.finish = t
            eng.kv_reserved -= r.prompt + r.out_len
            self.finished.append(r)
            if self.arrival == "closed":
                left = self.user_left.get(r.user)
                if left is not None:
                    left -= 1
                    self.user_left[r.user] = left
                    if left <= 0:
                        continue
                self.push(t + 0.5 * o + self.sc.workload.think_s, "submit", r.user)

    # -- main loop
    def run(self, backend: Backend, max_sim_s: float = 1e7) -> float:
        self._backend = backend
        wl = self.sc.workload
        if self.arrival == "closed":
            users = int(self.level)
            for u in range(users):
                if wl.requests_per_user:
                    self.user_left[u] = int(wl.requests_per_user)
                self.submit(u, self.t0)
        else:
            self.push(self.t0 + float(self.rng.exponential(1.0 / self.level)), "poisson", None)
        now = self.t0
        while self.events:
            now, _, kind, data = heapq.heappop(self.events)
            if now - self.t0 > max_sim_s:
                break
            if kind == "engine":
                dt = self.engine_step(data, now)
                if dt is None:
                    data.busy = False
                else:
                    self.push(now + dt, "engine", data)
                if self.steps is not None and self.engines[0].decode_steps >= self.steps:
                    break
            elif kind == "arrive":
                self.route(data)
            elif kind == "submit":
                self.submit(data, now)
            elif kind == "poisson":
                self.submit(self.next_rid, now)
                self.push(now + float(self.rng.exponential(1.0 / self.level)), "poisson", None)
        self.t_end = now
        return now


def eng_admit(backend: Backend, live: np.ndarray, K: int, gamma: int) -> np.ndarray:
    return backend.admit(live, K, gamma)


def decision_quality(lagged_survival: np.ndarray, K: int, true_sps: Callable[[Any], Any]) -> float:
    """Expected throughput of budget K over the best budget, both judged on the true curve and
    the same lagged survival rows (``(R + top-K survival sum) * SPS_true(R + K)``): 1.0 = the
    oracle's choice; only the policy's knowledge of the curve is scored."""
    R = lagged_survival.shape[0]
    a = np.sort(np.asarray(lagged_survival, dtype=np.float64).ravel())[::-1]
    tau = R + np.concatenate([[0.0], np.cumsum(a)])
    theta = tau * np.asarray(true_sps(np.arange(R, R + a.size + 1)), dtype=np.float64)
    best = float(theta.max())
    return float(theta[min(int(K), a.size)] / best) if best > 0 else 1.0


# ------------------------------------------------------------------ metrics
def _level_metrics(run: _Run, policy_name: str, pols: list, floor: Optional[float], wall: float) -> LevelResult:
    sc = run.sc
    finite = run.steps is None
    t_lo = run.t0 if finite else (run.t_warm if run.t_warm is not None else run.t0)
    t_hi = run.t_end
    rec = np.asarray(run.records, dtype=np.float64).reshape(-1, _NREC) if run.records else np.zeros((0, _NREC))
    ends = rec[:, 0]
    win = (ends > t_lo) & (ends <= t_hi)
    w = rec[win]
    dec = w[w[:, 2] == 0]
    span = max(t_hi - t_lo, 1e-12)
    res = LevelResult(policy=policy_name, level=run.level, arrival=run.arrival, sla_floor=floor)
    res.window_s = span
    res.wall_s = wall
    tokens = float(w[:, 5].sum())
    busy = float((w[:, 6] * w[:, 1]).sum())          # request-seconds of running requests
    dec_tokens = float(dec[:, 5].sum())
    if finite:
        o = sc.workload.request_overhead_s
        first = min((r.submit for r in run.finished), default=run.t0)
        last = max((r.finish for r in run.finished), default=run.t0) + 0.5 * o
        res.makespan_s = last - first
        total = float(sum(r.generated for r in run.finished))
        res.throughput = total / max(res.makespan_s, 1e-12)
    else:
        res.throughput = tokens / span
    res.per_user = dec_tokens / busy if busy > 0 else 0.0
    if len(dec):
        res.budget_per_request = float(np.mean(dec[:, 4] / dec[:, 3]))
        res.tau = float(dec[:, 5].sum() / dec[:, 3].sum())
        res.mean_running = float(np.mean(dec[:, 3]))
        res.mean_batch_tokens = float(np.mean(dec[:, 3] + dec[:, 4]))
        res.mean_step_ms = 1e3 * float(np.mean(dec[:, 1]))
        res.decode_steps = int(len(dec))
        res.no_draft_frac = float(np.mean(dec[:, 8] == 0))
    res.prefill_time_frac = float(w[w[:, 2] == 1, 1].sum() / max(w[:, 1].sum(), 1e-12))
    fin = [r for r in run.finished if (finite or r.finish > t_lo)]
    res.completed = len(fin)
    o = sc.workload.request_overhead_s
    if fin:
        e2e = [r.generated / max(r.finish - r.submit + 0.5 * o, 1e-12) for r in fin]
        res.per_user_e2e = float(np.mean(e2e))
        rates = np.asarray([(r.generated - 1) / (r.finish - r.first_token) for r in fin
                            if r.generated > 1 and r.finish > r.first_token])
        if rates.size:
            res.per_user_p10 = float(np.percentile(rates, 10))
            if floor:
                res.sla_met_frac = float(np.mean(rates >= floor))
    src: dict = {}
    for p in pols:
        for k, v in p.state().get("sources", {}).items():
            src[k] = src.get(k, 0) + v
    res.sources = src
    model = getattr(pols[0], "decision_model", None)
    if model is not None and model.ready and len(dec):
        res.model_error = _model_error(run, model)
    return res


def _model_error(run: _Run, model: Any) -> float:
    """Mean |predicted - true| / true step time over B in [R, R(gamma+1)] at the last R and context."""
    eng = run.engines[0]
    R = max(1, int(round(np.mean([r[3] for r in run.records[-50:] if r[2] == 0] or [1]))))
    ctx = float(sum(r.prompt + r.generated for r in eng.running)) or R * (run.sc.workload.prompt.expected
                                                                          + run.sc.workload.output.expected / 2)
    Bs = np.unique(np.linspace(R, R * (run.gamma + 1), 24).astype(np.int64))
    true = np.asarray(run.true_step("dspark", R, Bs, ctx, run.t_end), dtype=np.float64)
    pred = np.asarray(model.predict_step_time(np.full(Bs.shape, R), Bs), dtype=np.float64)
    return float(np.mean(np.abs(pred - true) / true))


# ------------------------------------------------------------------ experiments
def static_probe_table(sc: Scenario, cost: CostModel) -> dict:
    """An SGLang ``SpsCostTable`` as ``benchmarks/measure_tiny_cpu_sps.py`` makes one: static
    mode (verify all, B = R (gamma + 1)) at R = 1, 2, 4, ... max_running, at the workload's
    mean context, before any drift; steps/s forced non-increasing."""
    ctx_per_req = sc.workload.prompt.expected + sc.workload.output.expected / 2
    Rs = [1]
    while Rs[-1] * 2 <= sc.max_running:
        Rs.append(Rs[-1] * 2)
    if Rs[-1] != sc.max_running:
        Rs.append(sc.max_running)
    Bs, sps, best = [], [], float("inf")
    for R in Rs:
        B = R * (sc.gamma + 1)
        s = 1.0 / float(cost.decode("dspark", R, B, R * ctx_per_req, sc.gamma))
        best = min(best, s)
        Bs.append(B)
        sps.append(round(best, 6))
    return {"sample_batch_tokens": Bs, "sample_steps_per_sec": sps, "max_batch_tokens": 2 * Bs[-1]}


def _upstream_table(sc: Scenario, cost: CostModel) -> dict:
    spec = sc.upstream_table
    if isinstance(spec, dict):
        return spec
    if spec == "static-probe":
        return static_probe_table(sc, cost)
    if spec == "cost-path":
        spec = sc.cost.get("path")
    data = json.loads(Path(str(spec)).read_text())
    if "sample_batch_tokens" not in data and "bias_seconds" not in data:
        raise ValueError(f"upstream table {spec}: SGLang's static planner needs an SpsCostTable "
                         "('sample_batch_tokens') or SpsAdditiveCostTable ('bias_seconds'); "
                         "use 'static-probe' to derive one")
    return data


def _domains(sc: Scenario) -> list[Domain]:
    base = Path(sc.base_dir) if sc.base_dir else None
    return [Domain.from_spec(d, sc.gamma, base) for d in sc.domains]


def _make_engines(sc: Scenario, cost: CostModel, policy: str, backend: Backend, shared: dict, table: dict,
                  seed: int) -> list[_Engine]:
    kv = cost.kv_capacity_tokens()
    engines = []
    base, over = resolve_policy(sc, policy)
    for i in range(sc.engines):
        pol = make_policy(base, backend=backend, gamma=sc.gamma, engine_idx=i, shared=shared,
                          upstream_table=table, max_running=sc.max_running, seed=seed, sla_floor=sc.sla_floor,
                          controller_explore=sc.controller_explore, send_verify_lens=sc.send_verify_lens,
                          brain_config=policy_config_of({"seed": seed + i, **sc.policy_config, **over}))
        engines.append(_Engine(i, pol, sc.max_running, kv))
    return engines


def policy_config_of(over: dict) -> PolicyConfig:
    """A :class:`PolicyConfig` from overrides (a JSON ``gate`` object becomes a ``GateConfig``)."""
    from dspark_controller.core.no_draft import GateConfig

    over = dict(over)
    if isinstance(over.get("gate"), dict):
        over["gate"] = GateConfig(**over["gate"])
    bad = set(over) - set(PolicyConfig.__dataclass_fields__)
    if bad:
        raise ValueError(f"unknown policy_config field(s) {sorted(bad)}")
    return PolicyConfig(**over)


def scenario_policies(sc: Scenario) -> list[str]:
    """The policy names this scenario runs by default."""
    return list(sc.policies) if sc.policies else list(DEFAULT_POLICIES)


def resolve_policy(sc: Scenario, name: str) -> tuple[str, dict]:
    """A policy name -> (built-in policy, PolicyConfig overrides of a scenario variant)."""
    v = (sc.variants or {}).get(name)
    if v is None:
        if name not in POLICY_NAMES:
            known = list(POLICY_NAMES) + list(sc.variants or {})
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
        return name, {}
    base = v.get("policy")
    if base not in POLICY_NAMES:
        raise ValueError(f"variant {name!r}: 'policy' must be one of {', '.join(POLICY_NAMES)}, got {base!r}")
    return str(base), dict(v.get("policy_config") or {})


def _fresh(engines: list[_Engine]) -> list[_Engine]:
    """Same policies (their learned state persists), empty queues: a new load level."""
    return [_Engine(e.idx, e.policy, e.max_running, e.kv_cap) for e in engines]


def run_frontier(sc: Scenario, *, policies: Optional[Sequence[str]] = None, backend: str | Backend = "planner",
                 arrival: str = "closed", levels: Optional[Sequence[float]] = None,
                 progress: Optional[Callable[[str], None]] = None) -> list[LevelResult]:
    """Every policy at every level, in increasing load; a policy's learned state persists over
    the sweep (one server per configuration, as in ``benchmarks/worker_bench.py``)."""
    be = backend if isinstance(backend, Backend) else resolve_backend(backend)
    policies = list(policies) if policies else scenario_policies(sc)
    cost = build_cost(sc)
    table = _upstream_table(sc, cost) if any(resolve_policy(sc, p)[0] == "upstream" for p in policies) else None
    domains = _domains(sc)
    levels = list(levels or sc.levels)
    finite = sc.workload.requests_per_user is not None and arrival == "closed"
    out: list[LevelResult] = []
    for pi, name in enumerate(policies):
        shared: dict = {}
        engines = _make_engines(sc, cost, name, be, shared, table, sc.seed)
        t = 0.0
        warm_sc = sc
        if sc.warmup_requests_per_user is not None and finite:
            warm_sc = replace(sc, workload=replace(sc.workload, requests_per_user=int(sc.warmup_requests_per_user)))
        for wi, wlv in enumerate(_warmup_levels(sc)):
            w = _Run(warm_sc, cost, domains, _fresh(engines), arrival="closed", level=float(wlv), t0=t,
                     seed=sc.seed + 999 + wi, steps=None if finite else sc.warmup_steps, warmup_steps=0,
                     drift=Drift(), drift_at_step=None, prompt_scale_after_drift=1.0)
            t = w.run(be)
        for lv in levels:
            t0 = _time.perf_counter()
            run = _Run(sc, cost, domains, _fresh(engines), arrival=arrival, level=float(lv), t0=t, seed=sc.seed,
                       steps=None if finite else sc.steps,
                       warmup_steps=0 if finite else int(sc.warmup_frac * sc.steps), drift=Drift(),
                       drift_at_step=None, prompt_scale_after_drift=1.0)
            sw0 = _gate_switches(run.engines)
            t = run.run(be)
            res = _level_metrics(run, name, [e.policy for e in run.engines],
                                 sc.sla_floor if resolve_policy(sc, name)[0] == "sla" else None,
                                 _time.perf_counter() - t0)
            if sw0 is not None:
                res.gate_switches = _gate_switches(run.engines) - sw0
            out.append(res)
            if progress:
                progress(f"[{pi + 1}/{len(policies)}] {name:>10} {arrival} {lv:>6g}: {res.throughput:10.1f} tok/s, "
                         f"{res.per_user:7.1f} tok/s/user, budget/req {res.budget_per_request:4.2f}, "
                         f"tau {res.tau:4.2f}, no-draft {100 * res.no_draft_frac:3.0f}% ({res.wall_s:.1f}s)")
    return out


def _gate_switches(engines: list[_Engine]) -> Optional[int]:
    """Switches of the engines' drafting gates so far (None: no gate)."""
    sums = [g for g in (e.policy.gate_summary() for e in engines) if g is not None]
    return sum(sum(g["switches"].values()) for g in sums) if sums else None


def _warmup_levels(sc: Scenario) -> list[int]:
    """The warm-up levels of a scenario: none, one, or a ramp (validated: positive integers)."""
    wl = sc.warmup_level
    if not wl:
        return []
    levels = list(wl) if isinstance(wl, (list, tuple)) else [wl]
    out = []
    for x in levels:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or int(x) != x or int(x) < 1:
            raise ValueError(f"warmup_level must be a positive integer or a list of them, got {wl!r}")
        out.append(int(x))
    return out


@dataclass
class Timeline:
    policy: str
    step: list          # window centres (engine-0 decode steps)
    throughput: list    # output tokens/s per window (all engines)
    budget_per_request: list
    quality: list       # mean decision quality per window (1 = oracle's budget on the true curve)
    model_error: list   # learned profile vs true curve at the end of each window (None: no learned profile)
    drift_step: int
    before: float       # mean tokens/s over the quarter of the run just before the drift
    after: float        # mean tokens/s over the last quarter
    quality_before: float
    quality_after: float
    summary: dict


def run_timeline(sc: Scenario, *, concurrency: int, drift: Drift, drift_at_frac: float = 0.5, steps: int = 6000,
                 policies: Sequence[str] = ("upstream", "online", "oracle"), backend: str | Backend = "planner",
                 windows: int = 40, progress: Optional[Callable[[str], None]] = None) -> list[Timeline]:
    """One long closed-loop run per policy (from a cold start) at ``concurrency``; at
    ``drift_at_frac`` of the decode steps the true curve moves (``drift``) and prompts of later
    requests grow by ``drift.context_growth``. Windows are in engine-0 decode steps, so the
    drift sits at the same x for every policy."""
    be = backend if isinstance(backend, Backend) else resolve_backend(backend)
    cost = build_cost(sc)
    table = _upstream_table(sc, cost) if any(resolve_policy(sc, p)[0] == "upstream" for p in policies) else None
    domains = _domains(sc)
    drift_step = int(drift_at_frac * steps)
    every = max(1, steps // windows)
    out = []
    for name in policies:
        shared: dict = {}
        engines = _make_engines(sc, cost, name, be, shared, table, sc.seed)
        t0w = _time.perf_counter()
        run = _Run(sc, cost, domains, engines, arrival="closed", level=float(concurrency), t0=0.0, seed=sc.seed,
                   steps=steps, warmup_steps=0, drift=replace(drift, at_s=None), drift_at_step=drift_step,
                   prompt_scale_after_drift=drift.context_growth, record_timeline=True)
        pol0 = engines[0].policy
        errs: dict[int, float] = {}
        orig = run.decode_step

        def wrapped(eng, now, _orig=orig, _run=run, _errs=errs, _pol=pol0):
            dt = _orig(eng, now)
            if eng.idx == 0:
                _run.step_ends.append(now + dt)
                m = getattr(_pol, "decision_model", None)
                if m is not None and eng.decode_steps % every == 0 and m.ready:
                    _run.t_end = now + dt
                    _errs[eng.decode_steps] = _model_error(_run, m)
            return dt
        run.step_ends = [0.0]  # type: ignore[attr-defined]
        run.decode_step = wrapped  # type: ignore[method-assign]
        run.run(be)
        ends = np.asarray(run.step_ends)  # type: ignore[attr-defined]
        rec = np.asarray(run.records, dtype=np.float64).reshape(-1, _NREC)
        q = np.asarray(run.quality, dtype=np.float64).reshape(-1, 2)
        nwin = max(1, (len(ends) - 1) // every)
        thr, bud, qual, me, centres = [], [], [], [], []
        for k in range(nwin):
            lo_s, hi_s = k * every, (k + 1) * every
            t_lo, t_hi = ends[lo_s], ends[min(hi_s, len(ends) - 1)]
            m = (rec[:, 0] > t_lo) & (rec[:, 0] <= t_hi)
            thr.append(float(rec[m, 5].sum() / (t_hi - t_lo)) if t_hi > t_lo else 0.0)
            d = rec[m & (rec[:, 2] == 0)]
            bud.append(float(np.mean(d[:, 4] / d[:, 3])) if len(d) else 0.0)
            qm = (q[:, 0] >= lo_s) & (q[:, 0] < hi_s)
            qual.append(float(q[qm, 1].mean()) if qm.any() else None)
            me.append(errs.get(hi_s))
            centres.append(0.5 * (lo_s + hi_s))
        quarter = max(1, nwin // 4)
        kd = drift_step // every
        sl_before = slice(max(0, kd - quarter), max(1, kd))

        def mean(xs: list) -> float:
            v = [x for x in xs if x is not None]
            return float(np.mean(v)) if v else float("nan")
        tl = Timeline(policy=name, step=centres, throughput=thr, budget_per_request=bud, quality=qual,
                      model_error=me, drift_step=drift_step, before=mean(thr[sl_before]), after=mean(thr[-quarter:]),
                      quality_before=mean(qual[sl_before]), quality_after=mean(qual[-quarter:]),
                      summary={"sources": _sources([e.policy for e in engines]), "window_steps": every,
                               "wall_s": round(_time.perf_counter() - t0w, 2)})
        out.append(tl)
        if progress:
            progress(f"timeline {name:>10}: before drift {tl.before:9.1f} tok/s (quality {tl.quality_before:.3f}), "
                     f"end {tl.after:9.1f} tok/s (quality {tl.quality_after:.3f}) ({_time.perf_counter() - t0w:.1f}s)")
    return out


def _sources(pols: list) -> dict:
    src: dict = {}
    for p in pols:
        for k, v in p.state().get("sources", {}).items():
            src[k] = src.get(k, 0) + v
    return src


def frontier_anchors(results: Sequence[LevelResult], anchors: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Throughput at each per-user anchor S, per policy: the best of the measured points with
    per-user rate >= S and of linear interpolations between neighbouring levels straddling S
    (None when no level reaches S)."""
    by: dict[str, list[LevelResult]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for pol, rs in by.items():
        rs = sorted(rs, key=lambda r: r.level)
        row: dict[str, Any] = {}
        for s in anchors:
            best: Optional[float] = None
            for r in rs:
                if r.per_user >= s:
                    best = r.throughput if best is None else max(best, r.throughput)
            for a, b in zip(rs, rs[1:]):
                lo, hi = sorted((a, b), key=lambda r: r.per_user)
                if lo.per_user < s <= hi.per_user and hi.per_user > lo.per_user:
                    f = (s - lo.per_user) / (hi.per_user - lo.per_user)
                    v = lo.throughput + f * (hi.throughput - lo.throughput)
                    best = v if best is None else max(best, v)
            row[f"{s:g}"] = best
        out[pol] = row
    return out


# ------------------------------------------------------------------ command line
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class SimUsageError(Exception):
    """Bad ``simulate`` input (exit code 2)."""


def _csv(text: Optional[str], kind: type, what: str) -> Optional[list]:
    if text is None:
        return None
    try:
        vals = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise SimUsageError(f"{what}: {text!r} is not a comma-separated list") from None
    if not vals:
        raise SimUsageError(f"{what}: empty list")
    return vals


def add_subcommand(sub: Any) -> None:
    """Register ``simulate`` on the ``dspark-controller`` subparsers."""
    p = sub.add_parser(
        "simulate", help="fleet what-if simulator: budget policies on simulated engines (frontier plots)",
        description="Discrete-event simulation of serving engines under a request load, comparing DSpark "
                    "verify-budget policies (run through the worker's and controller's own code). Writes "
                    "frontier.png (tokens/s vs tokens/s per user), budget.png (budget per request vs load), "
                    "timeline.png (with --drift-*), results.md and results.json. Results from the roofline "
                    "cost model are MODELLED, not measured.")
    p.add_argument("--scenario", default="gpu-70b-h200",
                   help=f"built-in ({', '.join(SCENARIOS)}) or a scenario JSON file (default: %(default)s)")
    p.add_argument("--out", default="sim-out", help="output directory (default: %(default)s)")
    p.add_argument("--prefix", default="", help="prefix for the output file names")
    p.add_argument("--policies", help=f"comma list from {', '.join(POLICY_NAMES)} "
                                      f"(default: {','.join(DEFAULT_POLICIES)})")
    p.add_argument("--levels", help="closed-loop concurrencies, or Poisson rates with --arrival poisson")
    p.add_argument("--arrival", choices=("closed", "poisson"), default="closed")
    p.add_argument("--steps", type=int, help="decode steps per level (engine 0)")
    p.add_argument("--engines", type=int, help="engines sharing the load (least-loaded routing)")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--sla-floor", type=float, help="floor (tokens/s per user) of the 'sla' policy")
    p.add_argument("--anchors", help="per-user SLA anchors for the throughput table, e.g. 80,120")
    p.add_argument("--budget-code", choices=("auto", "worker", "planner"), default="auto",
                   help="worker: run the one policy (dspark_controller.core.policy.BudgetPolicy) with SGLang's own budget/top-K code "
                        "(imports SGLang, ~15 s); planner: dspark_controller.core.method only; auto: worker if "
                        "SGLang imports (default)")
    p.add_argument("--send-verify-lens", action=argparse.BooleanOptionalAction, default=None,
                   help="controller telemetry includes each request's verify length, as the worker's "
                        "ControllerLink sends it (the scenario's default: on); --no-send-verify-lens "
                        "simulates the older telemetry without it")
    p.add_argument("--no-frontier", action="store_true", help="skip the load sweep (timeline only)")
    p.add_argument("--drift-scale", type=float, default=None, help="timeline: whole curve x this mid-run, e.g. 1.3")
    p.add_argument("--drift-marginal", type=float, default=None,
                   help="timeline: cost per extra verified token x this mid-run, e.g. 1.3")
    p.add_argument("--context-growth", type=float, default=None,
                   help="timeline: prompts of requests arriving after the drift point x this, e.g. 4")
    p.add_argument("--drift-at", type=float, default=0.5, help="timeline: drift at this fraction of the steps")
    p.add_argument("--concurrency", type=int, default=64, help="timeline: closed-loop users (default 64)")
    p.add_argument("--timeline-steps", type=int, default=6000, help="timeline: decode steps (default 6000)")
    p.add_argument("--timeline-policies", default="upstream,online,controller,oracle")
    p.add_argument("--list", action="store_true", help="list built-in scenarios, GPUs and models, then exit")
    p.add_argument("--json", action="store_true", help="print the anchor table and paths as JSON")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: Any) -> int:
    import sys

    try:
        return _cmd_simulate(args)
    except (SimUsageError, ValueError, OSError) as exc:
        print(f"dspark-controller simulate: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _cmd_simulate(args: Any) -> int:
    import sys

    from dspark_controller.sim.report import write_outputs
    from dspark_controller.sim.roofline import GPUS, MODELS

    if args.list:
        for name, mk in SCENARIOS.items():
            print(f"scenario {name}: {mk().description}")
        print("GPUs: " + ", ".join(f"{k} ({v.name})" for k, v in GPUS.items()))
        print("models: " + ", ".join(f"{k} ({v.name})" for k, v in MODELS.items()))
        return EXIT_OK
    sc = load_scenario(args.scenario)
    over: dict[str, Any] = {}
    if args.steps is not None:
        if args.steps < 10:
            raise SimUsageError("--steps must be >= 10")
        over["steps"] = args.steps
        over["warmup_steps"] = min(sc.warmup_steps, max(10, args.steps // 3))
    if args.engines is not None:
        if args.engines < 1:
            raise SimUsageError("--engines must be >= 1")
        over["engines"] = args.engines
    if args.seed is not None:
        over["seed"] = args.seed
    if args.sla_floor is not None:
        over["sla_floor"] = args.sla_floor
    if args.anchors is not None:
        over["anchors"] = _csv(args.anchors, float, "--anchors")
    if args.send_verify_lens is not None:
        over["send_verify_lens"] = bool(args.send_verify_lens)
    sc = replace(sc, **over) if over else sc
    policies = _csv(args.policies, str, "--policies") or scenario_policies(sc)
    known = list(POLICY_NAMES) + list(sc.variants or {})
    bad = [p for p in policies if p not in known]
    if bad:
        raise SimUsageError(f"unknown policy {bad[0]!r}; known: {', '.join(known)}")
    levels = _csv(args.levels, float, "--levels")
    if levels and any(x <= 0 for x in levels):
        raise SimUsageError("--levels must be positive")
    say = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    be = resolve_backend(args.budget_code)
    say(f"scenario {sc.name}; budget code: {be.name} "
        f"({'BudgetPolicy + SGLang table/top-K' if be.name == 'worker' else 'BudgetPolicy + dspark_controller.core.method'})")
    cost = build_cost(sc)
    t0 = _time.perf_counter()
    results: list[LevelResult] = []
    if not args.no_frontier:
        results = run_frontier(sc, policies=policies, backend=be, arrival=args.arrival,
                               levels=[int(x) if args.arrival == "closed" else x for x in levels] if levels else None,
                               progress=say)
    timelines: list = []
    drift_desc = ""
    if any(v is not None for v in (args.drift_scale, args.drift_marginal, args.context_growth)):
        drift = Drift(scale=args.drift_scale or 1.0, marginal=args.drift_marginal or 1.0,
                      context_growth=args.context_growth or 1.0)
        drift_desc = (f"at {args.drift_at:g} of {args.timeline_steps} steps, concurrency {args.concurrency}: "
                      f"curve x{drift.scale:g}, marginal token cost x{drift.marginal:g}, prompts x{drift.context_growth:g}")
        tpols = _csv(args.timeline_policies, str, "--timeline-policies")
        bad = [p for p in tpols if p not in known]
        if bad:
            raise SimUsageError(f"unknown policy {bad[0]!r}")
        timelines = run_timeline(sc, concurrency=args.concurrency, drift=drift, drift_at_frac=args.drift_at,
                                 steps=args.timeline_steps, policies=tpols, backend=be, progress=say)
    anchors_tab = frontier_anchors(results, sc.anchors) if results else {}
    meta = {"command": "dspark-controller " + " ".join(getattr(args, "_argv", []) or []),
            "budget_code": be.name, "arrival": args.arrival, "elapsed_s": round(_time.perf_counter() - t0, 1),
            "drift_desc": drift_desc, "domains": [d.summary(sc.gamma) for d in _domains(sc)]}
    paths = write_outputs(args.out, scenario=sc, cost_desc=cost.describe(), results=results, anchors_tab=anchors_tab,
                          timelines=timelines, meta=meta, modelled=bool(getattr(cost, "modelled", True)),
                          prefix=args.prefix)
    if args.json:
        print(json.dumps({"anchors": anchors_tab, "paths": paths, "budget_code": be.name}))
    else:
        print(Path(paths["table"]).read_text())
        for k, v in paths.items():
            print(f"{k}: {v}")
    return EXIT_OK
