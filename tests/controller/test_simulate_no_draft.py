"""No-draft steps in the fleet simulator: the policy's gate on the built-in scenario where
speculation stops paying at high load (``gpu-70b-h200-heavy-draft``, MODELLED)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dspark_controller.sim.simulate import SCENARIOS, _Run, load_scenario, run_frontier

SCENARIO = "gpu-70b-h200-heavy-draft"
LOW, HIGH = 8, 256


def _short(steps: int = 600):
    sc = load_scenario(SCENARIO)
    return replace(sc, steps=steps, warmup_steps=200)


@pytest.fixture(scope="module")
def sweep():
    res = run_frontier(_short(), policies=["nospec", "online", "online-always-draft"], backend="planner",
                       levels=[LOW, 128, HIGH])
    return {(r.policy, int(r.level)): r for r in res}


def test_the_scenario_is_built_in_and_speculation_stops_paying_at_high_load():
    assert SCENARIO in SCENARIOS
    sc = load_scenario(SCENARIO)
    assert "online-always-draft" in sc.policies and "nospec" in sc.policies
    assert sc.variants["online-always-draft"]["policy_config"] == {"no_draft": False}
    from dspark_controller.sim.simulate import build_cost

    cost = build_cost(sc)
    R, ctx = 256, 256 * 700.0
    plain = cost.decode("nospec", R, R, ctx, sc.gamma)
    # a drafted step at K = 0 pays the drafter over R gamma positions on top of the target
    assert cost.decode("dspark", R, R, ctx, sc.gamma) > 1.3 * plain


def test_online_policy_drafts_at_low_load_and_goes_off_at_high_load(sweep):
    assert sweep[("online", LOW)].no_draft_frac < 0.1
    assert sweep[("online", LOW)].throughput > 2.5 * sweep[("nospec", LOW)].throughput
    assert sweep[("online", HIGH)].no_draft_frac > 0.8
    assert sweep[("online-always-draft", HIGH)].no_draft_frac == 0.0
    assert sweep[("nospec", HIGH)].no_draft_frac == 1.0


def test_no_draft_steps_keep_ours_at_plain_decoding_where_the_ablation_falls_below(sweep):
    plain = sweep[("nospec", HIGH)].throughput
    assert sweep[("online", HIGH)].throughput >= 0.97 * plain
    assert sweep[("online-always-draft", HIGH)].throughput < 0.9 * plain
    for lv in (LOW, 128, HIGH):       # never below plain decoding (within noise) at any level
        assert sweep[("online", lv)].throughput >= 0.95 * sweep[("nospec", lv)].throughput


def test_the_gate_does_not_flap_at_a_steady_load(sweep):
    for lv in (LOW, 128, HIGH):
        assert sweep[("online", lv)].gate_switches is not None
        assert sweep[("online", lv)].gate_switches <= 2, (lv, sweep[("online", lv)].gate_switches)
    assert sweep[("online-always-draft", HIGH)].gate_switches is None


def test_no_draft_steps_feed_neither_profile_nor_calibration(monkeypatch):
    """Each decode step reaches the policy one way: a drafted step through observe_step and
    learn_step_time (profile, calibration, admission gain), a no-draft step through
    observe_off_step only."""
    sc = _short(steps=300)
    seen = {"profile": 0, "observe": 0, "off": 0}
    from dspark_controller.core.policy import BudgetPolicy
    from dspark_controller.sim import policies as P

    learn, observe, off = P.learn_step_time, BudgetPolicy.observe_step, BudgetPolicy.observe_off_step

    def spy_learn(*a, **kw):
        seen["profile"] += 1
        return learn(*a, **kw)

    def spy_observe(self, **kw):
        seen["observe"] += 1
        return observe(self, **kw)

    def spy_off(self, num_req, step_s):
        seen["off"] += 1
        return off(self, num_req, step_s)

    monkeypatch.setattr(P, "learn_step_time", spy_learn)
    monkeypatch.setattr(BudgetPolicy, "observe_step", spy_observe)
    monkeypatch.setattr(BudgetPolicy, "observe_off_step", spy_off)
    r = run_frontier(sc, policies=["online"], backend="planner", levels=[HIGH])[0]
    assert r.no_draft_frac > 0.5 and seen["off"] > 0
    assert seen["profile"] == seen["observe"]
    assert seen["profile"] + seen["off"] == 200 + 300      # warm-up + level steps, one engine


def test_seeded_no_draft_runs_are_reproducible():
    sc = _short(steps=300)

    def once():
        res = run_frontier(sc, policies=["online"], backend="planner", levels=[32, HIGH])
        return [{k: v for k, v in r.to_dict().items() if k != "wall_s"} for r in res]

    a, b = once(), once()
    assert a == b
    assert a[-1]["no_draft_frac"] > 0.5


def test_scenario_variants_resolve_to_a_policy_and_its_config():
    from dspark_controller.core.no_draft import GateConfig
    from dspark_controller.sim.simulate import policy_config_of, resolve_policy, scenario_from_dict

    sc = scenario_from_dict({"base": SCENARIO, "variants": {
        "online-slow-gate": {"policy": "online", "policy_config": {"gate": {"min_dwell": 64}}}}})
    base, over = resolve_policy(sc, "online-slow-gate")
    assert base == "online"
    cfg = policy_config_of({"seed": 1, **over})
    assert cfg.gate == GateConfig(min_dwell=64) and cfg.no_draft
    assert resolve_policy(sc, "nospec") == ("nospec", {})
    with pytest.raises(ValueError):
        resolve_policy(sc, "no-such-policy")
    with pytest.raises(ValueError):
        policy_config_of({"no_such_field": 1})
