"""``dspark-controller simulate``: the fleet what-if simulator (small, seeded scenarios)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dsc_helpers import run_cli
from dspark_controller.sim.simulate import (PAPER_TAU, Domain, LengthDist, Scenario, Workload, acceptance_from_tau,
                                        decision_quality, frontier_anchors, load_scenario, run_frontier,
                                        run_timeline, scenario_from_dict)
from dspark_controller.sim.roofline import Drift, build_roofline


def _gpu(name: str = "gpu-70b-h200", **kw) -> Scenario:
    sc = load_scenario(name)
    return replace(sc, steps=kw.pop("steps", 240), warmup_steps=kw.pop("warmup_steps", 120), **kw)


def _flat_table(tmp_path, sps: float = 10.0):
    p = tmp_path / "flat.json"
    p.write_text(json.dumps({"sample_batch_tokens": [1], "sample_steps_per_sec": [sps], "max_batch_tokens": 4096}))
    return str(p)


# ------------------------------------------------------------------ building blocks
def test_acceptance_curves_reproduce_the_paper_tau():
    for name, tau in PAPER_TAU.items():
        d = Domain.from_spec(name, 7)
        assert d.expected_tau(7) == pytest.approx(tau, abs=1e-3), name
        assert all(0 < p <= 0.995 for p in d.acceptance)
        assert list(d.acceptance) == sorted(d.acceptance, reverse=True)      # decays with position
    assert acceptance_from_tau(1.0, 3)[0] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        acceptance_from_tau(9.5, 7)


def test_simulated_drafts_are_calibrated_and_informative():
    """Acceptance per position matches p_j, confidences track it (mean) and rank it (AUC)."""
    d = Domain(name="x", acceptance=[0.9, 0.8, 0.7], concentration=2.0, conf_noise=0.05)
    conf, acc = d.draw(np.random.default_rng(0), 40000, 3)
    for j, p in enumerate(d.acceptance):
        tried = acc >= j
        rate = float(np.mean(acc[tried] > j))
        assert rate == pytest.approx(p, abs=0.01)
        assert float(conf[tried, j].mean()) == pytest.approx(p, abs=0.02)
    # AUC of the position-1 confidence for "token 1 accepted"
    pos, neg = conf[acc >= 1, 0], conf[acc == 0, 0]
    auc = float(np.mean(pos[:4000, None] > neg[None, :4000]))
    assert 0.75 < auc < 0.99


def test_roofline_shape():
    c = build_roofline({"gpu": "h200", "model": "llama-70b", "dtype": "fp8"})
    t = np.asarray(c.decode("dspark", 64, np.arange(64, 64 * 8 + 1), 64 * 1500.0, 7))
    assert np.all(np.diff(t) >= 0) and t[-1] > 2 * t[0]          # compute-bound at large B
    t1 = np.asarray(c.decode("dspark", 1, np.arange(1, 9), 1500.0, 7))
    assert t1[-1] / t1[0] < 1.01                                  # memory-bound at R = 1: tokens are ~free
    assert c.decode("nospec", 1, 1, 1500.0, 7) < c.decode("mtp1", 1, 2, 1500.0, 7) < c.decode("dspark", 1, 8, 1500.0, 7)
    assert c.decode("nospec", 32, 32, 32 * 4000.0, 7) > c.decode("nospec", 32, 32, 32 * 500.0, 7)   # KV term
    moe = build_roofline({"gpu": "h200", "model": "deepseek-v3", "dtype": "fp8", "num_gpus": 8})
    assert moe.decode("nospec", 8, 8, 8000.0, 7) > 1.5 * moe.decode("nospec", 1, 1, 1000.0, 7)   # experts touched
    assert 1e5 < c.kv_capacity_tokens() < 1e6
    with pytest.raises(ValueError, match="unknown GPU"):
        build_roofline({"gpu": "tpu9"})


# ------------------------------------------------------------------ event mechanics, exactly
def test_closed_loop_finite_job_timing_is_exact(tmp_path):
    """Constant 0.1 s steps: prefill + 9 decode steps per 10-token request, 2 requests per user."""
    base = Scenario(name="flat", gamma=3, max_running=8, levels=[1, 2], warmup_level=None, step_noise=0.0,
                    cost={"kind": "profile", "path": _flat_table(tmp_path), "nospec_frac": 1.0},
                    workload=Workload(prompt=LengthDist("fixed", value=5), output=LengthDist("fixed", value=10),
                                      requests_per_user=2),
                    prefill="colocated", domains=[{"name": "sure", "trace": {"conf": [[0.9, 0.9, 0.9]],
                                                                              "acc": [3]}}],
                    sla_floor=None, anchors=[])
    res = {(r.policy, r.level): r for r in run_frontier(base, policies=["nospec", "verify_all"])}
    assert res["nospec", 1].makespan_s == pytest.approx(2.0)
    assert res["nospec", 1].throughput == pytest.approx(10.0)
    assert res["nospec", 2].throughput == pytest.approx(20.0)     # two users share every step
    # every draft accepted: 4 tokens per step, ceil(9 / 4) = 3 steps after the prefill
    assert res["verify_all", 1].throughput == pytest.approx(20 / 0.8)
    assert res["verify_all", 1].tau == pytest.approx(3.0)         # 9 decode tokens / 3 steps
    with_overhead = replace(base, workload=replace(base.workload, request_overhead_s=0.2))
    r = run_frontier(with_overhead, policies=["nospec"], levels=[1])[0]
    assert r.throughput == pytest.approx(20 / 2.4) and r.per_user_e2e == pytest.approx(10 / 1.2)


def test_same_seed_same_result_and_decision_quality_is_one_for_the_oracle():
    sc = _gpu(levels=[8], steps=120, warmup_steps=40)
    a = run_frontier(sc, policies=["online"])[0]
    b = run_frontier(sc, policies=["online"])[0]
    assert a.throughput == b.throughput and a.budget_per_request == b.budget_per_request
    c = run_frontier(replace(sc, seed=1), policies=["online"])[0]
    assert c.throughput != a.throughput
    surv = np.cumprod(np.full((4, 3), 0.8), axis=1)
    sps = lambda b: 1.0 / (1.0 + 0.1 * np.asarray(b))        # noqa: E731
    q = [decision_quality(surv, k, sps) for k in range(13)]
    assert max(q) == pytest.approx(1.0) and min(q) < 1.0


def _comparable(blob: dict) -> dict:
    """A results.json without what describes the host (wall seconds) or the command line (its
    --out folder) rather than the simulation."""
    blob = json.loads(json.dumps(blob))
    blob["meta"].pop("elapsed_s", None)
    blob["meta"].pop("command", None)
    for r in blob["results"]:
        r.pop("wall_s", None)
    for tl in blob["timelines"]:
        tl.get("summary", {}).pop("wall_s", None)
    return blob


def test_seeded_runs_do_not_depend_on_the_host_clock(monkeypatch):
    """The in-process controller re-sends its curve once per ``profile_publish_s``, which the
    real Controller measures with time.monotonic(); the simulator runs that period on
    simulated time, so a racing host clock and a frozen one make the same decisions (curve
    attached at the same steps) and the same numbers, every policy."""
    import types

    import dspark_controller.service.server as srv

    sc = _gpu(levels=[8, 48], steps=150, warmup_steps=50)
    pols = ["upstream", "online", "controller", "sla", "oracle"]
    real_decide = srv.Controller.decide

    def run(clock):
        log = []

        def decide(self, eng):
            d = real_decide(self, eng)
            log.append((eng.engine_id, d.num_requests, d.budget_tokens, d.sps_table is not None,
                        d.sps_additive is not None))
            return d
        monkeypatch.setattr(srv, "time", types.SimpleNamespace(monotonic=clock, time=clock,
                                                               perf_counter=srv.time.perf_counter))
        monkeypatch.setattr(srv.Controller, "decide", decide)
        res = [r.to_dict() for r in run_frontier(sc, policies=pols, backend="planner")]
        monkeypatch.undo()
        for r in res:
            r.pop("wall_s")
        return res, log

    ticks = iter(range(1 << 40))
    racing, racing_log = run(lambda: 10.0 * next(ticks))      # 10 s of host time per call
    frozen, frozen_log = run(lambda: 1000.0)
    assert any(x[3] for x in frozen_log) and not all(x[3] for x in frozen_log)
    assert racing_log == frozen_log
    assert racing == frozen


def test_same_seed_same_results_file_in_two_processes(tmp_path, monkeypatch):
    """The CLI twice with one seed (different hash seeds, so set/dict-of-str order cannot
    matter): identical results.json but for wall time, frontier and drift timeline, every
    DSpark policy; another seed differs."""
    args = ["simulate", "--scenario", "gpu-8b-h100", "--levels", "4,32", "--steps", "80", "--policies",
            "upstream,online,controller,sla,oracle", "--budget-code", "planner", "--drift-scale", "1.3",
            "--concurrency", "16", "--timeline-steps", "160", "--timeline-policies", "online,controller",
            "--quiet", "--json"]
    blobs = []
    for i, (hash_seed, seed) in enumerate((("1", "3"), ("2", "3"), ("1", "4"))):
        monkeypatch.setenv("PYTHONHASHSEED", hash_seed)
        out = tmp_path / f"run{i}"
        r = run_cli(*args, "--seed", seed, "--out", str(out), timeout=240)
        assert r.returncode == 0, r.stderr
        blobs.append(_comparable(json.loads((out / "results.json").read_text())))
    assert blobs[0] == blobs[1]
    assert blobs[0]["results"] != blobs[2]["results"]


# ------------------------------------------------------------------ what the simulator must show
def test_speculation_pays_at_low_load_and_budgets_fall_with_concurrency():
    sc = _gpu(levels=[1, 4, 16, 64, 128], steps=400, warmup_steps=200)
    res = {(r.policy, r.level): r for r in run_frontier(sc, policies=["nospec", "mtp1", "verify_all", "online",
                                                                      "oracle"])}
    # memory-bound at low load: verifying every draft token is nearly free
    assert res["verify_all", 1].throughput > 3.0 * res["nospec", 1].throughput
    assert res["verify_all", 1].throughput > 1.8 * res["mtp1", 1].throughput
    for pol in ("online", "oracle"):
        b = [res[pol, lv].budget_per_request for lv in (1, 4, 16, 64, 128)]
        assert b[0] > 6.0 and b[-1] < 2.5, (pol, b)
        assert all(x >= y - 0.3 for x, y in zip(b, b[1:])), (pol, b)        # falls as concurrency rises
    # compute-bound at high load: scheduling beats verify-all, and ours is near the oracle
    assert res["online", 128].throughput > 1.2 * res["verify_all", 128].throughput
    assert res["online", 128].throughput > 0.95 * res["oracle", 128].throughput


def test_frontier_anchors_interpolate_and_report_unreachable():
    sc = _gpu(levels=[1, 16, 64, 256], steps=400, warmup_steps=200)
    res = run_frontier(sc, policies=["mtp1", "online"])
    tab = frontier_anchors(res, [80.0, 120.0, 10_000.0])
    assert tab["mtp1"]["120"] is None and tab["online"]["10000"] is None
    assert tab["online"]["80"] > tab["mtp1"]["80"] > 0
    pts = sorted((r.per_user, r.throughput) for r in res if r.policy == "online")
    assert min(p[1] for p in pts) <= tab["online"]["80"] <= max(p[1] for p in pts)


def test_sla_mode_meets_a_feasible_floor():
    sc = _gpu("gpu-8b-h100", levels=[16], steps=300, warmup_steps=100, sla_floor=150.0,
              domains=[{"name": "one", "tau": 5.0}])
    sla, thr = run_frontier(sc, policies=["sla", "controller"])
    assert thr.per_user > 1.2 * sc.sla_floor                       # the floor is feasible at this load
    assert sla.per_user >= sc.sla_floor and sla.sla_met_frac >= 0.9
    assert sla.throughput > 0.9 * thr.throughput
    # unreachable floor: reported, not met
    hard = run_frontier(replace(sc, sla_floor=5000.0), policies=["sla"])[0]
    assert hard.sla_met_frac == 0.0


def test_online_profile_recovers_after_a_30pct_drift():
    # decision quality scores the policy's knowledge of the curve on the raw lagged survival,
    # so the strategies that change the survival it plans on are off here
    sc = _gpu(domains=[{"name": "one", "tau": 4.5}], policy_config={"calibration": False, "admission": False})
    tls = {t.policy: t for t in run_timeline(sc, concurrency=48, drift=Drift(scale=1.3), drift_at_frac=0.5,
                                             steps=1600, policies=["online", "oracle"], windows=16)}
    on, orc = tls["online"], tls["oracle"]
    errs = [e for e in on.model_error if e is not None]
    i_drift = on.step.index(next(s for s in on.step if s > on.drift_step))
    assert max(e for e in on.model_error[i_drift:i_drift + 2] if e is not None) > 0.08   # the drift shows
    assert errs[-1] < 0.05                                                              # ... and is learned
    assert on.quality_after > 0.97
    # the slowdown costs ours what it costs the oracle (the optimum did not move: uniform drift)
    assert on.after / on.before == pytest.approx(orc.after / orc.before, abs=0.05)
    assert orc.after < 0.85 * orc.before


# ------------------------------------------------------------------ scenario files and the CLI
def test_measured_nospec_and_static_step_tables(tmp_path):
    """Per-R tables replace the profile-derived no-speculation and static verify-all steps
    (interpolated in R); the other DSpark policies keep the profile's t(R, B)."""
    from dspark_controller.sim.roofline import ProfileCost, _interp_r, _rtable

    tab = _rtable({"1": 0.02, "4": 0.05, 16: 0.11}, "x")
    assert _interp_r(tab, 1) == pytest.approx(0.02) and _interp_r(tab, 2) == pytest.approx(0.03)
    assert _interp_r(tab, 10) == pytest.approx(0.08)
    assert _interp_r(tab, 32) == pytest.approx(0.11 + 16 * 0.005)          # last segment's slope
    cost = ProfileCost(step_time=lambda R, B: 0.1, nospec_step_s={"1": 0.04}, static_step_s={"1": 0.05, "2": 0.07})
    assert cost.decode("nospec", 2, 2, 0.0, 3) == pytest.approx(0.08)       # one point: proportional above
    assert cost.decode("static", 1, 4, 0.0, 3) == pytest.approx(0.05)
    assert cost.decode("dspark", 1, 4, 0.0, 3) == pytest.approx(0.1)
    for bad in ({}, {"0": 0.1}, {"1": -1.0}, {"one": 0.1}, [0.1]):
        with pytest.raises(ValueError, match="static_step_s"):
            ProfileCost(step_time=lambda R, B: 0.1, static_step_s=bad)
    base = Scenario(name="tables", gamma=3, max_running=8, levels=[1], warmup_level=None, step_noise=0.0,
                    cost={"kind": "profile", "path": _flat_table(tmp_path), "nospec_frac": 1.0,
                          "nospec_step_s": {"1": 0.05}, "static_step_s": {"1": 0.2}},
                    workload=Workload(prompt=LengthDist("fixed", value=5), output=LengthDist("fixed", value=10),
                                      requests_per_user=2),
                    prefill="colocated", domains=[{"name": "sure", "trace": {"conf": [[0.9, 0.9, 0.9]],
                                                                              "acc": [3]}}],
                    sla_floor=None, anchors=[])
    res = {r.policy: r for r in run_frontier(base, policies=["nospec", "verify_all", "online"])}
    # per request: prefill 0.1 s (profile) + 9 decode steps at 0.05 s / 3 static steps at 0.2 s
    assert res["nospec"].throughput == pytest.approx(20 / (2 * (0.1 + 9 * 0.05)))
    assert res["verify_all"].throughput == pytest.approx(20 / (2 * (0.1 + 3 * 0.2)))
    assert res["online"].throughput > res["verify_all"].throughput             # compact steps: the profile's 0.1 s


def test_scenario_file_with_trace_and_profile(tmp_path):
    (tmp_path / "trace.json").write_text(json.dumps({"conf": [[0.9, 0.5]] * 3, "acc": [2, 1, 0]}))
    sc = scenario_from_dict({"name": "f", "gamma": 2, "cost": {"kind": "profile", "path": _flat_table(tmp_path)},
                             "domains": [{"name": "t", "trace": "trace.json"}], "levels": [2],
                             "workload": {"prompt": 4, "output": {"dist": "uniform", "lo": 5, "hi": 9}}},
                            base_dir=tmp_path)
    r = run_frontier(replace(sc, steps=60, warmup_steps=10), policies=["verify_all"])[0]
    assert r.tau == pytest.approx(2.0, abs=0.35)              # 1 + mean accepted (2 + 1 + 0) / 3
    with pytest.raises(ValueError, match="unknown scenario field"):
        scenario_from_dict({"name": "x", "gamm": 3})
    with pytest.raises(ValueError, match="trace has 2 positions"):
        Domain.from_spec({"name": "t", "trace": {"conf": [[0.5, 0.5]], "acc": [1]}}, 3)


def test_cli_end_to_end_writes_plots_and_table(tmp_path):
    out = tmp_path / "out"
    r = run_cli("simulate", "--scenario", "gpu-8b-h100", "--levels", "1,16", "--steps", "60",
                "--policies", "nospec,mtp1,verify_all,online", "--budget-code", "planner", "--out", str(out),
                "--drift-scale", "1.3", "--concurrency", "8", "--timeline-steps", "120",
                "--timeline-policies", "online,oracle", "--quiet", timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("frontier.png", "budget.png", "timeline.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    md = (out / "results.md").read_text()
    assert "MODELLED" in md and "| online | 16 |" in md and "@ 120 tok/s/user" in md
    blob = json.loads((out / "results.json").read_text())
    assert blob["modelled"] is True and blob["meta"]["budget_code"] == "planner"
    assert {x["policy"] for x in blob["results"]} == {"nospec", "mtp1", "verify_all", "online"}
    assert len(blob["timelines"]) == 2
    assert "| online | 16 |" in r.stdout


def test_cli_refuses_bad_input_with_exit_2(tmp_path):
    r = run_cli("simulate", "--policies", "nospec,bogus", "--out", str(tmp_path))
    assert r.returncode == 2 and "unknown policy 'bogus'" in r.stderr
    r = run_cli("simulate", "--scenario", str(tmp_path / "missing.json"), "--out", str(tmp_path))
    assert r.returncode == 2 and "neither a built-in" in r.stderr


def test_planner_path_equals_the_workers_own_code():
    """Both backends run the one policy (dspark_controller.core.policy.BudgetPolicy); the SGLang-free
    table lookup and top-K make the same decisions as SGLang's compute_verify_token_budget and
    its top-K admission (same budgets, step for step)."""
    pytest.importorskip("sglang")
    from dspark_controller.sim.policies import Backend

    try:
        worker = Backend("worker")
    except Exception as exc:  # pragma: no cover - SGLang present but not importable here
        pytest.skip(f"worker code not importable: {exc}")
    sc = _gpu(levels=[4, 48], steps=150, warmup_steps=50)
    a = run_frontier(sc, policies=["upstream", "online", "controller"], backend=worker)
    b = run_frontier(sc, policies=["upstream", "online", "controller"], backend="planner")
    for x, y in zip(a, b):
        assert (x.policy, x.level) == (y.policy, y.level)
        assert x.throughput == pytest.approx(y.throughput, rel=1e-12), x.policy
        assert x.budget_per_request == pytest.approx(y.budget_per_request, rel=1e-12), x.policy
        assert x.sources == y.sources


def test_warmup_ramp_is_validated_and_full_budget_static_steps_cost_a_static_step(monkeypatch):
    import dspark_controller.sim.simulate as S
    from dspark_controller.sim.roofline import ProfileCost

    with pytest.raises(ValueError, match="warmup_level"):
        scenario_from_dict({"base": "gpu-70b-h200", "warmup_level": [1, 0]})
    with pytest.raises(ValueError, match="warmup_level"):
        scenario_from_dict({"base": "gpu-70b-h200", "warmup_level": "eight"})
    assert scenario_from_dict({"base": "gpu-70b-h200", "warmup_level": [1, 4, 16]}).warmup_level == [1, 4, 16]
    # flat compact curve (every token free: the online worker verifies everything) and static
    # steps 10x cheaper: the online worker's full-budget steps take the static path only when
    # the scenario says its worker does (SGLANG_DSPARK_FULL_BUDGET_STATIC)
    monkeypatch.setattr(S, "build_cost", lambda _sc: ProfileCost(step_time=lambda R, B: 0.01,
                                                                 static_step_s={"1": 0.001, "4": 0.001}))
    base = dict(name="t", gamma=3, max_running=4, levels=[2], steps=120, warmup_steps=20, warmup_level=[1, 2],
                warmup_requests_per_user=1, domains=[{"name": "one", "tau": 3.5}], prefill="disaggregated",
                sla_floor=None, anchors=[], step_noise=0.0)
    thr = [run_frontier(Scenario(**dict(base, full_budget_static=f)), policies=["online"],
                        backend="planner")[0].throughput for f in (False, True)]
    assert thr[1] > 1.3 * thr[0]     # identical runs but for the flag (exploration steps stay compact)


def test_uniform_path_steps_stay_out_of_ready_profiles_in_worker_controller_and_simulator():
    """A full-budget step on SGLang's uniform path keeps its own per-R time: the simulated
    worker (as DSparkControlledWorker) and the real controller (telemetry ``uniform``) feed it
    to a profile only while that profile is not ready yet."""
    import numpy as np

    from dspark_controller.core.policy import PolicyConfig
    from dspark_controller.sim.policies import Backend, ControllerPolicy, SimController
    from dspark_controller.core.sps_model import SpsModel

    ctrl = SimController(gamma=4)
    pol = ControllerPolicy(Backend("planner"), SpsModel(), PolicyConfig(), ctrl, 0, "controller")
    acc, lens = np.array([2]), np.array([4])
    pol.observe(now=0.0, R=1, B=5, t=0.010, accepted=acc, lengths=lens, uniform=True)   # cold: fed
    assert pol.model.steps == 1 and ctrl.model.steps == 1 and pol.uniform_s.get(1) == 0.010   # seconds
    for i in range(40):                                     # ragged steps make both profiles ready
        pol.observe(now=0.1 * i, R=1, B=1 + i % 5, t=0.02, accepted=acc, lengths=lens)
    assert pol.model.ready and ctrl.model.ready
    steps, ctrl_steps = pol.model.steps, ctrl.model.steps
    pol.observe(now=5.0, R=1, B=5, t=0.030, accepted=acc, lengths=lens, uniform=True)
    assert pol.model.steps == steps and ctrl.model.steps == ctrl_steps
    # one average on the profile's drift clock, before and after the profile got ready
    from dspark_controller.core.strategies import UNIFORM_EMA
    assert pol.uniform_s.get(1) == pytest.approx((0.010 + UNIFORM_EMA * 0.020) * pol.model.scale)
    assert pol.brain.uniform_steps == 1
    assert pol.brain.uniform_step_time(1) == pytest.approx(pol.uniform_s.get(1))   # what the planner compares
