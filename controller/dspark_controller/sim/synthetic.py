"""Synthetic engines with known step-time curves, for tests and the benchmark.

A :class:`TrueCurve` is a ground-truth step time t(R, B) (seconds). :func:`synth_step`
draws one decode step the way a DSpark worker under a random budget would report it:
R running requests, a random draft-token budget K spread over the requests, accepted
lengths drawn from true per-position acceptance, and a measured time with log-normal
noise and occasional outliers (GC pauses, preemption). :func:`decision_quality` scores
a learned curve by the true throughput of the plan it leads to, against the plan made
with the true curve (the oracle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from dspark_controller.core.method import compute_lagged_budget, expected_throughput, plan_exact

__all__ = ["TrueCurve", "CURVES", "DEFAULT_ACCEPTANCE", "SynthStep", "synth_step", "decision_quality",
           "random_confidences", "learned_sps"]

DEFAULT_ACCEPTANCE = (0.86, 0.82, 0.78, 0.74, 0.70, 0.66, 0.62)


@dataclass(frozen=True)
class TrueCurve:
    """t(R, B) = base + per_token*B + quad*B^2 + per_request*R + jump*floor(B/jump_every)."""

    name: str
    base_s: float = 0.012
    per_token_s: float = 1.5e-5
    quad_s: float = 0.0
    per_request_s: float = 4e-5
    jump_s: float = 0.0
    jump_every: int = 48

    def step_time(self, num_requests: Any, batch_tokens: Any) -> Any:
        r = np.asarray(num_requests, dtype=np.float64)
        b = np.asarray(batch_tokens, dtype=np.float64)
        t = self.base_s + self.per_token_s * b + self.quad_s * b * b + self.per_request_s * r
        if self.jump_s:
            t = t + self.jump_s * np.floor(b / self.jump_every)
        return float(t) if np.ndim(t) == 0 else t

    def sps_function(self, num_requests: int, *, mult: float = 1.0) -> Callable[[Any], Any]:
        return lambda b: 1.0 / (mult * self.step_time(np.full(np.shape(b), num_requests), b))


CURVES = {
    "smooth": TrueCurve(name="smooth", base_s=0.012, per_token_s=1.5e-5, quad_s=2e-8, per_request_s=4e-5),
    "jagged": TrueCurve(name="jagged", base_s=0.010, per_token_s=5e-6, per_request_s=3e-5,
                        jump_s=0.0015, jump_every=48),
}


@dataclass(frozen=True)
class SynthStep:
    num_requests: int
    verify_tokens: int
    step_time_s: float
    accepted_lens: list[int]
    verify_lens: list[int]


def synth_step(rng: np.random.Generator, curve: TrueCurve, *, gamma: int = 7, max_requests: int = 64,
               min_requests: int = 1, acceptance: tuple[float, ...] = DEFAULT_ACCEPTANCE,
               noise_sigma: float = 0.03, outlier_prob: float = 0.01, mult: float = 1.0) -> SynthStep:
    R = int(rng.integers(min_requests, max_requests + 1))
    slots = R * gamma
    K = int(rng.integers(0, slots + 1))
    ver = np.bincount(rng.choice(slots, size=K, replace=False) // gamma, minlength=R) if K else np.zeros(R, np.int64)
    acc_p = np.asarray(acceptance[:gamma], dtype=np.float64)
    ok = rng.random((R, gamma)) < acc_p
    first_fail = np.where(ok.all(axis=1), gamma, np.argmin(ok, axis=1))
    acc = np.minimum(first_fail, ver)
    B = R + K
    t = curve.step_time(R, B) * mult * float(rng.lognormal(0.0, noise_sigma))
    if outlier_prob and rng.random() < outlier_prob:
        t *= float(rng.uniform(2.0, 4.0))
    return SynthStep(num_requests=R, verify_tokens=B, step_time_s=t, accepted_lens=acc.tolist(),
                     verify_lens=ver.tolist())


def decision_quality(learned_sps: Callable[[Any], Any], true_sps: Callable[[Any], Any], confidences: Any, *,
                     algorithm: str = "lagged") -> float:
    """True throughput of the learned-curve plan / true throughput of the oracle plan."""
    if algorithm == "lagged":
        k_learned = compute_lagged_budget(confidences, learned_sps).budget_tokens
        k_oracle = compute_lagged_budget(confidences, true_sps).budget_tokens
        from dspark_controller.core.method import plan_lagged

        p_l = plan_lagged(confidences, learned_sps, budget=k_learned)
        p_o = plan_lagged(confidences, true_sps, budget=k_oracle)
    else:
        p_l = plan_exact(confidences, learned_sps, max_trace=0)
        p_o = plan_exact(confidences, true_sps, max_trace=0)
    got = expected_throughput(confidences, p_l.lengths, true_sps)
    best = expected_throughput(confidences, p_o.lengths, true_sps)
    return got / best if best > 0 else 1.0


def random_confidences(rng: np.random.Generator, num_requests: int, gamma: int,
                       *, low: float = 0.3, high: float = 0.98) -> np.ndarray:
    """Per-request confidences, each request with its own mean level."""
    level = rng.uniform(low, high, size=(num_requests, 1))
    return np.clip(level + rng.normal(0.0, 0.08, size=(num_requests, gamma)), 0.0, 1.0)


def learned_sps(model: Any, num_requests: int) -> Optional[Callable[[Any], Any]]:
    return model.sps_function(num_requests) if model.ready else None
