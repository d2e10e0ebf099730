"""A seeded synthetic serving trace driven through a budget policy, step by step.

The harness plays the worker's part (sglang_dspark.worker + budget.OnlineBudgetPlanner):
lagged survival in, the policy's K (verify-all when it declines), the live global top-K
admission, a step time from a fixed "true" curve (a full budget runs on a cheaper uniform
path, as on CPU), and then what the worker feeds back: survival calibration, admission
gain, the step time.  Everything random comes from one seeded generator whose draws do
not depend on the policy, so two implementations of one policy give the same budgets.
``replay(make)`` returns one ``[R, K, source]`` row per step.
"""

from __future__ import annotations

import numpy as np

from dspark_controller.core.method import plan_lagged
from dspark_controller.core.strategies import UniformTimes, learn_step_time
from dspark_controller.core.sps_model import SpsModel, SpsModelConfig

GAMMA = 4
STEPS = 1500
LOADS = (1, 4, 16, 32, 8, 2, 24)


def true_step_s(R: int, B: int) -> float:
    return 0.004 + 0.0009 * B + 0.0004 * R


def uniform_step_s(R: int) -> float:
    return 0.93 * true_step_s(R, R * (GAMMA + 1))


def _unit(b):
    return 1.0 if np.isscalar(b) else np.ones(np.shape(b))


def replay(step_fn, seed: int = 0) -> list[list]:
    """``step_fn(raw_survival, R) -> (K or None, source, pred_drafts, observe)`` where
    ``observe(survival_used, accepted, verified, uniform)`` takes the outcome."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(STEPS):
        R = LOADS[(i // 120) % len(LOADS)]
        lagged_c = np.clip(rng.beta(6, 2, size=(R, GAMMA)), 0.0, 1.0)
        live_c = np.clip(lagged_c + rng.normal(0, 0.08, size=(R, GAMMA)), 0.0, 1.0)
        raw = np.cumprod(lagged_c, axis=1)
        u = rng.random((R, GAMMA))
        noise = 1.0 + 0.05 * rng.standard_normal()
        k, source, pred, observe = step_fn(raw, R)
        full = R * GAMMA
        K = full if k is None else int(k)
        lens = (np.full(R, GAMMA) if K >= full else
                np.asarray(plan_lagged(live_c, _unit, budget=K).lengths, dtype=np.int64))
        survive = np.cumprod(u < live_c, axis=1)
        accepted = [int(min(int(survive[r].sum()), int(lens[r]))) for r in range(R)]
        uniform = K >= full
        t = (uniform_step_s(R) if uniform else true_step_s(R, R + K)) * noise
        observe(accepted=accepted, verified=[int(x) for x in lens], uniform=uniform, num_req=R,
                batch_tokens=R + K, step_s=t)
        rows.append([R, K, source])
    return rows


def fresh_model() -> SpsModel:
    return SpsModel(config=SpsModelConfig(max_batch_tokens=2 * 32 * (GAMMA + 1), max_requests=32))


def learn(model, uniform_s, policy, *, num_req, batch_tokens, step_s, uniform):
    learn_step_time(model, uniform_s, policy, num_req=num_req, batch_tokens=batch_tokens,
                    step_s=step_s, uniform=uniform)


__all__ = ["replay", "fresh_model", "learn", "UniformTimes", "GAMMA"]
