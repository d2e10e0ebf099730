"""Planner: Algorithm 1 (exact, early stop), lagged variant, SLA, overrides, losslessness."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dsc_helpers import CONTROLLER_DIR  # noqa: F401  (sys.path set-up)
from dspark_controller.core.method import (PlanError, PlanPolicy, compute_lagged_budget, expected_throughput, plan, plan_exact, plan_lagged, sps_from_pairs, survival_products)

APPENDIX_A = sps_from_pairs([(1, 1.0), (2, 0.5), (3, 0.45)])


def reference_algorithm1(conf, sps):
    """Independent, literal transcription of Algorithm 1 (slow, for cross-checking)."""
    R = len(conf)
    entries = []
    for r, row in enumerate(conf):
        a = 1.0
        for j, c in enumerate(row, start=1):
            a *= c
            entries.append((a, j, r))
    entries.sort(key=lambda e: (-e[0], e[1], e[2]))
    lengths = [0] * R
    B, tau = R, float(R)
    best = R * sps(R)
    for a, j, r in entries:
        theta = (tau + a) * sps(B + 1)
        if theta > best:
            lengths[r], B, tau, best = j, B + 1, tau + a, theta
        else:
            break
    return lengths


def random_sps(rng, kind):
    if kind == "smooth":
        base, slope = rng.uniform(0.005, 0.02), rng.uniform(1e-5, 2e-3)
        return lambda b: 1.0 / (base + slope * np.asarray(b, dtype=float))
    if kind == "jagged":
        base, jump, every = rng.uniform(0.005, 0.02), rng.uniform(5e-4, 4e-3), int(rng.integers(2, 9))
        return lambda b: 1.0 / (base + jump * np.floor(np.asarray(b, dtype=float) / every))
    pairs = sorted({int(x): None for x in rng.integers(1, 60, 6)}.keys())
    return sps_from_pairs([(b, float(v)) for b, v in zip(pairs, np.sort(rng.uniform(0.1, 2.0, len(pairs)))[::-1])])


def test_appendix_a_exact_returns_zero():
    p = plan_exact([[0.8]], APPENDIX_A)
    assert list(p.lengths) == [0]
    assert p.batch_tokens == 1 and p.expected_tau == 1.0 and p.predicted_throughput == pytest.approx(1.0)
    assert any("STOP" in line for line in p.explanation)


def test_appendix_a_with_a_second_token_still_zero_but_global_argmax_verifies_two():
    # a_2 = 0.8: Theta(2 tokens) = 2.6 * 0.45 = 1.17 > 1 -- a global argmax admits both,
    # the early stop (lossless) admits none.
    assert list(plan_exact([[0.8, 1.0]], APPENDIX_A).lengths) == [0]
    assert compute_lagged_budget([[0.8, 1.0]], APPENDIX_A).budget_tokens == 2


@pytest.mark.parametrize("kind", ["smooth", "jagged", "table"])
def test_exact_matches_literal_algorithm1(kind):
    rng = np.random.default_rng({"smooth": 1, "jagged": 2, "table": 3}[kind])
    for _ in range(150):
        R, g = int(rng.integers(1, 7)), int(rng.integers(1, 6))
        conf = rng.uniform(0.0, 1.0, (R, g)).round(2).tolist()
        if rng.random() < 0.3:
            conf = [row[: int(rng.integers(0, g + 1))] for row in conf]   # jagged rows
        sps = random_sps(rng, kind)
        assert list(plan_exact(conf, sps).lengths) == reference_algorithm1(conf, lambda b: float(np.asarray(sps(b))))


def test_exact_ties_visit_positions_in_order():
    p = plan_exact([[1.0, 1.0, 1.0], [1.0]], lambda b: 1.0)     # flat SPS: everything pays
    assert list(p.lengths) == [3, 1]
    p = plan_exact([[1.0, 1.0, 1.0]], sps_from_pairs([(1, 1.0), (3, 0.6), (4, 0.1)]), max_trace=0)
    # tau grows 1 -> 2 -> 3 while SPS is 1, 1, 0.6: 1, 2, 1.8 -> stops after one token
    assert list(p.lengths) == [1]


def _admitted(lengths, r, j):
    return lengths[r] >= j


@pytest.mark.parametrize("seed", range(3))
def test_exact_is_lossless_admission_never_depends_on_later_confidences(seed):
    """Whether token j of request r is verified must not depend on c[r][j+1..] (which the draft
    computed from token j itself)."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        R, g = int(rng.integers(1, 6)), int(rng.integers(2, 6))
        conf = rng.uniform(0.2, 1.0, (R, g))
        sps = random_sps(rng, ["smooth", "jagged"][int(rng.integers(0, 2))])
        base = plan_exact(conf, sps).lengths
        for r in range(R):
            for j in range(1, g):
                pert = conf.copy()
                pert[r, j:] = rng.uniform(0.0, 1.0, g - j)        # positions j+1.. of request r
                got = plan_exact(pert, sps).lengths
                assert _admitted(got, r, j) == _admitted(base, r, j), (conf, r, j)


def test_global_argmax_on_live_confidences_is_not_lossless():
    """The property above fails for a budget computed from the live confidences (why the lagged
    variant needs old ones): token 1's admission flips with c_2."""
    hi = plan_lagged([[0.8, 1.0]], APPENDIX_A, lagged_confidences=[[0.8, 1.0]]).lengths
    lo = plan_lagged([[0.8, 0.0]], APPENDIX_A, lagged_confidences=[[0.8, 0.0]]).lengths
    assert hi[0] >= 1 and lo[0] == 0


def test_lagged_topk_with_fixed_budget_is_lossless():
    rng = np.random.default_rng(7)
    for _ in range(80):
        R, g = int(rng.integers(1, 6)), int(rng.integers(2, 6))
        conf = rng.uniform(0.2, 1.0, (R, g))
        K = int(rng.integers(0, R * g + 1))
        base = plan_lagged(conf, lambda b: 1.0, budget=K).lengths
        assert sum(base) == K
        for r in range(R):
            for j in range(1, g):
                pert = conf.copy()
                pert[r, j:] = rng.uniform(0.0, 1.0, g - j)
                assert _admitted(plan_lagged(pert, lambda b: 1.0, budget=K).lengths, r, j) == _admitted(base, r, j)


def test_lagged_budget_is_global_argmax_over_jagged_curve():
    rng = np.random.default_rng(11)
    for _ in range(100):
        R, g = int(rng.integers(1, 9)), int(rng.integers(1, 8))
        conf = rng.uniform(0.1, 1.0, (R, g))
        sps = random_sps(rng, "jagged")
        a = np.sort(np.concatenate([np.cumprod(row) for row in conf]))[::-1]
        tau = R + np.concatenate([[0.0], np.cumsum(a)])
        theta = tau * np.array([float(sps(R + k)) for k in range(a.size + 1)])
        lb = compute_lagged_budget(conf, sps)
        assert lb.budget_tokens == int(np.argmax(theta))
        assert lb.predicted_throughput == pytest.approx(theta.max())


def test_lagged_uses_lagged_budget_then_live_topk():
    old = [[0.9, 0.9], [0.9, 0.9]]
    live = [[0.1, 0.1], [0.99, 0.98]]
    sps = lambda b: 1.0 / (1.0 + 0.05 * np.asarray(b, dtype=float))   # noqa: E731
    K = compute_lagged_budget(old, sps).budget_tokens
    p = plan_lagged(live, sps, lagged_confidences=old)
    assert p.budget_tokens == K
    # the top-K live entries all belong to request 1 first
    assert p.lengths[1] == min(2, K)


def test_plan_lagged_refuses_live_budget():
    with pytest.raises(PlanError, match="earlier step"):
        plan_lagged([[0.5]], APPENDIX_A)


def test_sla_caps_budget_to_keep_slowest_user_above_floor():
    rng = np.random.default_rng(5)
    conf = np.vstack([rng.uniform(0.9, 0.99, (8, 6)), rng.uniform(0.05, 0.2, (8, 6))])
    sps = lambda b: 1.0 / (0.01 + 2e-4 * np.asarray(b, dtype=float))   # noqa: E731
    thr = plan_exact(conf, sps)
    start_rate = float(sps(16))
    assert thr.min_user_rate < start_rate            # low-confidence users pay for the others' tokens
    floor = 0.5 * (thr.min_user_rate + start_rate)   # feasible at the start, broken by the throughput plan
    sla = plan_exact(conf, sps, sla_floor=floor)
    assert sla.sla_met and sla.min_user_rate >= floor
    assert 0 < sla.budget_tokens < thr.budget_tokens
    assert any("below the floor" in line for line in sla.explanation)
    lag = plan(conf, sps, policy=PlanPolicy(mode="sla", floor_tok_s=floor), algorithm="lagged",
               lagged_confidences=conf)
    assert lag.sla_met and lag.min_user_rate >= floor - 1e-9
    # best throughput among feasible budgets (brute force)
    a = np.sort(np.concatenate([np.cumprod(r) for r in conf]))[::-1]
    best = 0.0
    for k in range(a.size + 1):
        lengths = plan_lagged(conf, sps, budget=k).lengths
        per = [1 + float(np.cumprod(row)[:l].sum()) for row, l in zip(conf, lengths)]
        rate = min(per) * float(sps(16 + k))
        if rate >= floor:
            best = max(best, expected_throughput(conf, lengths, sps))
    assert lag.predicted_throughput == pytest.approx(best)


def test_sla_unreachable_is_reported():
    sps = lambda b: 10.0 / np.asarray(b, dtype=float)   # noqa: E731
    p = plan_exact([[0.9, 0.9]] * 4, sps, sla_floor=1e6)
    assert p.sla_met is False
    p = plan([[0.9, 0.9]] * 4, sps, policy=PlanPolicy(mode="sla", floor_tok_s=1e6), algorithm="lagged",
             lagged_confidences=[[0.9, 0.9]] * 4)
    assert p.sla_met is False


def test_overrides_fixed_cap_off():
    conf = [[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]
    flat = lambda b: 1.0   # noqa: E731
    p = plan(conf, flat, policy=PlanPolicy(mode="fixed", frac=0.5))
    assert p.budget_tokens == 3 and list(p.lengths) == [2, 1]
    p = plan(conf, flat, policy=PlanPolicy(mode="cap", max_tokens=2))
    assert p.budget_tokens == 2
    p = plan(conf, flat, policy=PlanPolicy(mode="cap", max_tokens=2), algorithm="lagged", lagged_confidences=conf)
    assert p.budget_tokens == 2
    p = plan(conf, APPENDIX_A, policy="off")
    assert list(p.lengths) == [3, 3]
    assert plan(conf, flat, policy=PlanPolicy(mode="fixed", frac=0.0)).budget_tokens == 0


def test_plan_object_reports_consistent_numbers():
    conf = [[0.9, 0.8], [0.5]]
    sps = lambda b: 1.0 / (1 + 0.1 * np.asarray(b, dtype=float))   # noqa: E731
    p = plan_exact(conf, sps)
    surv = survival_products(conf)
    tau = sum(1 + float(s[:l].sum()) for s, l in zip(surv, p.lengths))
    assert p.expected_tau == pytest.approx(tau)
    assert p.batch_tokens == len(conf) + sum(p.lengths)
    assert p.predicted_throughput == pytest.approx(tau * float(sps(p.batch_tokens)))
    json.dumps(p.to_dict())


@pytest.mark.parametrize("bad,match", [
    ([[1.5]], "not a probability"), ([[float("nan")]], "not a probability"), ([0.5, 0.5], "wrap each"),
    ("[[0.5]]", "must be a list"), ([["x"]], "numbers"),
])
def test_bad_confidences_are_explained(bad, match):
    with pytest.raises(PlanError, match=match):
        plan_exact(bad, APPENDIX_A)


def test_bad_sps_is_explained():
    with pytest.raises(PlanError, match="positive"):
        plan_exact([[0.5]], lambda b: -1.0)
    with pytest.raises(PlanError, match="duplicate"):
        sps_from_pairs([(1, 1.0), (1, 2.0)])


def test_empty_batch():
    p = plan_exact([], APPENDIX_A)
    assert p.lengths == () and p.predicted_throughput == 0.0
    assert math.isfinite(plan_lagged([], APPENDIX_A, budget=3).expected_tau)


class _Draw:
    """An rng whose random() returns the given values in turn."""

    def __init__(self, *vals):
        self.vals = list(vals)

    def random(self):
        return self.vals.pop(0)


def test_explore_budget_fills_the_thinnest_profile_cell_on_half_the_draws():
    from dspark_controller.core.strategies import explore_budget
    from dspark_controller.core.sps_model import SpsModel

    m = SpsModel()
    for _ in range(50):                          # R = 4 measured only at B = 4..12 (budgets 0..8)
        for b in range(4, 13):
            m.update(4, b, 0.01 + 0.001 * b)
    full = 16
    # u < 0.5: a ragged budget whose cell has no samples: B = 13..19, i.e. K = 9..15 (not
    # K = full, which may run on the uniform path and never fill its cell)
    ks = {explore_budget(m, num_req=4, full=full, rng=_Draw(u)) for u in (0.0, 0.1, 0.2, 0.3, 0.4, 0.49)}
    assert ks <= set(range(9, full)) and len(ks) > 1, ks
    # u >= 0.5: uniform over 0..full (so stale cells get re-measured too)
    ks = [explore_budget(m, num_req=4, full=full, rng=_Draw(0.5 + 0.5 * (i + 0.5) / 17)) for i in range(17)]
    assert ks == list(range(17))
    # a model without cells: uniform on every draw; never outside [0, full]
    assert explore_budget(object(), num_req=4, full=full, rng=_Draw(0.999999)) == full
    assert explore_budget(m, num_req=4, full=0, rng=_Draw(0.3)) == 0
