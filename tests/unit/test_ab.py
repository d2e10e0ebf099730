"""The interleaved A/B of budget policies (sglang_dspark.ab): arm specs, rotation, ledger."""

import collections

import pytest

from sglang_dspark.ab import AbConfig, ArmLedger, ArmRotation, ArmSpecError, parse_arms


def test_parse_arms_normalises_and_validates():
    arms = parse_arms(" policy, upstream ,FIXED@1,fixed@0.50")
    assert [a.name for a in arms] == ["policy", "upstream", "fixed@1", "fixed@0.5"]
    assert [a.kind for a in arms] == ["policy", "upstream", "fixed", "fixed"]
    assert arms[3].frac == 0.5 and arms[0].frac is None
    for bad, says in [("policy", "at least two"), ("policy,fixed@1.5", r"F in \[0, 1\]"),
                      ("policy,fixed@x", r"F in \[0, 1\]"), ("policy,best", "unknown arm 'best'"),
                      ("policy,fixed@0.5,fixed@.5", "listed twice"), ("", "at least two")]:
        with pytest.raises(ArmSpecError, match=says):
            parse_arms(bad)


def test_config_from_settings():
    from sglang_dspark.settings import Settings, SettingsError

    assert AbConfig.from_settings(Settings.from_env({})) is None
    cfg = AbConfig.from_settings(Settings.from_env(
        {"SGLANG_DSPARK_AB_ARMS": "policy,fixed@1", "SGLANG_DSPARK_AB_SEED": "7"}))
    assert cfg.seed == 7 and [a.name for a in cfg.arms] == ["policy", "fixed@1"]
    with pytest.raises(SettingsError, match="SGLANG_DSPARK_AB_SEED='seven'"):
        Settings.from_env({"SGLANG_DSPARK_AB_SEED": "seven"})


def test_rotation_runs_every_arm_once_per_cycle_in_shuffled_orders():
    arms = parse_arms("policy,upstream,fixed@1,fixed@0.5")
    rot = ArmRotation(arms, seed=3)
    cycles = [tuple(rot.next().name for _ in arms) for _ in range(200)]
    assert all(sorted(c) == sorted(a.name for a in arms) for c in cycles)
    assert len(set(cycles)) > 10                     # orders vary: no fixed phase per arm
    firsts = collections.Counter(c[0] for c in cycles)
    assert min(firsts.values()) > 25                 # each arm leads a cycle about 1/4 of the time
    again = ArmRotation(arms, seed=3)                # reproducible from the seed
    assert [again.next().name for _ in range(12)] == [n for c in cycles[:3] for n in c]


def test_ledger_totals_and_throughput():
    led = ArmLedger(parse_arms("policy,fixed@1"))
    led.observe("policy", num_requests=2, step_s=0.5, accepted_drafts=[3, 1], verified_drafts=5, uniform=False)
    led.observe("policy", num_requests=1, step_s=0.25, accepted_drafts=[0], verified_drafts=1, uniform=False)
    led.observe("fixed@1", num_requests=2, step_s=1.0, accepted_drafts=[4, 4], verified_drafts=8, uniform=True)
    led.observe("fixed@1", num_requests=2, step_s=0.0, accepted_drafts=[4, 4], verified_drafts=8, uniform=True)
    led.observe("unknown", num_requests=2, step_s=1.0, accepted_drafts=[4, 4], verified_drafts=8, uniform=True)
    snap = led.snapshot()
    assert set(snap) == {"policy", "fixed@1"}
    p, f = snap["policy"], snap["fixed@1"]
    assert (p["steps"], p["tokens"], p["requests"], p["verified_drafts"], p["uniform_steps"]) == (2, 7, 3, 6, 0)
    assert p["tok_per_s"] == pytest.approx(7 / 0.75, abs=1e-3)
    assert (f["steps"], f["tokens"], f["uniform_steps"]) == (1, 10, 1)   # the 0 s step is not a measurement
