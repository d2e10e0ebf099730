"""Acceptance metrics from verify rounds: known values and the tau identity."""

import numpy as np
import pytest

from sglang_dspark.evaluate.metrics import acceptance_summary, served_summary


def test_acceptance_summary_known_values():
    acc = np.array([0, 1, 2, 4, 4])
    ver = np.array([4, 4, 4, 4, 4])
    s = acceptance_summary(acc, ver, 4)
    assert s["tau_mean"] == pytest.approx(np.mean(acc + 1))
    assert s["tau_counts"] == {"1": 1, "2": 1, "3": 1, "4": 0, "5": 2}
    p = [x["p_conditional"] for x in s["per_position"]]
    assert p == pytest.approx([4 / 5, 3 / 4, 2 / 3, 2 / 2])
    assert s["tau_from_positions"] == pytest.approx(s["tau_mean"])
    assert s["verify_efficiency"] == pytest.approx(11 / 20)
    assert s["all_positions_verified"]


def test_tau_identity_random_static_rounds():
    rng = np.random.default_rng(0)
    acc = rng.integers(0, 6, size=1000)
    s = acceptance_summary(acc, np.full(1000, 5), 5)
    assert s["tau_from_positions"] == pytest.approx(s["tau_mean"])


def test_censored_rounds_do_not_count_as_rejections():
    # round 2 verified only 1 position and accepted it: position 2 is unobserved
    s = acceptance_summary(np.array([2, 1]), np.array([3, 1]), 3)
    assert s["per_position"][1]["rounds_reaching"] == 1
    assert s["per_position"][1]["p_conditional"] == 1.0
    assert not s["all_positions_verified"]


def test_inconsistent_rounds_rejected():
    with pytest.raises(ValueError):
        acceptance_summary(np.array([3]), np.array([2]), 4)


def test_served_summary():
    reqs = [{"meta": {"completion_tokens": 10, "spec_verify_ct": 4,
                      "spec_correct_drafts_histogram": [1, 2, 1]}},
            {"meta": {"completion_tokens": 5, "spec_verify_ct": 1}}]
    s = served_summary(reqs, 3)
    assert s["tau_served"] == pytest.approx(3.0)
    assert s["correct_drafts_histogram"] == [1, 2, 1, 0]
