"""Analytic step-time models for the fleet simulator (MODELLED, not measured).

Two cost models give the time of one engine step as the simulator needs it:

* :class:`RooflineCost`: a roofline model of a named GPU (or several, tensor/expert
  parallel) serving a named model. Every forward pass over ``T`` tokens costs

      max(bytes_read / (HBM_bw * mem_eff), flops / (peak * flop_eff)) + comm + overhead

  with ``bytes_read`` = the weights actually read (all dense weights; for an MoE the
  routed experts touched by ``T`` tokens, expected fraction ``1 - (1 - k/E)^T``) plus the
  KV cache of every running request (read once per forward, so it grows with context),
  and ``flops`` = ``2 * active_params * T`` plus attention over the context
  (``attn_flops_per_ctx`` per query token per context token). ``comm`` is two
  collectives per layer (latency + activation bytes over NVLink) when ``num_gpus > 1``.
  A DSpark step is one target forward over ``B = R + K`` tokens plus one drafter forward
  over ``R * gamma`` positions (``draft_layers`` target-shaped dense layers and the shared
  LM head, reading the drafter's own context KV); an MTP-1 step is a target forward over
  ``2R`` tokens plus one MTP module (one layer + LM head) over ``R`` tokens; no
  speculation is a target forward over ``R`` tokens, and so is a DSpark engine's no-draft
  step (the draft cost is the separate drafter forward: drafted = target(B) + draft(R),
  no-draft = target(R)). Fixed per-step overheads (scheduler,
  sampling, launches) and a per-request term are added. Prefill is a target + drafter
  forward over the prompt tokens with quadratic attention.
* :class:`ProfileCost`: a measured SPS profile (DSpark profile file or SGLang table) that
  gives the DSpark step time t(R, B) directly; no-speculation and MTP-1 steps are
  derived from it with documented factors (see the class).

Both accept a context-length term and a :class:`Drift` (the true curve moving mid-run).
All numbers here are public datasheet figures and assumptions, listed in
``docs/simulator.md``; results computed with :class:`RooflineCost` are labelled MODELLED.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np

__all__ = ["GpuSpec", "ModelSpec", "GPUS", "MODELS", "RooflineCost", "ProfileCost", "Drift", "CostModel", "build_roofline"]


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet numbers of one GPU (dense tensor-core peak, no sparsity)."""

    name: str
    bf16_tflops: float
    hbm_tb_s: float
    hbm_gb: float
    nvlink_gb_s: float = 450.0       # per direction, per GPU
    fp8: bool = True                 # fp8 tensor cores (2x the bf16 peak)


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("A100-SXM4-80GB", 312.0, 2.039, 80.0, 300.0, fp8=False),
    "h100": GpuSpec("H100-SXM5-80GB", 989.0, 3.35, 80.0, 450.0),
    "h200": GpuSpec("H200-SXM-141GB", 989.0, 4.8, 141.0, 450.0),
    "b200": GpuSpec("B200-SXM-180GB", 2250.0, 8.0, 180.0, 900.0),
    "l40s": GpuSpec("L40S-48GB", 362.0, 0.864, 48.0, 32.0),
    "mi300x": GpuSpec("MI300X-192GB", 1307.0, 5.3, 192.0, 448.0),
}


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a served model (from its public config). Parameter counts in billions.

    ``attn_flops_per_ctx``: attention FLOPs per query token per context token (GQA:
    ``4 * layers * q_heads * head_dim``; MLA, absorbed: ``2 * layers * heads * (576 + 512)``).
    ``kv_elems_per_token``: KV-cache elements stored per token over all layers.
    ``draft_layer_params_b``: one target-shaped dense layer (the drafter's layers and the
    MTP module are modelled as this many parameters each).
    """

    name: str
    params_b: float
    layers: int
    hidden: int
    vocab: int
    kv_elems_per_token: int
    attn_flops_per_ctx: float
    draft_layer_params_b: float
    embed_params_b: float = 0.0       # input embedding: read sparsely, not per forward
    moe_experts: int = 0              # routed experts per MoE layer (0 = dense)
    moe_top_k: int = 0
    moe_routed_params_b: float = 0.0  # all routed experts, all layers

    @property
    def dense_params_b(self) -> float:
        return self.params_b - self.moe_routed_params_b - self.embed_params_b

    @property
    def active_params_b(self) -> float:
        if not self.moe_experts:
            return self.params_b - self.embed_params_b
        return self.dense_params_b + self.moe_routed_params_b * self.moe_top_k / self.moe_experts

    @property
    def lm_head_params_b(self) -> float:
        return self.vocab * self.hidden / 1e9

    def expert_fraction(self, tokens: float) -> float:
        """Expected fraction of routed experts touched by ``tokens`` tokens (uniform routing)."""
        if not self.moe_experts:
            return 0.0
        return 1.0 - (1.0 - self.moe_top_k / self.moe_experts) ** np.maximum(tokens, 0.0)


def _gqa(layers: int, q_heads: int, kv_heads: int, head_dim: int) -> tuple[int, float]:
    return 2 * layers * kv_heads * head_dim, 4.0 * layers * q_heads * head_dim


_Q8 = _gqa(36, 32, 8, 128)
_Q32 = _gqa(64, 64, 8, 128)
_L70 = _gqa(80, 64, 8, 128)
MODELS: dict[str, ModelSpec] = {
    # Qwen3-8B: 36 layers, hidden 4096, 32 q / 8 kv heads x 128, FFN 12288, vocab 151936
    "qwen3-8b": ModelSpec("Qwen3-8B", 8.19, 36, 4096, 151936, _Q8[0], _Q8[1], 0.193, embed_params_b=0.622),
    # Qwen3-32B: 64 layers, hidden 5120, 64 q / 8 kv heads x 128, FFN 25600
    "qwen3-32b": ModelSpec("Qwen3-32B", 32.8, 64, 5120, 151936, _Q32[0], _Q32[1], 0.487, embed_params_b=0.778),
    # Llama-3.1-70B: 80 layers, hidden 8192, 64 q / 8 kv heads x 128, FFN 28672, vocab 128256
    "llama-70b": ModelSpec("Llama-3.1-70B", 70.6, 80, 8192, 128256, _L70[0], _L70[1], 0.856, embed_params_b=1.05),
    # DeepSeek-V3 (671B, 37B active): 61 layers (58 MoE, 256 routed experts, top-8,
    # expert FFN 2048), hidden 7168, MLA (512 latent + 64 rope per token per layer)
    "deepseek-v3": ModelSpec("DeepSeek-V3-671B", 671.0, 61, 7168, 129280, 61 * 576, 2.0 * 61 * 128 * (576 + 512),
                             0.58, embed_params_b=0.927, moe_experts=256, moe_top_k=8,
                             moe_routed_params_b=256 * 58 * 3 * 7168 * 2048 / 1e9),
}


@dataclass(frozen=True)
class Drift:
    """The true step-time curve moving mid-run.

    From simulated time ``at_s`` on (``None``: never), every step time becomes
    ``scale * (t(R, R) + marginal * (t(R, B) - t(R, R)))``: ``scale`` slows the whole
    curve (clocks, co-tenancy), ``marginal`` the cost of each extra verified token
    (compute roof moving). ``context_growth``: prompt lengths of requests arriving after
    ``at_s`` are multiplied by this factor (context lengths grow; the KV term follows).
    """

    at_s: Optional[float] = None
    scale: float = 1.0
    marginal: float = 1.0
    context_growth: float = 1.0

    def active(self, now: float) -> bool:
        return self.at_s is not None and now >= self.at_s

    def apply(self, now: float, t_b: float, t_r: float) -> float:
        if not self.active(now):
            return t_b
        return self.scale * (t_r + self.marginal * (t_b - t_r))


class CostModel:
    """Interface: seconds for one step. ``kind`` is ``nospec`` | ``mtp1`` | ``dspark``."""

    label = "model"
    modelled = True

    def decode(self, kind: str, R: int, B: int, ctx_sum: float, gamma: int) -> float:
        raise NotImplementedError

    def prefill(self, prompt_lens: list[int], running: int, gamma: int) -> float:
        raise NotImplementedError

    def kv_capacity_tokens(self) -> Optional[float]:
        return None

    def describe(self) -> dict[str, Any]:
        return {}


@dataclass
class RooflineCost(CostModel):
    """Roofline step time (see the module docstring). All times in seconds."""

    gpu: GpuSpec
    model: ModelSpec
    num_gpus: int = 1
    dtype: str = "bf16"              # weights: bf16 | fp8
    kv_dtype: str = ""               # default: same as dtype
    mem_eff: float = 0.80            # achieved fraction of HBM bandwidth
    flop_eff: float = 0.60           # achieved fraction of tensor-core peak
    comm_latency_s: float = 8e-6     # per collective (two per layer when num_gpus > 1)
    step_overhead_s: float = 1.5e-3  # DSpark step: scheduler, sampling, launches, sequential head
    nospec_overhead_s: float = 0.8e-3
    mtp_overhead_s: float = 1.2e-3
    per_request_s: float = 4e-6      # per running request per step (bookkeeping, sampling)
    draft_layers: int = 1            # DSpark drafter depth (target-shaped dense layers)
    prefill_overhead_s: float = 2e-3
    mem_reserve_frac: float = 0.10   # HBM kept free (activations, graphs, fragmentation)
    label: str = "roofline"

    modelled = True

    def _bpp(self, which: str = "w") -> float:
        d = self.dtype if which == "w" or not self.kv_dtype else self.kv_dtype
        return 1.0 if d == "fp8" else 2.0

    def _peak(self) -> float:
        mult = 2.0 if (self.dtype == "fp8" and self.gpu.fp8) else 1.0
        return self.gpu.bf16_tflops * 1e12 * mult * self.flop_eff * self.num_gpus

    def _bw(self) -> float:
        return self.gpu.hbm_tb_s * 1e12 * self.mem_eff * self.num_gpus

    def _comm(self, tokens: float, layers: int) -> float:
        if self.num_gpus <= 1:
            return 0.0
        act = tokens * self.model.hidden * 2.0
        return layers * 2 * (self.comm_latency_s + act / (self.gpu.nvlink_gb_s * 1e9))

    def target_forward(self, tokens: float, ctx_sum: float, attn_pairs: float) -> float:
        """One target forward over ``tokens`` tokens; ``ctx_sum`` context tokens whose KV is
        read; ``attn_pairs`` (query, context) token pairs for the attention FLOPs."""
        m = self.model
        wb = (m.dense_params_b + m.moe_routed_params_b * m.expert_fraction(tokens)) * 1e9 * self._bpp()
        kv = ctx_sum * m.kv_elems_per_token * self._bpp("kv")
        flops = 2.0 * m.active_params_b * 1e9 * tokens + m.attn_flops_per_ctx * attn_pairs
        return np.maximum((wb + kv) / self._bw(), flops / self._peak()) + self._comm(tokens, m.layers)

    def _draft_params(self, layers: int) -> float:
        return (layers * self.model.draft_layer_params_b + self.model.lm_head_params_b) * 1e9

    def draft_forward(self, tokens: float, ctx_sum: float, layers: int) -> float:
        m = self.model
        p = self._draft_params(layers)
        kv_per_tok = m.kv_elems_per_token / m.layers * layers
        wb = p * self._bpp() + ctx_sum * kv_per_tok * self._bpp("kv")
        flops = 2.0 * p * tokens
        return np.maximum(wb / self._bw(), flops / self._peak()) + self._comm(tokens, layers)

    def decode(self, kind: str, R: int, B: Any, ctx_sum: float, gamma: int) -> Any:
        """Seconds for one decode step (``B`` may be an array for the DSpark kind)."""
        R = max(int(R), 1)
        avg_ctx = ctx_sum / R
        if kind == "nospec":
            return (self.target_forward(R, ctx_sum, R * avg_ctx) + self.nospec_overhead_s
                    + self.per_request_s * R)
        if kind == "mtp1":
            return (self.target_forward(2 * R, ctx_sum, 2 * R * avg_ctx)
                    + self.draft_forward(R, ctx_sum, 1) + self.mtp_overhead_s + self.per_request_s * R)
        return (self.target_forward(B, ctx_sum, B * avg_ctx)
                + self.draft_forward(R * gamma, ctx_sum, self.draft_layers)
                + self.step_overhead_s + self.per_request_s * R)

    def prefill(self, prompt_lens: list[int], running: int, gamma: int) -> float:
        n = float(sum(prompt_lens))
        pairs = float(sum(0.5 * L * L for L in prompt_lens))
        return (self.target_forward(n, 0.0, pairs) + self.draft_forward(n, 0.0, max(self.draft_layers, 1))
                + self.prefill_overhead_s)

    def weight_bytes(self) -> float:
        m = self.model
        return (m.params_b + self.draft_layers * m.draft_layer_params_b) * 1e9 * self._bpp()

    def kv_capacity_tokens(self) -> Optional[float]:
        m = self.model
        free = self.gpu.hbm_gb * 1e9 * self.num_gpus * (1.0 - self.mem_reserve_frac) - self.weight_bytes()
        per_tok = (m.kv_elems_per_token * (1.0 + self.draft_layers / m.layers)) * self._bpp("kv")
        return max(free, 0.0) / per_tok

    def describe(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("gpu", "model")}
        d["gpu"] = asdict(self.gpu)
        d["model"] = asdict(self.model)
        d["model"]["active_params_b"] = round(self.model.active_params_b, 3)
        d["kv_capacity_tokens"] = int(self.kv_capacity_tokens() or 0)
        d["note"] = "MODELLED: roofline estimate, not a measurement"
        return d


@dataclass
class ProfileCost(CostModel):
    """Step time from a measured SPS curve ``t(R, B)`` of a DSpark engine.

    * DSpark step: ``t(R, B)`` (the profile measures whole steps: draft + verify + overhead).
    * No speculation: ``nospec_frac * t(R, R)`` (no drafter runs; ``nospec_frac`` is the
      target-only share of a step at B = R, measured or assumed), or, when given,
      ``nospec_step_s``: measured no-speculation step seconds per running-request count
      (``{R: seconds}``), interpolated linearly in R (extrapolated from the last two points).
    * Verify-all (``verify_all`` policy, SGLang's static mode): ``t(R, R(gamma + 1))``, or,
      when given, ``static_step_s`` (``{R: seconds}`` measured in static mode, same
      interpolation): static steps skip the ragged layout and cost less than compact
      ones at the same B on some devices (2-core CPU, 2026-12-01: ~11% at R = 1, none at
      R = 4, ~8% at R = 16-32).
    * MTP-1: ``mtp_frac * t(R, 2R)``.
    * Prefill of prompts P: ``prefill_frac * t(n, sum P) + prefill_overhead_s``.
    * Context: ``+ ctx_s_per_token * sum of context lengths`` (0: the profile's own context).
    """

    step_time: Callable[[int, int], float]
    source: str = ""
    nospec_frac: float = 0.8
    mtp_frac: float = 1.0
    prefill_frac: float = 1.0
    prefill_overhead_s: float = 0.0
    ctx_s_per_token: float = 0.0
    nospec_step_s: Optional[dict] = None
    static_step_s: Optional[dict] = None
    label: str = "profile"
    modelled: bool = False

    def __post_init__(self) -> None:
        self._nospec_table = _rtable(self.nospec_step_s, "nospec_step_s")
        self._static_table = _rtable(self.static_step_s, "static_step_s")

    def _t(self, R: int, B: Any) -> Any:
        R = max(int(R), 1)
        if np.isscalar(B):
            return float(self.step_time(R, int(max(B, R))))
        b = np.maximum(np.asarray(B, dtype=np.int64), R)
        return np.asarray(self.step_time(np.full(b.shape, R), b), dtype=np.float64)

    def decode(self, kind: str, R: int, B: int, ctx_sum: float, gamma: int) -> float:
        extra = self.ctx_s_per_token * ctx_sum
        if kind == "nospec":
            if self._nospec_table is not None:
                return _interp_r(self._nospec_table, R) + extra
            return self.nospec_frac * self._t(R, R) + extra
        if kind == "mtp1":
            return self.mtp_frac * self._t(R, 2 * R) + extra
        if kind == "static" and self._static_table is not None:
            t = _interp_r(self._static_table, R) + extra
            return t if np.isscalar(B) else np.full(np.shape(B), t, dtype=np.float64)
        return self._t(R, B) + extra

    def prefill(self, prompt_lens: list[int], running: int, gamma: int) -> float:
        n = len(prompt_lens)
        return self.prefill_frac * self._t(n, max(int(sum(prompt_lens)), n)) + self.prefill_overhead_s

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "nospec_frac": self.nospec_frac, "mtp_frac": self.mtp_frac,
                "nospec_step_s": self.nospec_step_s, "static_step_s": self.static_step_s,
                "prefill_frac": self.prefill_frac, "prefill_overhead_s": self.prefill_overhead_s,
                "ctx_s_per_token": self.ctx_s_per_token,
                "note": "step times from a measured profile" + ("" if not self.modelled else " (MODELLED factors)")}


def _rtable(table: Optional[dict], name: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """``{R: seconds}`` (JSON keys may be strings) -> sorted arrays; clear errors for bad input."""
    if table is None:
        return None
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{name} must be a non-empty mapping of running-request count -> step seconds")
    pts = []
    for k, v in table.items():
        try:
            r, t = int(k), float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: entry {k!r}: {v!r} is not <integer R>: <seconds>") from None
        if r < 1 or not (t > 0 and math.isfinite(t)):
            raise ValueError(f"{name}: entry {k!r}: {v!r} needs R >= 1 and a positive finite time")
        pts.append((r, t))
    pts.sort()
    return np.array([p[0] for p in pts], dtype=np.float64), np.array([p[1] for p in pts], dtype=np.float64)


def _interp_r(table: tuple[np.ndarray, np.ndarray], R: int) -> float:
    """Linear in R between measured points; beyond them, the nearest segment's slope (one
    point: proportional to R above it, constant below). Never below 10% of the nearest point."""
    rs, ts = table
    x = float(max(int(R), 1))
    if len(rs) == 1:
        return float(ts[0] * max(x / rs[0], 1.0))
    if rs[0] < x < rs[-1]:
        return float(np.interp(x, rs, ts))
    i, edge = (0, 0) if x <= rs[0] else (len(rs) - 2, -1)       # the nearest segment, its end point
    slope = (ts[i + 1] - ts[i]) / (rs[i + 1] - rs[i])
    return float(max(ts[edge] + slope * (x - rs[edge]), 0.1 * ts[edge]))


def build_roofline(spec: dict[str, Any]) -> RooflineCost:
    """``{"gpu": "h200", "model": "llama-70b", "num_gpus": 1, "dtype": "fp8", ...}``; any
    :class:`RooflineCost` field may be overridden, and ``gpu``/``model`` may be dicts of
    :class:`GpuSpec`/:class:`ModelSpec` fields (a GPU or model not in the lists)."""
    spec = dict(spec)
    spec.pop("kind", None)
    g = spec.pop("gpu", "h200")
    m = spec.pop("model", "llama-70b")
    if isinstance(g, dict):
        gpu = GpuSpec(**g)
    elif g in GPUS:
        gpu = GPUS[g]
    else:
        raise ValueError(f"unknown GPU {g!r}; known: {', '.join(sorted(GPUS))} (or give a dict of GpuSpec fields)")
    if isinstance(m, dict):
        model = ModelSpec(**m)
    elif m in MODELS:
        model = MODELS[m]
    else:
        raise ValueError(f"unknown model {m!r}; known: {', '.join(sorted(MODELS))} (or a dict of ModelSpec fields)")
    known = set(RooflineCost.__dataclass_fields__)
    bad = set(spec) - known
    if bad:
        raise ValueError(f"unknown roofline parameter(s) {sorted(bad)}; known: {sorted(known - {'gpu', 'model'})}")
    return RooflineCost(gpu=gpu, model=model, **spec)
