"""Lossless at temperature 1: tokens produced by DSPARK with verify budgets that
change every step follow the target's own distribution.

For every generated position after the first (the ones decided by speculative
verification) we know the exact target distribution p_t from Hugging Face
transformers (same weights).  Tokens are bucketed by their rank under p_t; the
bucket counts O have mean E = sum_t p_t(bucket) and covariance
sum_t (diag(p_t) - p_t p_t^T) under the null, so X^2 = d^T C^-1 d (d = O - E, one
bucket dropped) is chi-square with 4 degrees of freedom.  We reject at alpha = 0.001.
The same holds with ``min_p``, alone and with ``top_p``, and with ``top_k`` and ``top_p``
(plain decoding's filters applied to p_t; no token outside them).
On the same contexts, the paper's Appendix A distortion (the top token's probability
pushed halfway to 1, as when admission peeks at the realised token) is rejected:
the test has the power to catch a lossy scheduler.
"""

import numpy as np
import pytest

from dspark_testlib import engine_kwargs, run_engine_job

CRITICAL_DF4_P001 = 18.467
CRITICAL_P001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467}   # chi-square, by degrees of freedom
BUCKETS = [(0, 1), (1, 2), (2, 3), (3, 10), (10, 1 << 30)]
PROMPTS = ["def f(x):", "import os", "The quick brown", "class A:"]
MIN_P = 0.002   # the soft pair: the top token ~0.77, a flat tail of ~0.0004 each (cut)
TOP_P = 0.8     # keeps the second token where the top one is below 0.8; min_p's cut applied
                # first (renormalising the top token above 0.8) would not
# top-k 10 with top-p 0.9 keeps tokens below the top one (~90 expected); cutting top-p after
# renormalising over the top 10 (the top token ~0.78 of ~0.82) would not
TOP_K_TOP_P = {"top_k": 10, "top_p": 0.9}
FILTERS = ({}, {"min_p": MIN_P}, {"min_p": MIN_P, "top_p": TOP_P}, TOP_K_TOP_P)


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


def _chi2_merged(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """X^2 over the buckets merged from the last one down until every bucket expects at
    least 5 tokens (a filtered distribution leaves the tail buckets empty), and its
    critical value at alpha = 0.001."""
    while len(counts) > 2 and probs[:, -1].sum() < 5:
        counts = np.append(counts[:-2], counts[-2:].sum())
        probs = np.column_stack([probs[:, :-2], probs[:, -2:].sum(1)])
    return _chi2(counts, probs), CRITICAL_P001[len(counts) - 1]


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
                        "sampling": {"temperature": 1.0, "max_new_tokens": new, "ignore_eos": True,
                                     **extra}}
                        for extra in FILTERS for p in PROMPTS]}
    res = run_engine_job(job, tmp_path)
    sources = res["server_info"]["internal_states"][0]["dspark_info_record"]["sglang_dspark"][
        "budget_sources"]
    # about half the steps are off, the others drafted with a random budget
    assert sources.get("explore", 0) >= 25 and sources.get("ab:off", 0) >= 25, sources

    tok = AutoTokenizer.from_pretrained(soft_pair["target"])
    model = AutoModelForCausalLM.from_pretrained(soft_pair["target"], dtype=torch.float32)

    def observed(results, min_p=0.0, top_p=1.0, top_k=1 << 30):
        """The target's distributions (plain decoding's top_k, top_p and min_p applied) and
        the outputs' bucket counts at every position decided by speculative verification."""
        probs, counts, verified = [], np.zeros(len(BUCKETS)), 0
        for prompt, batch in zip(PROMPTS, results):
            pids = tok(prompt).input_ids
            for o in batch:
                out = o["output_ids"]
                assert len(out) == new
                verified += o["meta_info"]["spec_verify_ct"]
                ids = torch.tensor([pids + out])
                with torch.no_grad():
                    p_all = torch.softmax(model(ids).logits[0].double(), -1).numpy()
                for k in range(1, new):
                    p = p_all[len(pids) + k - 1]
                    if min_p or top_p < 1 or top_k < len(p):    # SGLang's rule, on the unfiltered p
                        keep = p >= min_p * p.max()
                        order = np.argsort(-p, kind="stable")
                        above = np.cumsum(p[order]) - p[order]
                        keep[order[(above > top_p) | (np.arange(len(p)) >= top_k)]] = False
                        assert keep[out[k]], "a token min_p, top_p or top_k filters out"
                        p = np.where(keep, p, 0.0)
                        p = p / p.sum()
                    probs.append(_bucket_probs(p))
                    counts[_bucket_of(p, out[k])] += 1
        assert verified < len(PROMPTS) * n_per_prompt * new, "speculation accepted nothing"
        return np.array(probs), counts

    groups = [res["results"][i:i + len(PROMPTS)] for i in range(0, len(res["results"]), len(PROMPTS))]
    probs, counts = observed(groups[0])
    x2 = _chi2(counts, probs)
    assert x2 < CRITICAL_DF4_P001, (x2, counts, probs.sum(0))
    # min_p, alone and with top_p; top_k with top_p (SGLang 0.5.23's DSpark verify ignores
    # min_p and cuts top-p after renormalising over the top k; sglang_dspark.penalties)
    for extra, batch in zip(FILTERS[1:], groups[1:]):
        f_probs, f_counts = observed(batch, **extra)
        x2, critical = _chi2_merged(f_counts, f_probs)
        assert x2 < critical, (extra, x2, critical, f_counts, f_probs.sum(0))

    # power: the Appendix A distortion on the same contexts is rejected
    rng = np.random.default_rng(0)
    distorted = probs.copy()
    distorted[:, 0] = probs[:, 0] + (1 - probs[:, 0]) / 2
    distorted[:, 1:] = probs[:, 1:] / 2
    fake = np.zeros(len(BUCKETS))
    for q in distorted:
        fake[rng.choice(len(BUCKETS), p=q / q.sum())] += 1
    assert _chi2(fake, probs) > CRITICAL_DF4_P001
