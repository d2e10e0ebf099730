"""No table, no controller: the worker learns its engine's SPS profile online and
per-request verify budgets fall as load rises, as that profile predicts.

Uses the "bench" tiny pair (hidden 768) so that step time grows with verify tokens
even on a CPU.  Budgets and predicted/measured step times are read from SGLang's own
per-step records (SGLANG_DSPARK_ENABLE_SPS_RECORD=1), not from our code's claims.
"""

import statistics
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_dspark.server_process import SGLangServer, http_json


@pytest.fixture(scope="module")
def bench_pair(tmp_path_factory):
    from sglang_dspark.tiny_models import PRESETS, build_pair

    out = tmp_path_factory.mktemp("bench")
    build_pair(out, PRESETS["bench"])
    return {"target": str(out / "target"), "draft": str(out / "draft")}


def _level(srv, concurrency, max_new=32):
    def one(i):
        r = http_json(srv.url + "/generate", {"text": f"def h{i}(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=600)
        return r["meta_info"]["completion_tokens"]
    with ThreadPoolExecutor(concurrency) as ex:
        return list(ex.map(one, range(concurrency)))


def test_budgets_fall_with_load_from_online_profile(bench_pair, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    srv = SGLangServer(model_path=bench_pair["target"], draft_path=bench_pair["draft"],
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact",
                            "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1",
                            "SGLANG_DSPARK_LOG_INTERVAL_S": "0",
                            "SGLANG_DSPARK_LEARN_FORCED": "0",
                            # budgets only: SGLang records a no-draft step as budget 0, and
                            # whether drafting pays at one request is the gate's call
                            # (tests/integration/test_no_draft_*.py, the simulator's tests)
                            "SGLANG_DSPARK_NO_DRAFT": "0"},
                       extra_args=["--max-running-requests", "32"])
    with srv:
        for c in (4, 16, 32, 1, 8):  # learning traffic
            assert _level(srv, c) == [32] * c
        info = srv.server_info()["internal_states"][0]["dspark_info_record"]
        n_before = len(info["records"])
        for c in (1, 1, 32, 32):     # measured traffic, profile already learned
            assert _level(srv, c) == [32] * c
        info = srv.server_info()["internal_states"][0]["dspark_info_record"]
        _check_pinned_steps_not_learned(srv)
    plugin = info["sglang_dspark"]
    assert plugin["local_profile"]["ready"]
    assert plugin["budget_sources"].get("local", 0) > 20, plugin["budget_sources"]
    # no table was given: the young profile's steps are warm-up, never "table" steps, and
    # the start-up line answers SGLang's "uninitialized table" warning
    assert plugin["online"] is True and "table" not in plugin["budget_sources"], plugin["budget_sources"]
    assert plugin["budget_sources"].get("warmup", 0) > 0, plugin["budget_sources"]
    log = srv.log_path.read_text()
    assert "verify budgets: this engine's online step-time profile" in log
    assert "SPS table is uninitialized does not apply" in log
    gamma = info["gamma"]
    recs = [r for r in info["records"][n_before:] if r.get("budget") is not None]
    low = [r["budget"] / r["num_running_reqs"] for r in recs if r["num_running_reqs"] == 1]
    high = [r["budget"] / r["num_running_reqs"] for r in recs if r["num_running_reqs"] >= 24]
    assert low and high
    # at load 1 the profile says extra tokens are nearly free; at load >= 24 they are not
    assert statistics.mean(low) > statistics.mean(high) + 0.5, (statistics.mean(low),
                                                                 statistics.mean(high), gamma)
    # the budgets came with the profile's predictions, and those predictions held
    errs = [abs(r["predicted_step_ms"] - r["step_cpu_ms"]) / r["step_cpu_ms"]
            for r in recs if r.get("predicted_step_ms") and r.get("step_cpu_ms")]
    assert len(errs) > 10
    assert statistics.median(errs) < 0.5, statistics.median(errs)
    # the worker's own error statistic prices each step as the planner does (uniform-path
    # steps by their measured per-R time), so it agrees with SGLang's records
    tel = plugin["telemetry"]
    assert tel["profile_rel_error_median"] is not None
    assert tel["profile_rel_error_median"] < 0.5, tel


def _plugin(srv):
    return srv.server_info()["internal_states"][0]["dspark_info_record"]


def _pin(srv, frac):
    args = {"dspark_unpin_budget": 1} if frac is None else {"dspark_force_budget_frac": frac}
    assert srv.set_internal_state(args), args


def _check_pinned_steps_not_learned(srv):
    """SGLANG_DSPARK_LEARN_FORCED=0: steps run under the operator's pinned fraction change
    neither the local profile nor the policy; un-pinning (our ``dspark_unpin_budget`` key)
    returns to the online policy, which learns again.  A bad value is refused."""
    before = _plugin(srv)
    samples0 = before["sglang_dspark"]["local_profile"]["samples"]
    n_rec = len(before["records"])
    _pin(srv, 0.5)
    assert _level(srv, 4) == [32] * 4
    pinned = _plugin(srv)
    st = pinned["sglang_dspark"]
    assert st["local_profile"]["samples"] == samples0
    forced = st["budget_sources"].get("forced", 0) - before["sglang_dspark"]["budget_sources"].get("forced", 0)
    assert forced > 5 and st["forced_steps_not_learned"] >= forced - 2, st
    gamma = pinned["gamma"]
    recs = [r for r in pinned["records"][n_rec:] if r.get("budget") is not None]
    match = [r["budget"] == int(0.5 * r["num_running_reqs"] * gamma) for r in recs]
    assert recs and sum(match) >= 0.8 * len(recs), \
        [(r["budget"], r["num_running_reqs"]) for r in recs]
    r = http_json(srv.url + "/set_internal_state", {"server_args": {"dspark_unpin_budget": 2}})
    assert not any(bool(x.get("updated")) if isinstance(x, dict) else x for x in (r if isinstance(r, list) else [r]))
    _pin(srv, None)
    assert _level(srv, 4) == [32] * 4
    after = _plugin(srv)["sglang_dspark"]
    assert after["local_profile"]["samples"] > samples0
    assert after["budget_sources"].get("forced", 0) == st["budget_sources"].get("forced", 0)
