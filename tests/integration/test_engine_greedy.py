"""DSPARK on CPU through the real SGLang engine: greedy output equals the
non-speculative engine's, token for token, in every ragged mode and in float32 and
bfloat16."""

import pytest

from dspark_testlib import GREEDY_PROMPTS, engine_kwargs, nospec_ids, run_engine_job

PROMPTS = GREEDY_PROMPTS
# Different lengths so requests finish at different steps.
MAX_NEW = [40, 23, 31, 17, 36]


def _sampling():
    return [{"temperature": 0.0, "max_new_tokens": n} for n in MAX_NEW]


_cache: dict = {}


def _base(dtype, tiny_pair, tmp_path_factory):
    return nospec_ids(tiny_pair, PROMPTS, MAX_NEW, tmp_path_factory, dtype=dtype)


def _run(key, tiny_pair, sps_table, tmp_path_factory, seq_head=None):
    key = key + (seq_head,)
    if key in _cache:
        return _cache[key]
    spec, mode, dtype, _ = key
    kw = engine_kwargs(tiny_pair, dtype=dtype)
    env = {"SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"}
    if seq_head:
        env["SGLANG_DSPARK_FUSED_SEQ_HEAD"] = seq_head
    if spec:
        kw.update(speculative_algorithm="DSPARK", speculative_draft_model_path=tiny_pair["draft"])
        env["SGLANG_RAGGED_VERIFY_MODE"] = mode
        if mode != "static":
            kw["speculative_dspark_sps_table_path"] = sps_table
    job = {"engine": kw, "env": env, "server_info": True,
           "batches": [{"prompts": PROMPTS, "sampling": _sampling()}]}
    _cache[key] = run_engine_job(job, tmp_path_factory.mktemp("job"))
    return _cache[key]


def _ids(res):
    return [o["output_ids"] for o in res["results"][0]]


# every mode in float32; bfloat16 in compact mode with a random budget on every step
# (test_greedy_equivalence_with_budgets_changing_every_step); cap-accept runs SGLang's own
# sequential head (the switch's other setting), the others ours (CI time: each case is an
# engine start)
CASES = [("static", "float32", None), ("cap-accept", "float32", "upstream"),
         ("compact", "float32", None)]


@pytest.mark.parametrize("mode,dtype,seq_head", CASES)
def test_dspark_greedy_equals_baseline(mode, dtype, seq_head, tiny_pair, sps_table, tmp_path_factory):
    base = _base(dtype, tiny_pair, tmp_path_factory)
    spec = _run((True, mode, dtype), tiny_pair, sps_table, tmp_path_factory, seq_head=seq_head)
    _check_speculative_run(spec, base, mode, seq_head)


def _check_speculative_run(spec, base, mode, seq_head):
    assert _ids(spec) == base
    lens = [len(x) for x in base]
    assert len(set(lens)) > 1, "requests should finish at different steps"
    metas = [o["meta_info"] for o in spec["results"][0]]
    # Speculation really happened: fewer verify steps than tokens.
    verify = sum(m["spec_verify_ct"] for m in metas)
    tokens = sum(m["completion_tokens"] for m in metas)
    assert 0 < verify < tokens
    rec = spec["server_info"]["internal_states"][0]["dspark_info_record"]
    assert rec["sglang_dspark"]["worker"] == "sglang_dspark.worker.DSparkControlledWorker"
    assert rec["mode"] == mode
    # the default switch (auto) runs our fused sequential head's torch path on CPU;
    # SGLANG_DSPARK_FUSED_SEQ_HEAD=upstream runs SGLang's own
    assert rec["sglang_dspark"]["seq_head_backend"] == (seq_head or "torch")


@pytest.mark.parametrize("mode,seq_head", [("compact", None), ("cap-accept", "upstream")])
def test_sps_table_budgets_chosen_and_applied(mode, seq_head, tiny_pair, sps_table, tmp_path_factory):
    spec = _run((True, mode, "float32"), tiny_pair, sps_table, tmp_path_factory, seq_head=seq_head)
    rec = spec["server_info"]["internal_states"][0]["dspark_info_record"]
    gamma = rec["gamma"]
    steps = [r for r in rec["records"] if r.get("budget") is not None]
    assert steps, "SGLang recorded no budgeted steps"
    partial = [r for r in steps if r["budget"] < r["num_running_reqs"] * gamma]
    assert partial, "the steep SPS table should make SGLang choose budgets below full"
    for r in steps:
        # SGLang accounts anchors + budget as the step's verify tokens (compact runs
        # exactly those; cap-accept runs all and caps acceptance at the budget).
        assert r["num_verify_tokens"] == r["num_running_reqs"] + r["budget"], r


def test_greedy_equivalence_with_budgets_changing_every_step(tiny_pair, sps_table,
                                                              tmp_path_factory):
    """Compact mode in bfloat16, no table, a uniformly random verify budget on every step
    (SGLANG_DSPARK_EXPLORE_PROB=1): output still equals the non-speculative engine's."""
    base = _base("bfloat16", tiny_pair, tmp_path_factory)
    kw = engine_kwargs(tiny_pair, dtype="bfloat16", speculative_algorithm="DSPARK",
                       speculative_draft_model_path=tiny_pair["draft"])
    job = {"engine": kw, "server_info": True,
           "env": {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_EXPLORE_PROB": "1",
                   "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1", "SGLANG_DSPARK_FULL_BUDGET_STATIC": "1"},
           "batches": [{"prompts": PROMPTS, "sampling": _sampling()}]}
    spec = run_engine_job(job, tmp_path_factory.mktemp("job"))
    _check_speculative_run(spec, base, "compact", None)
    rec = spec["server_info"]["internal_states"][0]["dspark_info_record"]
    sources = rec["sglang_dspark"]["budget_sources"]
    assert sources.get("explore", 0) >= 10, sources
    budgets = [r["budget"] for r in rec["records"] if r.get("budget") is not None]
    assert len(set(budgets)) >= 4, budgets  # budgets really changed step to step
    # steps whose random budget was the full one ran SGLang's uniform (static) verify path
    # (SGLANG_DSPARK_FULL_BUDGET_STATIC=1), the others a ragged layout: both equal
    assert rec["sglang_dspark"]["full_budget_static_steps"] >= 1, rec["sglang_dspark"]
