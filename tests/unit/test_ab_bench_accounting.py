"""The step-interleaved benchmark's arithmetic (``benchmarks/ab_bench.py``): window deltas of
the worker's cumulative per-arm totals, pooled throughput, jackknife errors, the best fixed
arm and the targets."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def ab():
    sys.path.insert(0, str(BENCHMARKS))     # ab_bench imports its sibling worker_bench
    try:
        import ab_bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    return ab_bench


def _arm(steps, step_s, tokens, requests=None, verified=0):
    return {"steps": steps, "step_s": step_s, "tokens": tokens, "requests": requests or steps,
            "verified_drafts": verified, "uniform_steps": 0}


def test_delta_is_the_window_between_two_snapshots(ab):
    before = {"policy": _arm(2, 1.0, 10), "fixed@1": _arm(1, 0.5, 4)}
    after = {"policy": _arm(5, 2.5, 22), "fixed@1": _arm(4, 2.0, 16)}
    d = ab.delta(after, before)
    assert d["policy"] == _arm(3, 1.5, 12, requests=3)
    assert d["fixed@1"]["tokens"] == 12 and d["fixed@1"]["step_s"] == pytest.approx(1.5)


def test_pooled_ratio_and_jackknife(ab):
    # policy is exactly 1.2x fixed@1 in every block: ratio 1.2, no spread
    blocks = [{"policy": _arm(10, t, 12.0 * t * 10), "fixed@1": _arm(10, t, 10.0 * t * 10)} for t in (1.0, 2.0, 0.5)]
    r = ab.ratio(blocks, "policy", "fixed@1")
    assert r["ratio"] == pytest.approx(1.2) and r["se"] == pytest.approx(0.0, abs=1e-12)
    # pooled sums, not a mean of block ratios
    blocks = [{"a": _arm(1, 1.0, 30), "b": _arm(1, 1.0, 10)}, {"a": _arm(1, 3.0, 30), "b": _arm(1, 1.0, 10)}]
    assert ab.ratio(blocks, "a", "b")["ratio"] == pytest.approx((60 / 4.0) / (20 / 2.0))
    assert ab.ratio(blocks, "a", "b")["se"] > 0
    assert ab.ratio([{"a": _arm(0, 0.0, 0), "b": _arm(1, 1.0, 1)}], "a", "b")["ratio"] is None


def test_summary_picks_the_best_fixed_arm_and_checks_targets(ab):
    arms = ["policy", "upstream", "fixed@1", "fixed@0.5"]
    speed = {"policy": 11.0, "upstream": 10.0, "fixed@1": 10.0, "fixed@0.5": 11.1}
    blocks = [{a: _arm(10, 1.0, speed[a] * 10, requests=10, verified=20) for a in arms} for _ in range(4)]
    s = ab.summarize_level(blocks, arms)
    c = s["compare"]
    assert c["vs_verify_all"]["ratio"] == pytest.approx(1.1)
    assert c["vs_best_fixed"]["best"] == "fixed@0.5"
    assert c["vs_best_fixed"]["ratio"] == pytest.approx(11.0 / 11.1)
    assert c["vs_best_fixed_xval"]["ratio"] == pytest.approx(11.0 / 11.1)
    assert s["arms"]["policy"]["verified_per_req"] == 2.0 and s["arms"]["policy"]["accept_len"] == 11.0
    assert s["targets_met"]                      # 0.991 >= 0.98, and above verify-all and upstream
    speed["fixed@0.5"] = 11.5                    # 0.957 of the best fixed arm: missed
    blocks = [{a: _arm(10, 1.0, speed[a] * 10) for a in arms} for _ in range(4)]
    assert not ab.summarize_level(blocks, arms)["targets_met"]
