"""Fleet policy ``no_draft`` (decode without drafting): validation where modes are accepted,
the controller's decision, ``plan`` and ``status`` output, and end to end with the real
controller process, the real CLI and real ZeroMQ: ``set no_draft`` makes a worker's
BudgetPolicy skip the draft forward, ``set throughput`` brings drafting back."""

from __future__ import annotations

import json
import time
import typing

import pytest

from dsc_helpers import fingerprint, replay, run_cli, wait_for
from dspark_controller.cli import POLICIES, main
from dspark_controller.core.method import PlanError, PlanPolicy
from dspark_controller.core.policy import BudgetPolicy
from dspark_controller.core.sps_model import SpsModel
from dspark_controller.service.protocol import BudgetDecision, PolicySpec, SetPolicy, decode_body
from dspark_controller.sim.synthetic import CURVES


# ------------------------------------------------------------------ validation
def test_modes_agree_everywhere():
    """PolicySpec (wire), PlanPolicy (planner) and the CLI's choices list the same modes."""
    wire = typing.get_args(PolicySpec.model_fields["mode"].annotation)
    assert wire == PlanPolicy.MODES == POLICIES
    assert "no_draft" in wire and "off" in wire


def test_policyspec_accepts_no_draft_and_refuses_exploring_it():
    spec = PolicySpec(mode="no_draft")
    assert spec.describe() == "no_draft" and spec.explore_prob == 0.0
    # round trip on the wire, inside a message
    body = SetPolicy(policy=spec).model_dump_json(exclude_none=True).encode()
    assert decode_body(body).policy.mode == "no_draft"
    with pytest.raises(ValueError, match="no_draft.*explore"):
        PolicySpec(mode="no_draft", explore_prob=0.1)
    with pytest.raises(ValueError):
        PolicySpec(mode="no-draft")
    with pytest.raises(ValueError):
        PolicySpec(mode="nodraft")


def test_planpolicy_no_draft_property_and_validation():
    p = PlanPolicy(mode="no_draft")
    assert p.no_draft and not p.verify_all
    assert p.fixed_frac is None and p.cap is None and p.sla_floor is None
    assert p.describe() == "no_draft"
    off = PlanPolicy(mode="off")
    assert off.verify_all and not off.no_draft      # off verifies every draft; it still drafts
    assert PlanPolicy.from_spec(PolicySpec(mode="no_draft")).no_draft
    assert PlanPolicy.from_spec({"mode": "no_draft"}).no_draft
    assert PlanPolicy.from_spec("no_draft").no_draft
    with pytest.raises(PlanError, match="explore"):
        PlanPolicy(mode="no_draft", explore_prob=0.2)
    with pytest.raises(PlanError, match="no_draft"):        # the message lists the modes
        PlanPolicy(mode="bogus")


def test_planpolicy_and_policyspec_agree_on_every_mode():
    """Each mode both accept or both refuse, with and without its parameters."""
    cases = [dict(mode=m) for m in PlanPolicy.MODES]
    cases += [dict(mode=m, explore_prob=0.1) for m in PlanPolicy.MODES]
    cases += [dict(mode="sla", floor_tok_s=50.0), dict(mode="fixed", frac=0.3), dict(mode="cap", max_tokens=4)]
    for kw in cases:
        try:
            PolicySpec(**kw)
            wire_ok = True
        except ValueError:
            wire_ok = False
        try:
            PlanPolicy(**kw)
            plan_ok = True
        except PlanError:
            plan_ok = False
        assert wire_ok == plan_ok, kw


# ------------------------------------------------------------------ decision (in process)
def test_controller_decision_for_no_draft_in_process():
    from dspark_controller.service.protocol import Register
    from dspark_controller.service.server import Controller, ControllerConfig

    class NullSock:
        def send_multipart(self, *a, **k):
            pass

    ctl = Controller(config=ControllerConfig(profiles_dir=None, policy=PolicySpec(mode="no_draft")))
    ctl._router = ctl._pub = NullSock()
    fp = fingerprint()
    ctl._on_register(b"id", Register(engine_id="e0", worker_id="w", client_nonce="n", fingerprint=fp), 0.0)
    eng = ctl.engines["e0"]
    eng.num_requests = 6
    d = ctl.decide(eng)
    assert isinstance(d, BudgetDecision) and d.policy.mode == "no_draft"
    # harmless budget for a worker that drafts anyway: verify every draft token
    assert d.verify_all and d.budget_tokens == 6 * fp.gamma and d.budget_frac == 1.0 and d.explore_prob == 0
    assert "no_draft" in d.reason
    eng.last_decision = d
    st = ctl.status().engines[0]
    assert st.policy == "no_draft" and st.budget_tokens == 0 and not st.verify_all
    # `off` is a different thing: it drafts and verifies everything
    ctl.policy = PolicySpec(mode="off")
    d2 = ctl.decide(eng)
    assert d2.verify_all and d2.policy.mode == "off"


# ------------------------------------------------------------------ plan
def test_plan_no_draft_verifies_nothing(capsys):
    conf = "[[0.95, 0.9, 0.85], [0.3, 0.2, 0.1]]"
    sps = "1:1.0,2:0.99,3:0.98,4:0.7,5:0.69,6:0.68,7:0.5,8:0.5"
    assert main(["plan", conf, "--sps", sps, "--policy", "no_draft", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lengths"] == [0, 0] and out["budget_tokens"] == 0 and out["batch_tokens"] == 2
    assert out["policy"] == "no_draft" and out["expected_tau"] == pytest.approx(2.0)
    assert any("no drafts" in line for line in out["explanation"])
    assert main(["plan", conf, "--sps", sps, "--policy", "no_draft"]) == 0
    text = capsys.readouterr().out
    assert "lengths: [0, 0]" in text and "none is verified" in text
    # `off` still verifies every draft token
    assert main(["plan", conf, "--sps", sps, "--policy", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == [3, 3]


def test_no_draft_bad_input_is_one_line_exit_2(capsys):
    conf, sps = "[[0.9, 0.8]]", "1:1.0,2:0.9,3:0.8"
    for argv, needle in (
            (["plan", conf, "--sps", sps, "--policy", "no_draft", "--algorithm", "lagged", "--budget", "1"],
             "do not apply to policy no_draft"),
            (["plan", conf, "--sps", sps, "--policy", "no_draft", "--frac", "0.5"], "--frac only applies"),
            (["plan", "[[1.5]]", "--sps", sps, "--policy", "no_draft"], "not a probability"),
            (["set", "no_draft", "--explore", "0.1", "--connect", "ipc:///tmp/dsc-nobody.cli"], "explore"),
            (["set", "no_draft", "--max", "3", "--connect", "ipc:///tmp/dsc-nobody.cli"], "--max only applies")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)


# ------------------------------------------------------------------ end to end
def test_set_no_draft_stops_drafting_on_a_real_worker_and_throughput_restarts_it(controllers, clients):
    ctl = controllers("--decision-interval-s", "0.05")
    c = clients(address=ctl.bind, fingerprint=fingerprint(), engine_id="nd")
    wait_for(lambda: c.link_state == "connected", 15, what="the client to connect")
    replay(c, CURVES["smooth"], steps=40, seed=5)
    policy = BudgetPolicy(local_model=SpsModel(), latest_decision=c.latest_decision)

    def decision_with(mode):
        def check():
            d = c.latest_decision(5.0)
            return d if d is not None and d.policy.mode == mode else None
        return wait_for(check, 15, what=f"a {mode} decision")

    decision_with("throughput")
    assert policy.draft_step(4) is True

    r = run_cli("set", "no_draft", "--connect", ctl.cli)
    assert r.returncode == 0, r.stderr
    assert "no_draft" in r.stdout and "without drafting" in r.stdout
    d = decision_with("no_draft")
    assert d.verify_all and d.explore_prob == 0       # only for a worker that drafts anyway
    assert policy.draft_step(4) is False
    # pinned for as long as it is in force, though a no-draft worker sends no telemetry (only
    # heartbeats): the controller keeps the decision fresher than the worker's max age (2 s),
    # so no step drafts (no lapse back to the worker's own gate, no re-draft bursts)
    drafted, t_end = [], time.monotonic() + 4.0
    while time.monotonic() < t_end:
        drafted.append(policy.draft_step(4))
        time.sleep(0.02)
    assert not any(drafted), f"{sum(drafted)} of {len(drafted)} steps drafted under no_draft"
    st = json.loads(run_cli("status", "--json", "--connect", ctl.cli).stdout)
    assert st["policy"]["mode"] == "no_draft"
    eng = {e["engine_id"]: e for e in st["engines"]}["nd"]
    assert eng["policy"] == "no_draft" and eng["budget_tokens"] == 0 and not eng["verify_all"]
    text = run_cli("status", "--connect", ctl.cli).stdout
    assert "policy no_draft (decode without drafting)" in text and " no draft policy no_draft" in text

    r = run_cli("set", "throughput", "--connect", ctl.cli)
    assert r.returncode == 0, r.stderr
    decision_with("throughput")
    assert policy.draft_step(4) is True

    # off means "verify every draft": the worker still drafts
    assert run_cli("set", "off", "--connect", ctl.cli).returncode == 0
    assert decision_with("off").verify_all
    assert policy.draft_step(4) is True
