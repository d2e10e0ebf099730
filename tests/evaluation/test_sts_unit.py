"""STS fit and metrics on synthetic data with known answers; SGLang's loader reads
what we write.  No engine (fast)."""

import json

import numpy as np
import pytest

from sglang_dspark.calibrate.sts import (StsData, auc, ece, fit_sts, position_metrics,
                                         reliability_bins, survival)


def _synthetic(true_t, n=30000, seed=0, gamma=None):
    """Raw logits z; the true conditional acceptance is sigmoid(z_k / T_k), so the
    raw confidences sigmoid(z_k) are miscalibrated by exactly T_k."""
    rng = np.random.default_rng(seed)
    gamma = len(true_t)
    z = rng.normal(1.0, 2.0, size=(n, gamma))
    p = 1.0 / (1.0 + np.exp(-z / np.asarray(true_t)[None, :]))
    ok = rng.random((n, gamma)) < p
    prefix = np.cumprod(ok, axis=1).astype(float)
    return StsData(logits=z, prefix=prefix, observed=np.ones_like(prefix, dtype=bool))


def test_ece_and_auc_known_values():
    # perfectly calibrated in expectation, one bin each
    assert ece([0.25] * 4, [0, 0, 0, 1], bins=10) == pytest.approx(0.0)
    assert ece([0.9, 0.9], [0, 0], bins=10) == pytest.approx(0.9)
    assert ece([0.1, 0.9], [1, 0], bins=2) == pytest.approx(0.9)
    assert auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == pytest.approx(1.0)
    assert auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == pytest.approx(0.0)
    assert auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == pytest.approx(0.5)  # ties
    assert np.isnan(auc([0.1, 0.2], [1, 1]))
    bins = reliability_bins([0.05, 0.06, 0.95], [0, 1, 1], bins=10)
    assert [b["count"] for b in bins] == [2, 1]
    assert bins[0]["frac_pos"] == pytest.approx(0.5)


def test_sts_fit_recovers_known_temperatures_and_lowers_ece():
    true_t = [0.5, 2.0, 1.0, 3.0]
    data = _synthetic(true_t)
    temps = fit_sts(data)
    for got, want in zip(temps, true_t):
        assert got == pytest.approx(want, rel=0.2), (temps, true_t)
    held = _synthetic(true_t, seed=1)
    m = position_metrics(held, temps)
    for k, row in enumerate(m):
        if true_t[k] != 1.0:
            assert row["ece_before"] > 0.02, row
        assert row["ece_after"] < 0.015, row
        assert row["ece_after"] <= row["ece_before"] + 1e-3
    # the calibrated products are the prefix survival the planner uses
    s = survival(held.logits, temps)
    assert np.all(np.diff(s, axis=1) <= 1e-12)


def test_sts_fit_ignores_censored_positions():
    data = _synthetic([0.5, 2.0, 1.0], n=20000)
    # censor position 3 on half the rounds with garbage labels there: must not matter
    obs = data.observed.copy()
    obs[::2, 2] = False
    prefix = data.prefix.copy()
    prefix[::2, 2] = 1.0
    t_full = fit_sts(data)
    t_cens = fit_sts(StsData(data.logits, prefix, obs))
    assert t_cens[2] == pytest.approx(t_full[2], rel=0.25)
    assert t_cens[:2] == t_full[:2]


def test_from_rounds_prefix_and_observed():
    rounds = [{"gamma": 3, "conf_raw": [1, 2, 3], "accepted": 1, "verified": 3},
              {"gamma": 3, "conf_raw": [0, 0, 0], "accepted": 2, "verified": 2}]
    d = StsData.from_rounds(rounds)
    assert d.prefix.tolist() == [[1, 0, 0], [1, 1, 0]]
    assert d.observed.tolist() == [[True, True, True], [True, True, False]]


def test_sts_json_round_trips_through_sglang_loader(tmp_path):
    from sglang.srt.speculative.dspark_components.dspark_sts import (
        DSparkStsCalibration, load_sts_calibration_from_path)

    temps = fit_sts(_synthetic([0.7, 1.5], n=5000))
    cal = DSparkStsCalibration(temperatures=temps, dataset="synthetic", num_samples=5000,
                               ece_before=[0.1, 0.2], ece_after=[0.01, 0.01])
    p = tmp_path / "sts.json"
    p.write_text(cal.to_json())
    back = load_sts_calibration_from_path(str(p))
    assert back.temperatures == temps and back.num_samples == 5000
    raw = json.loads(p.read_text())
    assert set(raw) >= {"temperatures", "ece_before", "ece_after"}
    # SGLang rejects non-positive temperatures: our fit never produces them
    assert min(temps) > 0
    with pytest.raises(Exception):
        DSparkStsCalibration.from_json(json.dumps({"temperatures": [0.0]}))
