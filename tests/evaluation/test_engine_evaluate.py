"""Evaluation and calibration CLIs through the real SGLang engine on the tiny pair
(CPU, verify-all mode).  Three engine starts in all (evaluate; calibrate's rollouts; calibrate's
check with the fitted STS file loaded)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sglang_dspark.evaluate.rollout import read_capture

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "examples" / "prompts" / "tiny-heldout.jsonl"


def _run(module, *args, timeout=600):
    r = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"{module} failed ({r.returncode}):\n{r.stderr[-6000:]}"
    return r


@pytest.fixture(scope="module")
def evaluation(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    _run("sglang_dspark.evaluate", "--target", tiny_pair["target"], "--draft", tiny_pair["draft"],
         "--prompts", PROMPTS, "--num-prompts", 6, "--max-turns", 1, "--max-new-tokens", 40,
         "--temperature", 0, 1, "--out", out)
    return out, json.loads((out / "evaluation.json").read_text())


def test_evaluation_numbers_are_consistent(evaluation, tiny_pair):
    out, rep = evaluation
    gamma = tiny_pair["manifest"]["spec"]["block_size"]
    assert rep["gamma"] == gamma and set(rep["results"]) == {"T0", "T1"}
    assert (out / "evaluation.png").stat().st_size > 5000
    for label, res in rep["results"].items():
        a, served = res["acceptance"], res["served"]
        assert a["rounds"] > 20 and a["all_positions_verified"]
        assert 1.0 <= a["tau_mean"] <= gamma + 1
        # per-position products reproduce tau (verify-all: every position observed)
        assert a["tau_from_positions"] == pytest.approx(a["tau_mean"], rel=1e-9)
        assert sum(a["tau_distribution"].values()) == pytest.approx(1.0)
        assert a["verify_efficiency"] == pytest.approx(
            a["accepted_draft_tokens"] / (a["rounds"] * gamma))
        # every verify round SGLang counted was captured exactly once, with the same
        # accepted counts SGLang's own per-request histogram holds
        assert a["rounds"] == served["spec_verify_ct"], label
        assert a["accepted_draft_tokens"] == served["spec_num_correct_drafts"], label
        hist = [a["tau_counts"][str(k + 1)] for k in range(gamma + 1)]
        assert hist == served["correct_drafts_histogram"], label
    greedy = rep["results"]["T0"]["acceptance"]
    # draft rows are right for ~75% of tokens: real speculation, not all-or-nothing
    assert 2.0 < greedy["tau_mean"] < gamma + 1
    assert 0.5 < greedy["per_position"][0]["p_conditional"] < 1.0


def test_captured_confidences_belong_to_the_verified_block(evaluation):
    """The tiny draft's confidence head flags exactly the rows the draft gets wrong.
    If confidences were paired with another step's outcome the split would blur to
    the base rate; paired with their own block it is nearly perfect at T=0."""
    out, _ = evaluation
    rounds = [r for r in read_capture(out / "capture.jsonl") if r["rid"].startswith("T0-")]
    z = np.array([r["conf_raw"] for r in rounds])
    acc = np.array([r["accepted"] for r in rounds])
    for k in range(z.shape[1]):
        reach = acc >= k
        hi, lo = reach & (z[:, k] > 0), reach & (z[:, k] <= 0)
        ok = acc >= k + 1
        if hi.sum() >= 10:
            assert ok[hi].mean() > 0.9, (k, ok[hi].mean())
        if lo.sum() >= 10:
            assert ok[lo].mean() < 0.1, (k, ok[lo].mean())
    # served confidences without STS are the plain sigmoid of the raw logits
    conf = np.array([r["conf"] for r in rounds])
    assert np.allclose(conf, 1 / (1 + np.exp(-z)), atol=1e-5)


def test_calibrate_end_to_end_and_sts_loaded_by_engine(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("cal")
    _run("sglang_dspark.calibrate", "--target", tiny_pair["target"], "--draft", tiny_pair["draft"],
         "--prompts", PROMPTS, "--num-prompts", 16, "--max-turns", 1, "--max-new-tokens", 48,
         "--out", out)
    rep = json.loads((out / "calibration.json").read_text())
    gamma = tiny_pair["manifest"]["spec"]["block_size"]
    from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

    sts = load_sts_calibration_from_path(str(out / "sts.json"))
    assert len(sts.temperatures) == gamma and sts.temperatures == rep["temperatures"]
    assert sts.ece_after == [m["ece_after"] for m in rep["heldout"]]
    assert rep["fit_rounds"] > 50 and rep["heldout_rounds"] > 50
    # the engine started with --speculative-dspark-confidence-sts-path served
    # sigmoid(raw / T_k)
    chk = rep["sts_check"]
    assert chk["applied"] and chk["max_abs_err_vs_sts"] < 1e-3
    held = rep["heldout"]
    assert np.mean([m["ece_after"] for m in held]) < np.mean([m["ece_before"] for m in held])
    assert max(m["ece_after"] for m in held) < 0.05
    assert (out / "reliability.png").stat().st_size > 5000
