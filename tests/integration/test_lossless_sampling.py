"""Lossless at temperature 1: tokens produced by DSPARK with verify budgets that
change every step follow the target's own distribution.

For every generated position after the first (the ones decided by speculative
verification) we know the exact target distribution p_t from Hugging Face
transformers (same weights).  Tokens are bucketed by their rank under p_t; the
bucket counts O have mean E = sum_t p_t(bucket) and covariance
sum_t (diag(p_t) - p_t p_t^T) under the null, so X^2 = d^T C^-1 d (d = O - E, one
bucket dropped) is chi-square with 4 degrees of freedom.  We reject at alpha = 0.001.
On the same contexts, the paper's Appendix A distortion (the top token's probability
pushed halfway to 1, as when admission peeks at the realised token) is rejected:
the test has the power to catch a lossy scheduler.
"""

import numpy as np
import pytest

from dspark_testlib import engine_kwargs, run_engine_job

CRITICAL_DF4_P001 = 18.467
BUCKETS = [(0, 1), (1, 2), (2, 3), (3, 10), (10, 1 << 30)]
PROMPTS = ["def f(x):", "import os", "The quick brown", "class A:"]


@pytest.fixture(scope="module")
def soft_pair(tmp_path_factory):
    from sglang_dspark.tiny_models import TinySpec, build_pair

    out = tmp_path_factory.mktemp("soft")
    build_pair(out, TinySpec(seed=3, sharpness=1.0))
    return {"target": str(out / "target"), "draft": str(out / "draft")}


def _bucket_probs(p: np.ndarray) -> np.ndarray:
    order = np.sort(p)[::-1]
    return np.array([order[a:b].sum() for a, b in BUCKETS])


def _bucket_of(p: np.ndarray, tok: int) -> int:
    rank = int((p > p[tok]).sum())
    return next(i for i, (a, b) in enumerate(BUCKETS) if a <= rank < b)


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    e = probs.sum(0)
    cov = sum(np.diag(q) - np.outer(q, q) for q in probs)
    d = (counts - e)[:-1]
    return float(d @ np.linalg.solve(cov[:-1, :-1], d))


def test_t1_distribution_matches_target_under_changing_budgets_and_no_draft_steps(soft_pair, tmp_path):
    """The A/B arms ``off`` and ``policy`` (a uniformly random budget on every drafted
    step) interleave no-draft steps and drafted steps at random (sglang_dspark.no_draft).
    One engine run tests both: the drafted steps' random budgets and the switches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    n_per_prompt, new = 160, 5
    kw = engine_kwargs(soft_pair, dtype="float32", speculative_algorithm="DSPARK",
                       speculative_draft_model_path=soft_pair["draft"], max_running_requests=32)
    env = {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_EXPLORE_PROB": "1",
           "SGLANG_DSPARK_AB_ARMS": "off,policy"}
    job = {"engine": kw, "server_info": True, "env": env,
           "batches": [{"prompts": [p], "n": n_per_prompt,
                        "sampling": {"temperature": 1.0, "max_new_tokens": new,
                                     "ignore_eos": True}} for p in PROMPTS]}
    res = run_engine_job(job, tmp_path)
    sources = res["server_info"]["internal_states"][0]["dspark_info_record"]["sglang_dspark"][
        "budget_sources"]
    # about half the steps are off, the others drafted with a random budget
    assert sources.get("explore", 0) >= 25 and sources.get("ab:off", 0) >= 25, sources

    tok = AutoTokenizer.from_pretrained(soft_pair["target"])
    model = AutoModelForCausalLM.from_pretrained(soft_pair["target"], dtype=torch.float32)
    probs, counts, verified = [], np.zeros(len(BUCKETS)), 0
    for prompt, batch in zip(PROMPTS, res["results"]):
        pids = tok(prompt).input_ids
        for o in batch:
            out = o["output_ids"]
            assert len(out) == new
            verified += o["meta_info"]["spec_verify_ct"]
            ids = torch.tensor([pids + out])
            with torch.no_grad():
                p_all = torch.softmax(model(ids).logits[0].double(), -1).numpy()
            for k in range(1, new):  # positions decided by speculative verification
                p = p_all[len(pids) + k - 1]
                probs.append(_bucket_probs(p))
                counts[_bucket_of(p, out[k])] += 1
    probs = np.array(probs)
    assert verified < len(PROMPTS) * n_per_prompt * new, "speculation accepted nothing"
    x2 = _chi2(counts, probs)
    assert x2 < CRITICAL_DF4_P001, (x2, counts, probs.sum(0))

    # power: the Appendix A distortion on the same contexts is rejected
    rng = np.random.default_rng(0)
    distorted = probs.copy()
    distorted[:, 0] = probs[:, 0] + (1 - probs[:, 0]) / 2
    distorted[:, 1:] = probs[:, 1:] / 2
    fake = np.zeros(len(BUCKETS))
    for q in distorted:
        fake[rng.choice(len(BUCKETS), p=q / q.sum())] += 1
    assert _chi2(fake, probs) > CRITICAL_DF4_P001
