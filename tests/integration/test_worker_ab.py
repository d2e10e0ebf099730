"""SGLANG_DSPARK_AB_ARMS on a real server: every arm runs its share of the decode steps
with the budget it names, only the policy arm teaches the local profile, and the greedy
output is the one of verifying every draft (budgets change every step, nothing else)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_dspark.server_process import SGLangServer, http_json

ARMS = "policy,upstream,fixed@1,fixed@0.5"


@pytest.fixture(scope="module")
def bench_pair(tmp_path_factory):
    from sglang_dspark.tiny_models import PRESETS, build_pair

    out = tmp_path_factory.mktemp("bench-ab")
    build_pair(out, PRESETS["bench"])
    return {"target": str(out / "target"), "draft": str(out / "draft")}


def _texts(srv, n, concurrency, max_new=24):
    def one(i):
        r = http_json(srv.url + "/generate", {"text": f"def ab{i}(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=600)
        assert r["meta_info"]["completion_tokens"] == max_new
        return r["text"]
    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, range(n)))


def _info(srv):
    return srv.server_info()["internal_states"][0]["dspark_info_record"]


def test_ab_arms_share_the_steps_and_keep_greedy_output(bench_pair, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    srv = SGLangServer(model_path=bench_pair["target"], draft_path=bench_pair["draft"],
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_AB_ARMS": ARMS,
                            "SGLANG_DSPARK_LOG_INTERVAL_S": "0", "SGLANG_DSPARK_LEARN_FORCED": "0",
                            "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"},
                       extra_args=["--max-running-requests", "8"])
    with srv:
        ab_texts = _texts(srv, 16, 8)
        info = _info(srv)
        # the same prompts, every draft verified (the operator's pin takes precedence over A/B)
        assert srv.set_internal_state({"dspark_force_budget_frac": 1.0})
        full_texts = _texts(srv, 16, 8)
        pinned = _info(srv)["sglang_dspark"]
        assert srv.set_internal_state({"dspark_unpin_budget": 1})
    assert ab_texts == full_texts
    st, gamma = info["sglang_dspark"], info["gamma"]
    ab = st["ab"]
    assert ab["arms"] == ARMS.split(",")
    tot = ab["totals"]
    steps = {a: tot[a]["steps"] for a in ab["arms"]}
    n = sum(steps.values())
    assert n >= 12, steps
    # shuffled cycles: every arm within a cycle or two of a quarter of the steps
    assert max(steps.values()) - min(steps.values()) <= 3, steps
    for a in ab["arms"]:
        assert st["budget_sources"].get(f"ab:{a}", 0) >= steps[a] if a != "policy" else True
        assert tot[a]["tok_per_s"] > 0 and tot[a]["tokens"] >= tot[a]["requests"]
    f1, f5 = tot["fixed@1"], tot["fixed@0.5"]
    assert f1["uniform_steps"] == f1["steps"] and f1["verified_drafts"] == gamma * f1["requests"]
    # K = floor(0.5 * R * gamma) draft tokens, admitted top-K: between that and one less per step
    assert 0.5 * gamma * f5["requests"] - f5["steps"] <= f5["verified_drafts"] <= 0.5 * gamma * f5["requests"]
    assert f5["uniform_steps"] == 0
    # no table: SGLang's planner verifies everything
    assert tot["upstream"]["verified_drafts"] == gamma * tot["upstream"]["requests"]
    # only the policy arm's steps were learned; the other arms' were counted as not learned
    assert ab["steps_not_learned"] >= steps["upstream"] + steps["fixed@1"] + steps["fixed@0.5"]
    assert st["local_profile"]["samples"] <= steps["policy"] + 2
    # pinned steps run no arm
    assert pinned["ab"]["totals"] == tot or sum(v["steps"] for v in pinned["ab"]["totals"].values()) == n
