"""Real CPU engine, compact mode, no SPS table (our flip of SGLang's verify-all):

* full-budget steps get SGLang's uniform layout, whose lengths are on the host
  (``budget.HostLengthLayouts``), through the real compact verify, and greedy output stays
  equal to the non-speculative engine's; their verify windows reach the survival
  calibration as full ones;
* SGLang's guard against simulated acceptance with trimmed budgets still refuses to start.

On CPU SGLang captures no ragged verify graph, so it reads ragged lengths to the host
itself; the device path whose read these layouts avoid is covered on SGLang's own planner
in ``tests/unit/test_worker_sglang_contract.py``.
"""

import pytest

from dspark_testlib import engine_kwargs, nospec_ids, run_engine_job

PROMPTS = ["def f(x):", "import os\nimport sys\n" * 4, "class Point:\n    def __init__(self):\n"]
MAX_NEW = [30, 22, 26]


def _job(pair, *, spec: bool, env=None):
    kw = engine_kwargs(pair, dtype="float32")
    if spec:
        kw.update(speculative_algorithm="DSPARK", speculative_draft_model_path=pair["draft"])
    return {"engine": kw, "env": env or {}, "server_info": spec, "batches": [
        {"prompts": PROMPTS, "sampling": [{"temperature": 0.0, "max_new_tokens": n} for n in MAX_NEW]},
        # one request alone: a random budget is 0 or full on 2 steps in 5
        {"prompts": ["def g(y):"], "sampling": {"temperature": 0.0, "max_new_tokens": 48}}]}


def _ids(res):
    return [[o["output_ids"] for o in batch] for batch in res["results"]]


def test_decided_lengths_are_host_lengths_and_output_is_unchanged(tiny_pair, tmp_path_factory):
    base = [nospec_ids(tiny_pair, PROMPTS, MAX_NEW, tmp_path_factory),
            nospec_ids(tiny_pair, ["def g(y):"], [48], tmp_path_factory)]
    spec = run_engine_job(_job(tiny_pair, spec=True, env={
        "SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_EXPLORE_PROB": "1",
        # full budgets take the ragged path (SGLang's uniform layout), as on a GPU by default
        "SGLANG_DSPARK_FULL_BUDGET_STATIC": "0"}), tmp_path_factory.mktemp("job"))
    assert _ids(spec) == base
    plugin = spec["server_info"]["internal_states"][0]["dspark_info_record"]["sglang_dspark"]
    assert plugin["full_budget_static_steps"] is None
    hl = plugin["host_layouts"]
    assert hl["uniform_steps"] >= 1, hl
    # no captured ragged graph on CPU: SGLang has already read every other layout's lengths
    # to the host (zero budgets included), so nothing is attached and nothing is left unread
    assert hl["floor_steps"] == 0 and hl["device_length_steps"] == 0, hl
    assert plugin["budget_sources"].get("explore", 0) >= 10, plugin["budget_sources"]
    # a full budget's windows hold every draft (SGLang's cap lens): the survival calibration
    # learns from such steps only (policy.SurvivalCalibrator), so it has learnt from them
    assert plugin["survival_calibration"]["observations"] > 0, plugin["survival_calibration"]


def test_simulated_acceptance_with_trimmed_budgets_is_refused(tiny_pair, tmp_path_factory):
    job = _job(tiny_pair, spec=True, env={"SGLANG_RAGGED_VERIFY_MODE": "compact",
                                          "SGLANG_SIMULATE_ACC_LEN": "2.5"})
    with pytest.raises(AssertionError, match=r"SGLANG_SIMULATE_ACC_LEN=2\.5 needs a verify-all schedule"):
        run_engine_job(job, tmp_path_factory.mktemp("job"), timeout=300)
