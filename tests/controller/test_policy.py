"""dspark_controller.core.policy: the one budget policy (worker, controller mode, simulator)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dspark_controller.core.strategies import UniformTimes
from dspark_controller.core.policy import BudgetPolicy, Decision, PolicyConfig

sys.path.insert(0, str(Path(__file__).parent))
from policy_replay import GAMMA, fresh_model, learn, replay  # noqa: E402

DATA = Path(__file__).parent / "data" / "policy_replay.json"


def _run(config: PolicyConfig = PolicyConfig()):
    model = fresh_model()
    uniform_s = UniformTimes(model)
    pol = BudgetPolicy(local_model=model, config=config, uniform_step_time=uniform_s.get)

    def step(raw, R):
        d = pol.decide(raw, max_len=GAMMA)
        src = pol.last_source if d is not None else ("warmup" if pol.warming_up else "none")
        pred = pol.last_pred_drafts
        used = pol.last_survival

        def observe(*, accepted, verified, uniform, num_req, batch_tokens, step_s):
            pol.observe_step(survival=used if d is not None else None, accepted=accepted, verified=verified,
                             pred_drafts=pred, uniform=uniform)
            learn(model, uniform_s, pol, num_req=num_req, batch_tokens=batch_tokens, step_s=step_s,
                  uniform=uniform)
        return (None if d is None else int(d.budget)), src, pred, observe

    return replay(step), pol


def test_replay_gives_the_budgets_recorded_before_the_policy_was_one_object():
    rows, pol = _run()
    want = json.loads(DATA.read_text())["rows"]
    assert len(rows) == len(want)
    diff = [(i, a, b) for i, (a, b) in enumerate(zip(rows, want)) if a != b]
    assert not diff, diff[:5]
    # the trace exercises every strategy
    srcs = {r[2] for r in rows}
    assert {"local", "probe", "explore", "warmup"} <= srcs
    assert pol.calibrator.observations > 0 and pol.admission.summary()


@pytest.mark.parametrize("off", ["probe", "explore", "uniform_gate", "admission", "calibration"])
def test_each_strategy_has_an_off_switch_that_changes_what_it_owns(off):
    rows, pol = _run(PolicyConfig(**{off: False}))
    srcs = {r[2] for r in rows}
    if off == "probe":
        assert "probe" not in srcs
    if off == "explore":
        assert "explore" not in srcs
    if off == "uniform_gate":
        assert pol.uniform_step_time is None
    if off == "admission":
        assert pol.admission is None
    if off == "calibration":
        assert pol.calibrator is None
    assert rows != json.loads(DATA.read_text())["rows"]


def test_decision_is_frozen_and_config_validated():
    d = Decision(budget=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.budget = 4
    with pytest.raises(ValueError, match="probe_prob"):
        PolicyConfig(probe_prob=1.5)
    with pytest.raises(ValueError, match="decision_max_age_s"):
        PolicyConfig(decision_max_age_s=0)
    assert PolicyConfig().with_fixed_exploration(0.0).explore_prob == 0.0


def test_declines_without_a_ready_model():
    pol = BudgetPolicy(local_model=fresh_model())
    assert pol.decide(np.ones((2, GAMMA)), max_len=GAMMA) is None and pol.warming_up
    assert BudgetPolicy(local_model=None).decide(np.ones((2, GAMMA)), max_len=GAMMA) is None


def test_policy_module_imports_no_torch_and_no_sglang():
    code = ("import sys, dspark_controller.core.policy; "
            "bad = [m for m in ('torch', 'sglang', 'sglang_dspark', 'zmq') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------
# The policy's strategies one by one, and the planner helpers they use (moved here from
# tests/unit/test_budget.py when BudgetBrain and the simulator's PlannerBrain became this
# one object).  ``_old(...)`` is the config the old worker brain ran with: no calibration
# and no admission gain unless a test turns them on, so the expectations stand as written.
from dspark_controller.core.method import survival_to_confidences  # noqa: E402
from dspark_controller.core.policy import SurvivalCalibrator  # noqa: E402
from dspark_controller.core.sps_model import SpsModel, SpsModelConfig  # noqa: E402


def _old(**kw) -> PolicyConfig:
    kw.setdefault("calibration", False)
    kw.setdefault("admission", False)
    return PolicyConfig(**kw)


def _rows(conf: list[list[float]]) -> np.ndarray:
    return np.cumprod(np.asarray(conf, dtype=np.float64), axis=1)


def test_calibrator_learns_that_low_lagged_survival_is_usually_accepted():
    rng = np.random.default_rng(0)
    cal = SurvivalCalibrator(bins=10, prior_weight=8.0, half_life=1e9)
    # predicted survival ~0.05 at every position, but 90% of the blocks are fully accepted
    for _ in range(400):
        s = np.full((4, 3), 0.05)
        acc = np.where(rng.random(4) < 0.9, 3, 0)
        cal.observe(s, acc.tolist(), [3, 3, 3, 3])
    out = cal.apply(np.full((2, 3), 0.05))
    assert out.shape == (2, 3)
    assert np.all(out > 0.8) and np.all(out < 0.97), out
    # cells without data keep the prediction (shrinkage prior)
    high = cal.apply(np.full((1, 3), 0.95))
    assert np.allclose(high, 0.95)


def test_calibrator_learns_only_from_steps_that_verified_every_draft_and_keeps_rows_monotone():
    cal = SurvivalCalibrator(bins=4, prior_weight=1.0, half_life=1e9)
    s = _rows([[0.9, 0.9, 0.9]])
    for _ in range(50):
        cal.observe(s, [1], [1])   # a budget stopped the window after position 0
    assert cal.observations == 0 and cal.n is None
    for _ in range(50):
        cal.observe(s, [1], [3])
    assert cal.n[0].sum() == pytest.approx(50) and cal.n[2].sum() == pytest.approx(50)
    out = cal.apply(s)
    assert np.all(np.diff(out, axis=1) <= 1e-12)
    assert out[0, 1] < 0.1      # prefixes through position 1 were never accepted
    # one cut window in the step: nothing of the step counts
    cal.observe(np.vstack([s, s]), [3, 1], [3, 2])
    assert cal.n[0].sum() == pytest.approx(50)
    # mismatched shapes (request order changed) are ignored, never raise
    cal.observe(s, [1, 2], [3, 3])
    assert cal.n[0].sum() == pytest.approx(50)


def test_calibration_is_not_raised_by_the_drafts_a_budget_admitted_on_their_live_confidences():
    """A budget admits each step's drafts by their live confidences, so the verified ones are
    the likelier accepted.  Lagged survival 0.5 everywhere, live confidences informative (half
    the requests' drafts accepted with 0.9, half with 0.1), three steps in four verifying the
    live top half: counting those steps' positions (the rule before 61f7bc8) read 0.75 for the
    0.5 bin; the truth over all drafts is 0.5, which the full-budget steps show."""
    rng = np.random.default_rng(0)
    cal = SurvivalCalibrator(bins=10, prior_weight=8.0, half_life=1e9)
    R, gamma = 8, 1
    for i in range(600):
        live = np.where(rng.random(R) < 0.5, 0.9, 0.1)
        acc = (rng.random(R) < live).astype(int)
        full = i % 4 == 0      # every fourth step verifies every draft
        ver = np.ones(R, dtype=int) if full else (live > 0.5).astype(int)
        cal.observe(np.full((R, gamma), 0.5), acc.tolist(), ver.tolist())
    got = float(cal.apply(np.full((1, gamma), 0.5))[0, 0])
    assert got == pytest.approx(0.5, abs=0.06), got


def test_calibrator_is_identity_before_any_observation_and_nan_safe():
    cal = SurvivalCalibrator()
    s = np.array([[0.3, np.nan, 0.1]])
    out = cal.apply(s)
    assert np.isfinite(out).all() and out[0, 0] == pytest.approx(0.3)


def test_unknown_rows_are_planned_on_the_known_row_and_never_calibrate():
    # a NaN row: the worker has no confidences of that request's own (budget.RelayedRows)
    pol = BudgetPolicy(local_model=_FlatModel(), config=_old(calibration=True, explore=False, probe=False,
                                                              no_draft=False))
    known = _rows([[0.9, 0.9, 0.9]])
    pol.decide(np.repeat(known, 2, axis=0), max_len=3)
    assert pol.last_known is None and np.allclose(pol._known_row, known[0])
    raw = np.vstack([known, np.full((1, 3), np.nan)])
    s = pol.calibrated(raw, 3)
    assert np.allclose(s, known) and pol.last_known.tolist() == [True, False]
    # the mean row learns from the known rows only
    pol.decide(np.vstack([_rows([[0.5, 0.5, 0.5]]), np.full((1, 3), np.nan)]), max_len=3)
    assert np.allclose(pol._known_row, known[0] + 0.25 * (_rows([[0.5, 0.5, 0.5]])[0] - known[0]))
    # no mean row yet: this step's known rows' mean, else 1 (SGLang's value)
    fresh = BudgetPolicy(local_model=_FlatModel(), config=_old(explore=False, probe=False, no_draft=False))
    assert np.allclose(fresh.calibrated(raw, 3), known)
    assert np.allclose(fresh.calibrated(np.full((2, 3), np.nan), 3), 1.0)
    # the calibrator counts no position of an unknown row
    cal = SurvivalCalibrator(bins=4, prior_weight=1.0, half_life=1e9)
    cal.observe(raw, [3, 0], [3, 3])
    assert cal.n.sum() == pytest.approx(3)


class _FlatModel:
    """Stand-in SPS model: step time = 20 ms + 1 ms per verified token."""
    ready = True
    steps = 10_000

    def sps_function(self, num_req):
        return lambda b: 1.0 / (0.020 + 0.001 * np.asarray(b, dtype=np.float64))


def test_policy_decides_from_float32_survival_as_from_float64():
    """(The worker hands the policy ``budget._host_array`` of SGLang's float32 survival;
    that conversion is tested in tests/unit/test_budget.py.)"""
    pol = BudgetPolicy(local_model=_FlatModel(), config=_old(explore_prob_young=0, explore_prob=0))
    s = _rows([[0.9, 0.8, 0.2, 0.1], [0.5, 0.5, 0.5, 0.5], [0.99, 0.99, 0.99, 0.99]])
    a = pol.decide(s, max_len=4)
    b = pol.decide(s.astype(np.float32).astype(np.float64), max_len=4)
    assert a.budget == b.budget and 0 < a.budget <= 12
    assert pol.sources["local"] == 2
    # calibrated-up survival can only raise the chosen budget on the same cost curve
    low = pol.decide(_rows([[0.3] * 4] * 3), max_len=4).budget
    high = pol.decide(_rows([[0.95] * 4] * 3), max_len=4).budget
    assert high >= low


def test_survival_to_confidences_inverts_cumprod():
    conf = np.array([[0.9, 0.5, 0.8], [1.0, 0.2, 0.0]])
    back = survival_to_confidences(np.cumprod(conf, axis=1))
    assert np.allclose(back[0], conf[0]) and np.allclose(back[1, :2], conf[1, :2])


def test_policy_explores_under_a_learned_controller_curve_but_not_under_a_pinned_policy():
    from types import SimpleNamespace

    model = SpsModel()
    for b in range(4, 21):
        model.update(4, b, 0.01 + 0.001 * b)
    surv = _rows([[0.9, 0.8, 0.7, 0.6]] * 4)
    cfg = _old(explore_prob_young=1.0, explore_prob=1.0, young_steps=10 ** 9)   # every step explores, if allowed
    for mode, explores in (("throughput", True), ("off", False), ("fixed", False)):
        d = SimpleNamespace(policy=SimpleNamespace(mode=mode, floor_tok_s=None), explore_prob=0.0,
                            verify_all=(mode == "off"), budget_frac=0.5, max_budget_tokens=None,
                            num_requests=4, budget_tokens=8, sps_function=lambda r: None)
        pol = BudgetPolicy(local_model=model, config=cfg, latest_decision=lambda _age: d)
        pol.decide(surv, max_len=4)
        assert (pol.last_source == "explore") == explores, (mode, pol.last_source)


def _ragged_model() -> SpsModel:
    """R = 1, 20 samples per ragged budget: each draft token costs 10 ms."""
    model = SpsModel()
    for _ in range(20):
        for b in range(1, 6):
            model.update(1, b, 0.02 + 0.01 * (b - 1))
    return model


def test_policy_takes_the_uniform_path_when_its_measured_step_is_cheaper():
    model = _ragged_model()
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0)
    ragged = BudgetPolicy(local_model=model, config=cfg).decide(surv, max_len=4)
    assert ragged.budget < 4                                           # the profile says: verify fewer
    uniform = {1: 0.025}                                               # all 4 drafts for 25 ms (measured)
    d = BudgetPolicy(local_model=model, config=cfg, uniform_step_time=uniform.get).decide(surv, max_len=4)
    assert d.budget == 4 and d.predicted_theta > ragged.predicted_theta
    slow = {1: 0.2}                                                    # uniform measured slower: keep ragged
    d = BudgetPolicy(local_model=model, config=cfg, uniform_step_time=slow.get).decide(surv, max_len=4)
    assert d.budget == ragged.budget
    nothing = {}                                                       # no uniform step seen at this R
    assert BudgetPolicy(local_model=model, config=cfg, uniform_step_time=nothing.get).decide(
        surv, max_len=4).budget == ragged.budget


def test_uniform_steps_count_for_the_exploration_schedule():
    model = SpsModel()
    model.update(1, 1, 0.02)                       # one sample in the one-request row
    for b in range(8, 48, 2):                      # ready (20 more samples, elsewhere)
        model.update(8, b, 0.05 + 0.001 * b)
    cfg = _old(explore_prob_young=1.0, young_steps=100, explore_prob=0.0, explore_prob_settled=0.0)
    pol = BudgetPolicy(local_model=model, config=cfg)
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    pol.decide(surv, max_len=4)
    assert pol.last_source == "explore"            # young: 21 profile steps, a thin row
    pol.uniform_steps = 200                        # ... but 200 uniform-path steps seen since
    pol.decide(surv, max_len=4)
    assert pol.last_source == "local"


def _controller_decision(model, *, mode="throughput", max_budget_tokens=None):
    from types import SimpleNamespace

    return SimpleNamespace(policy=SimpleNamespace(mode=mode, floor_tok_s=None), explore_prob=0.0,
                           verify_all=False, budget_frac=None, max_budget_tokens=max_budget_tokens,
                           num_requests=1, budget_tokens=None, sps_function=model.sps_function)


def test_controller_planned_budgets_also_take_the_cheaper_uniform_path_unless_capped_or_sla():
    model = _ragged_model()                # the controller's curve: each draft token costs 10 ms
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0)
    uniform = {1: 0.025}                   # this engine measured all 4 drafts for 25 ms
    cases = ((dict(), 4), (dict(max_budget_tokens=3), None), (dict(mode="sla"), None))
    for kw, want in cases:
        d = _controller_decision(model, **kw)
        planned = BudgetPolicy(local_model=None, config=cfg, latest_decision=lambda _a: d).decide(surv, max_len=4)
        pol = BudgetPolicy(local_model=None, config=cfg, latest_decision=lambda _a: d,
                           uniform_step_time=uniform.get)
        out = pol.decide(surv, max_len=4)
        assert pol.last_source == "controller"
        assert planned.budget < 4                                  # the curve alone: verify fewer
        assert out.budget == (want if want is not None else planned.budget), kw


def test_a_controller_decision_is_planned_on_the_controllers_whole_profile_when_one_arrived():
    tables, whole = SpsModel(), SpsModel()
    for _ in range(20):
        for b in range(1, 6):
            tables.update(1, b, 0.010 + 0.010 * (b - 1))   # what the decision's tables say: dear drafts
            whole.update(1, b, 0.010 + 0.0005 * (b - 1))   # the profile itself: nearly free drafts
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0, explore_prob_settled=0.0)
    d = _controller_decision(tables)
    on_tables = BudgetPolicy(local_model=None, config=cfg, latest_decision=lambda _a: d).decide(surv, max_len=4)
    assert on_tables.budget < 4
    for fleet, want in ((lambda: whole, 4), (lambda: None, on_tables.budget), (lambda: SpsModel(), on_tables.budget)):
        pol = BudgetPolicy(local_model=None, config=cfg, latest_decision=lambda _a: d, fleet_model=fleet)
        out = pol.decide(surv, max_len=4)
        assert pol.last_source == "controller" and out.budget == want   # no profile yet / not ready: tables


def test_uniform_comparison_prices_a_controller_plan_with_the_local_profile():
    from dspark_controller.core.strategies import local_theta

    fleet, local = SpsModel(), SpsModel()
    for _ in range(20):
        for b in range(1, 6):
            fleet.update(1, b, 0.010 + 0.004 * (b - 1))   # the fleet's curve: cheap ragged steps
            local.update(1, b, 0.020 + 0.008 * (b - 1))   # this engine measured them twice as slow
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0, explore_prob_settled=0.0)
    uniform = {1: 0.030}                                   # all 4 drafts on the uniform path: 30 ms
    d = _controller_decision(fleet)
    alone = BudgetPolicy(local_model=None, config=cfg, latest_decision=lambda _a: d,
                         uniform_step_time=uniform.get).decide(surv, max_len=4)
    assert alone.budget < 4                  # priced on the fleet's clock the ragged plan wins
    pol = BudgetPolicy(local_model=local, config=cfg, latest_decision=lambda _a: d,
                       uniform_step_time=uniform.get)
    out = pol.decide(surv, max_len=4)
    assert pol.last_source == "controller" and out.budget == 4   # on this engine's clock: uniform
    # the re-pricing itself: expected tokens kept, step time from the local profile
    t = float(local.predict_step_time(1, 3))
    assert abs(local_theta(100.0, 0.02, model=local, num_req=1, budget=2) - 2.0 / t) < 1e-9
    assert local_theta(100.0, 0.02, model=SpsModel(), num_req=1, budget=2) == 100.0   # not ready
    assert local_theta(100.0, None, model=local, num_req=1, budget=2) == 100.0


def test_fast_lagged_budget_equals_the_explained_planner():
    from dspark_controller.core.method import clean_survival, compute_lagged_budget, lagged_budget_fast

    rng = np.random.default_rng(3)
    model = SpsModel()
    for _ in range(3000):
        r = int(rng.integers(1, 33))
        b = r + int(rng.integers(0, 8 * r + 1))
        model.update(r, b, 0.02 + 0.0004 * b + 0.001 * r + 0.004 * (b > 64))
    checked = 0
    for _ in range(300):
        R, g = int(rng.integers(1, 33)), int(rng.integers(1, 9))
        conf = rng.beta(2, 1, size=(R, g))
        conf[rng.random((R, g)) < 0.05] = 1.0                      # ties
        surv = np.cumprod(conf, axis=1)
        sps = model.sps_function(R)
        ref = compute_lagged_budget(survival_to_confidences(surv), sps)
        k, theta, s = lagged_budget_fast(clean_survival(surv), sps)
        assert theta == pytest.approx(ref.predicted_throughput, rel=1e-12)
        assert s == pytest.approx(float(sps(R + k)), rel=1e-12)
        if k != ref.budget_tokens:       # only a float tie may pick another K of equal value
            assert float(sps(R + ref.budget_tokens)) * ref.expected_tau == pytest.approx(theta, rel=1e-12)
        checked += k == ref.budget_tokens
    assert checked >= 290


def test_clean_survival_matches_what_the_planner_assumes():
    from dspark_controller.core.method import clean_survival

    s = clean_survival([[np.nan, 0.5, 0.7], [1.5, -0.2, np.inf], [0.9, 0.8, 0.85]])
    assert s.tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.9, 0.8, 0.8]]
    back = np.cumprod(survival_to_confidences(s), axis=1)
    assert np.allclose(back, s)


def test_sps_function_evaluates_only_where_asked_and_agrees_with_predict():
    model = SpsModel()
    for r in (1, 4, 16):
        for b in range(r, 5 * r + 1):
            model.update(r, b, 0.02 + 0.0005 * b + 0.002 * r)
    for r in (1, 4, 16):
        fn = model.sps_function(r)
        bs = np.array([r, r + 1, 3 * r, 5 * r, 9000])            # 9000: past the table (linear tail)
        arr = fn(bs)
        assert np.allclose(arr, [fn(int(b)) for b in bs], rtol=1e-12)
        assert np.allclose(1.0 / arr[:4], model.predict_step_time(np.full(4, r), bs[:4]), rtol=1e-9)


class _Draws:
    """A stand-in rng that records how often it was drawn from."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def random(self):
        self.calls += 1
        return self.value


def test_prefer_uniform_rechecks_only_thin_ragged_cells():
    from dspark_controller.core.strategies import BOUNDARY_CHECK_PROB, BOUNDARY_MIN_SAMPLES, prefer_uniform

    thin, thick = SpsModel(), SpsModel()
    for b in range(1, 6):
        thin.update(1, b, 0.02 + 0.01 * (b - 1))                    # one sample per cell
        for _ in range(int(BOUNDARY_MIN_SAMPLES) + 4):
            thick.update(1, b, 0.02 + 0.01 * (b - 1))
    kw = dict(num_req=1, budget=2)
    # the ragged plan is predicted faster: ragged, no draw
    rng = _Draws(0.0)
    assert prefer_uniform(10.0, 20.0, model=thin, rng=rng, **kw) == (False, False) and rng.calls == 0
    assert prefer_uniform(None, 20.0, model=thin, rng=rng, **kw) == (False, False) and rng.calls == 0
    # uniform predicted faster, well-measured plan cell: uniform, no draw
    rng = _Draws(0.0)
    assert prefer_uniform(30.0, 20.0, model=thick, rng=rng, **kw) == (True, False) and rng.calls == 0
    # ... thin plan cell: one draw; below the check share the ragged plan runs (a check)
    rng = _Draws(BOUNDARY_CHECK_PROB / 2)
    assert prefer_uniform(30.0, 20.0, model=thin, rng=rng, **kw) == (False, True) and rng.calls == 1
    rng = _Draws(BOUNDARY_CHECK_PROB + 1e-3)
    assert prefer_uniform(30.0, 20.0, model=thin, rng=rng, **kw) == (True, False) and rng.calls == 1
    # a model without cells (or none at all) never re-checks
    assert prefer_uniform(30.0, 20.0, model=None, rng=_Draws(0.0), **kw) == (True, False)


def test_a_plan_priced_on_measured_neighbours_is_not_rechecked():
    """The re-check asks whether the plan's price stands on data: its cell and the
    ``row_window`` cells on each side (the row's local fit there); an empty cell between
    measured neighbours is not thin."""
    from dspark_controller.core.strategies import BOUNDARY_MIN_SAMPLES, prefer_uniform

    model = SpsModel()
    for b in (1, 2, 4, 5):                         # every cell near B = 3 but B = 3 itself
        for _ in range(int(BOUNDARY_MIN_SAMPLES)):
            model.update(1, b, 0.02 + 0.01 * (b - 1))
    assert float(model.cell_weights(1, [3])[0]) == 0.0
    half = model.config.row_window
    assert model.window_weight(1, 3) == pytest.approx(float(model.cell_weights(1, np.arange(max(3 - half, 1), 4 + half)).sum()))
    assert model.window_weight(1, 3) >= BOUNDARY_MIN_SAMPLES
    assert model.window_weight(1, 40) == 0.0      # far from every sample
    rng = _Draws(0.0)
    assert prefer_uniform(30.0, 20.0, model=model, rng=rng, num_req=1, budget=2) == (True, False)
    assert rng.calls == 0
    rng = _Draws(0.0)                              # a plan out where nothing was measured: re-checked
    assert prefer_uniform(30.0, 20.0, model=model, rng=rng, num_req=1, budget=39) == (False, True)


def test_a_near_tie_keeps_rechecking_at_a_fading_share():
    from dspark_controller.core.strategies import (BOUNDARY_CHECK_PROB, BOUNDARY_MIN_SAMPLES, BOUNDARY_NEAR, boundary_check_probability, prefer_uniform)

    n = int(2 * BOUNDARY_MIN_SAMPLES)
    thick = SpsModel()
    for b in range(1, 6):
        for _ in range(n):
            thick.update(1, b, 0.02 + 0.01 * (b - 1))
    w = thick.window_weight(1, 3)       # the plan's cell (R = 1, B = 3) and its neighbours
    assert w >= BOUNDARY_MIN_SAMPLES
    p = boundary_check_probability(w, 0.5 * BOUNDARY_NEAR)
    assert p == pytest.approx(BOUNDARY_CHECK_PROB * (BOUNDARY_MIN_SAMPLES / w) ** 2) and 0 < p < BOUNDARY_CHECK_PROB
    # it fades as the cell fills, is the full share on a thin cell, and zero past the margin
    assert boundary_check_probability(4 * w, 0.0) < p / 10
    assert boundary_check_probability(1.0, 5.0) == BOUNDARY_CHECK_PROB
    assert boundary_check_probability(w, BOUNDARY_NEAR) == 0.0
    kw = dict(num_req=1, budget=2)
    near = 20.0 * (1 + 0.5 * BOUNDARY_NEAR)
    rng = _Draws(p * 0.9)
    assert prefer_uniform(near, 20.0, model=thick, rng=rng, **kw) == (False, True) and rng.calls == 1
    rng = _Draws(p * 1.1)
    assert prefer_uniform(near, 20.0, model=thick, rng=rng, **kw) == (True, False) and rng.calls == 1
    rng = _Draws(0.0)   # a clear win: no draw, no check
    assert prefer_uniform(20.0 * (1 + 2 * BOUNDARY_NEAR), 20.0, model=thick, rng=rng, **kw) == (True, False)
    assert rng.calls == 0


def test_policy_rechecks_a_thin_ragged_plan_on_a_share_of_steps():
    """Uniform measured faster than a ragged plan the profile has barely seen: the policy
    still runs that plan on about BOUNDARY_CHECK_PROB of the steps (counted)."""
    from dspark_controller.core.strategies import BOUNDARY_CHECK_PROB

    model = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    for b in range(1, 6):                  # one sample per ragged budget: ready, but thin
        model.update(1, b, 0.02 + 0.01 * (b - 1))
    assert model.ready
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    uniform = {1: 0.025}
    pol = BudgetPolicy(local_model=model, config=_old(explore_prob_young=0.0, explore_prob=0.0),
                       uniform_step_time=uniform.get)
    n = 2000
    ks = [pol.decide(surv, max_len=4).budget for _ in range(n)]
    ragged = sum(k < 4 for k in ks)
    # ragged steps: the re-checks, plus the probes (planner.probe_budget), some of which
    # replaced a re-check's budget
    probes = pol.sources["probe"]
    assert pol.boundary_checks <= ragged <= pol.boundary_checks + probes
    assert abs(pol.boundary_checks / n - BOUNDARY_CHECK_PROB) < 0.04, pol.boundary_checks / n


def test_exploration_schedule_follows_the_rows_thinness():
    from dspark_controller.core.strategies import exploration_probability

    cfg = PolicyConfig()        # young 0.25 for 200 steps, then 0.03, 0.01 on a settled row
    assert exploration_probability(cfg, 10) == 0.25                       # unknown row: by steps
    assert exploration_probability(cfg, 10, thin=0.0) == 0.25             # young and blind
    assert exploration_probability(cfg, 10, thin=3.0) == 0.03             # young, measured twice
    assert exploration_probability(cfg, 10, thin=50.0) == 0.01            # young, settled row
    assert exploration_probability(cfg, 1000, thin=0.0) == 0.03           # old, thin row
    assert exploration_probability(cfg, 1000, thin=4.0) == 0.01           # old, settled row
    assert exploration_probability(cfg, 10 ** 6, thin=0.0) == 0.0         # past explore_until_steps
    # the young test asks the budgets' fit windows when known: thin cells, filled windows
    assert exploration_probability(cfg, 10, thin=1.0, window_thin=5.0) == 0.03
    assert exploration_probability(cfg, 10, thin=1.0, window_thin=1.0) == 0.25


def test_a_large_row_leaves_the_young_phase_once_each_budgets_window_is_measured():
    # 4 requests, gamma 4: 16 ragged budgets, each cell measured once (a young row by its
    # cells, two samples each would take 32 steps there); every budget's fit window (the
    # cell and 3 on each side) holds 4 or more samples, so the row explores at
    # explore_prob, not explore_prob_young
    from dspark_controller.core.strategies import explore_now, row_thinness, row_window_thinness

    model = SpsModel()
    for b in range(4, 20):
        model.update(4, b, 0.01 + 0.001 * b)
    assert row_thinness(model, num_req=4, full=16) < 2.0 <= row_window_thinness(model, num_req=4, full=16)
    cfg = PolicyConfig()
    assert explore_now(cfg, model, steps=10, num_req=4, full=16, rng=_Draws(0.1)) is False   # 0.1 > 0.03
    assert explore_now(cfg, model, steps=10, num_req=4, full=16, rng=_Draws(0.02)) is True
    # one sample only in the row: its other budgets' windows are empty, the row is young
    young = SpsModel()
    young.update(4, 4, 0.014)
    assert row_window_thinness(young, num_req=4, full=16) == 0.0
    assert explore_now(cfg, young, steps=10, num_req=4, full=16, rng=_Draws(0.1)) is True
    assert row_window_thinness(object(), num_req=4, full=16) is None


def test_row_thinness_counts_the_ragged_cells_only():
    from dspark_controller.core.strategies import row_thinness

    model = SpsModel()
    assert row_thinness(model, num_req=1, full=4) == 0.0
    for _ in range(5):
        for b in range(1, 5):              # K = 0..3 at R = 1; the full budget (B = 5) never
            model.update(1, b, 0.02 + 0.01 * b)
    thin = row_thinness(model, num_req=1, full=4)
    assert 4.9 < thin <= 5.0               # forgotten a little since
    assert row_thinness(model, num_req=1, full=0) is None
    assert row_thinness(object(), num_req=1, full=4) is None


def test_explore_now_draws_once_and_only_when_a_branch_can_explore():
    from dspark_controller.core.strategies import explore_now

    model = SpsModel()
    cfg = PolicyConfig()
    off = PolicyConfig(explore_prob_young=0.0, explore_prob=0.0, explore_prob_settled=0.0)
    rng = _Draws(0.0)
    assert explore_now(off, model, steps=0, num_req=1, full=4, rng=rng) is False and rng.calls == 0
    rng = _Draws(0.1)                          # under 0.25: explores on a blind row while young
    assert explore_now(cfg, model, steps=0, num_req=1, full=4, rng=rng) is True and rng.calls == 1
    rng = _Draws(0.02)                         # old and blind: 0.03 applies
    assert explore_now(cfg, model, steps=1000, num_req=1, full=4, rng=rng) is True
    for _ in range(10):
        for b in range(1, 5):
            model.update(1, b, 0.02 + 0.01 * b)
    rng = _Draws(0.02)                         # old and settled: 0.01 applies
    assert explore_now(cfg, model, steps=1000, num_req=1, full=4, rng=rng) is False and rng.calls == 1


def test_a_settled_row_explores_at_the_settled_rate():
    """uniform_settled: the uniform path beats the profile's best ragged budget by the
    boundary rule's verdict (BOUNDARY_NEAR, on BOUNDARY_MIN_SAMPLES); such a row explores
    only to stay fresh (explore_now's ``decided``, asked only when the draw falls between
    the settled rate and the row's)."""
    from dspark_controller.core.strategies import (BOUNDARY_MIN_SAMPLES, BOUNDARY_NEAR, explore_now, ragged_prices,
                                                   uniform_settled)

    model = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    for b in range(1, 5):                          # every ragged budget at R = 1, measured; the
        for _ in range(int(BOUNDARY_MIN_SAMPLES) if b < 4 else 2):   # last cell twice (not a settled row)
            model.update(1, b, 0.030 + 0.001 * (b - 1))
    model.refit()
    surv = _rows([[0.9, 0.9, 0.9, 0.9]])
    prices = ragged_prices(surv, num_req=1, model=model)
    tokens = 1 + np.concatenate(([0.0], np.cumsum(surv.ravel())[:-1]))
    assert prices == pytest.approx(tokens / model.predict_step_time(np.ones(4, dtype=int), 1 + np.arange(4)))
    best = float(prices.max())
    assert uniform_settled(best * (1 + BOUNDARY_NEAR) * 1.01, surv, num_req=1, model=model)
    assert not uniform_settled(best * (1 + BOUNDARY_NEAR) * 0.99, surv, num_req=1, model=model)   # a near tie
    assert not uniform_settled(None, surv, num_req=1, model=model)
    thin = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    for b in range(1, 5):
        thin.update(1, b, 0.030 + 0.001 * (b - 1))
    thin.update(1, 1, 0.030)
    assert not uniform_settled(best * 2, surv, num_req=1, model=thin)    # its price stands on 5 samples
    young = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    young.update(1, 1, 0.030)                      # one sample in the row: young
    for b in range(8, 12):
        young.update(8, b, 0.05)
    cfg = PolicyConfig()
    calls = []

    def decided():
        calls.append(1)
        return True
    # young and thin: 0.25; a draw above the settled rate (0.01) is declined on a decided row
    assert explore_now(cfg, young, steps=0, num_req=1, full=4, rng=_Draws(0.1), decided=decided) is False
    assert len(calls) == 1
    assert explore_now(cfg, young, steps=0, num_req=1, full=4, rng=_Draws(0.005), decided=decided) is True
    assert explore_now(cfg, young, steps=0, num_req=1, full=4, rng=_Draws(0.5), decided=decided) is False
    assert len(calls) == 1                         # not asked below the settled rate or above the row's
    assert explore_now(cfg, young, steps=0, num_req=1, full=4, rng=_Draws(0.1), decided=lambda: False) is True
    # the policy: a settled row explores ~explore_prob_settled of its steps
    cfg = _old(probe=False, explore_prob=0.2)
    fast = {1: (1 + surv.sum()) / (best * (1 + 2 * BOUNDARY_NEAR))}
    pol = BudgetPolicy(local_model=model, config=cfg, uniform_step_time=fast.get)
    n = 4000
    for _ in range(n):
        pol.decide(surv, max_len=4)
    assert pol.sources["explore"] / n < 2 * cfg.explore_prob_settled, pol.sources
    slow = {1: (1 + surv.sum()) / (best * (1 + 0.5 * BOUNDARY_NEAR))}
    pol = BudgetPolicy(local_model=model, config=cfg, uniform_step_time=slow.get)
    for _ in range(n):
        pol.decide(surv, max_len=4)
    assert pol.sources["explore"] / n > 0.1, pol.sources       # a near tie: the row's rate


def test_exploration_measures_the_most_promising_thin_budget():
    """explore_budget's targeted half, given the step's survival: the ragged budget the
    profile prices highest among those whose price stands on too few samples; once every
    one stands on data, the thinnest cell."""
    from dspark_controller.core.strategies import BOUNDARY_MIN_SAMPLES, explore_budget, ragged_prices

    model = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    for b in range(1, 41):                          # R = 4, B = 1..40: one sample each
        model.update(4, b, 0.02 + 0.001 * b)
    model.refit()
    surv = _rows([[0.9] * 4] * 4)                   # full = 16: K = 0..15, B = 4..19
    prices = ragged_prices(surv, num_req=4, model=model)
    assert np.all(np.asarray(model.window_weight(4, 4 + np.arange(16))) < BOUNDARY_MIN_SAMPLES)
    assert explore_budget(model, num_req=4, full=16, rng=_Draws(0.1), survival=surv) == int(np.argmax(prices))
    for b in range(1, 41):
        for _ in range(int(BOUNDARY_MIN_SAMPLES)):
            model.update(4, b, 0.02 + 0.001 * b)
    assert np.all(np.asarray(model.window_weight(4, 4 + np.arange(16))) >= BOUNDARY_MIN_SAMPLES)
    w = model.cell_weights(4, 4 + np.arange(16))
    assert explore_budget(model, num_req=4, full=16, rng=_Draws(0.0), survival=surv) == int(np.argmin(w))
    assert explore_budget(model, num_req=4, full=16, rng=_Draws(0.0)) == int(np.argmin(w))   # no survival


def test_probes_move_ragged_choices_only():
    """A full budget (the uniform path) is not probed: the ragged plans near it are
    measured by the boundary re-checks (prefer_uniform) and by exploration."""
    model = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    for b in range(1, 6):
        for _ in range(20):
            model.update(1, b, 0.02 + 0.01 * (b - 1))
    surv = _rows([[0.95, 0.95, 0.95, 0.95]])
    cfg = _old(explore=False, probe_prob=0.5)
    pol = BudgetPolicy(local_model=model, config=cfg, uniform_step_time={1: 0.021}.get)
    ks = [pol.decide(surv, max_len=4).budget for _ in range(400)]
    assert pol.sources["probe"] == 0 and set(ks) == {4}, pol.sources
    low = _rows([[0.9, 0.5, 0.1, 0.1]])            # a ragged plan wins: it is probed
    pol = BudgetPolicy(local_model=model, config=cfg, uniform_step_time={1: 0.2}.get)
    ks = [pol.decide(low, max_len=4).budget for _ in range(400)]
    assert pol.sources["probe"] > 100 and max(ks) < 4, (pol.sources, set(ks))


def test_uniform_times_follow_the_profiles_drift_factor_not_its_refits():
    """A uniform-path time measured during a slow spell must not outlive it: stored over the
    profile's drift factor, it is read back on today's.  A refit of the profile's shape
    (another load's row filling in) does not move it: the time is the comparison's measured
    side, and a young profile's rows move by several times."""
    from dspark_controller.core.strategies import UNIFORM_EMA

    model = SpsModel()
    times = UniformTimes(model)
    times.observe(1, 0.05, 5)                     # no drift yet: seconds
    assert times.get(1) == pytest.approx(0.05)
    for _ in range(20):
        for b in range(1, 6):
            model.update(1, b, 0.02 + 0.01 * (b - 1))
    for _ in range(50):
        times.observe(1, 0.045, 5)
    v = 0.045 + (0.05 - 0.045) * (1 - UNIFORM_EMA) ** 50
    assert times.get(1) == pytest.approx(v * model.scale)
    s0 = model.scale
    for _ in range(300):                          # 16 requests' row fills in: the fit moves, no drift
        for b in range(1, 6):
            model.update(16, 16 * b, 0.05 + 0.002 * 16 * b)
    assert model.scale == s0 and times.get(1) == pytest.approx(v * s0)
    for _ in range(300):                          # the machine gets 2x slower: ragged steps say so
        for b in range(1, 6):
            model.update(1, b, 2 * (0.02 + 0.01 * (b - 1)))
    assert model.scale / s0 > 1.5
    assert times.get(1) == pytest.approx(v * model.scale)
    times.observe(1, -1.0, 5)                     # ignored
    assert times.get(1) == pytest.approx(v * model.scale)
    assert times.get(3) is None
    plain = UniformTimes(None)                    # no profile: plain seconds
    plain.observe(2, 0.03, 10)
    assert plain.get(2) == 0.03


def test_probe_budget_steps_to_a_neighbour_on_a_small_share_of_steps():
    """planner.probe_budget: PROBE_PROB of the steps, half up and half down by PROBE_STEP of
    the draft tokens but at most PROBE_MAX_PER_REQUEST drafts per request, clipped to the
    ragged budgets; from a full budget only down; one draw."""
    import random

    from dspark_controller.core.strategies import PROBE_MAX_PER_REQUEST, PROBE_PROB, PROBE_STEP, probe_budget

    rng = random.Random(1)
    n, full, k, R = 20000, 128, 40, 32          # gamma 4: a quarter of the drafts is one per request
    got = [probe_budget(k, full=full, num_req=R, rng=rng) for _ in range(n)]
    probes = [x for x in got if x is not None]
    assert abs(len(probes) / n - PROBE_PROB) < 0.01
    delta = int(round(PROBE_STEP * full))
    assert delta == int(PROBE_MAX_PER_REQUEST * R)
    assert set(probes) == {k - delta, k + delta}
    assert abs(sum(x > k for x in probes) / len(probes) - 0.5) < 0.08
    assert probe_budget(5, full=128, num_req=R, rng=_Draws(0.04)) == 0                 # down, clipped
    assert probe_budget(120, full=128, num_req=R, rng=_Draws(0.001)) == 127            # ... and to a ragged budget
    assert probe_budget(128, full=128, num_req=R, rng=_Draws(0.001)) == 128 - delta    # "up" from full: down
    assert probe_budget(3, full=4, num_req=1, rng=_Draws(0.001)) is None               # no neighbour: 3 + 1 -> 3
    assert probe_budget(0, full=1, num_req=1, rng=_Draws(0.0)) is None
    assert probe_budget(40, full=128, num_req=R, rng=_Draws(PROBE_PROB)) is None
    # gamma 7 at 64 requests: a quarter of the drafts would be 1.75 per request; one per request
    assert probe_budget(120, full=448, num_req=64, rng=_Draws(0.001)) == 120 + 64
    assert probe_budget(120, full=448, num_req=64, rng=_Draws(0.04), max_per_request=0.5) == 120 - 32
    assert probe_budget(2, full=14, num_req=2, rng=_Draws(0.001)) == 2 + 2               # round(3.5) capped at 2
    d = _Draws(0.5)
    probe_budget(40, full=128, num_req=R, rng=d)
    assert d.calls == 1


def test_admission_gain_learns_each_kind_and_tips_the_uniform_comparison():
    """planner.AdmissionGain: realised / predicted accepted drafts, per kind of step, 1 until
    enough steps; the policy scales each side of its uniform comparison by its own factor
    (learned through observe_step) and records the plan's uncorrected expected drafts for
    the worker to compare."""
    from dspark_controller.core.strategies import ADMISSION_MIN_STEPS, AdmissionGain, admitted_theta

    g = AdmissionGain()
    for _ in range(ADMISSION_MIN_STEPS - 1):
        g.observe(10.0, 13.0, uniform=False)
        g.observe(10.0, 10.0, uniform=True)
    assert g.factor(uniform=False) == 1.0                       # not enough steps yet
    g.observe(10.0, 13.0, uniform=False)
    g.observe(float("nan"), 5.0, uniform=False)                 # ignored
    assert abs(g.factor(uniform=False) - 1.3) < 1e-9
    assert g.summary()["ragged"]["steps"] == ADMISSION_MIN_STEPS and g.factor(uniform=True) == 1.0
    for _ in range(5000):                                        # it forgets: the ratio follows
        g.observe(10.0, 100.0, uniform=True)
    assert g.factor(uniform=True) == 2.0                         # clipped
    # 20 tokens/s over 0.5 s: 10 tokens, 4 of them bonus tokens -> 6 drafts; x1.5 -> 13 tokens
    assert abs(admitted_theta(20.0, 0.5, num_req=4, factor=1.5) - 26.0) < 1e-9
    assert admitted_theta(None, 0.5, num_req=4, factor=1.5) is None

    model = _ragged_model()
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0)
    ragged = BudgetPolicy(local_model=model, config=cfg).decide(surv, max_len=4)
    # uniform a little ahead on the lagged survival's word ...
    t_u = ((1 + 0.9 + 0.72 + 0.504 + 0.3024) / ragged.predicted_theta) * 0.97
    uniform = {1: t_u}
    plain = BudgetPolicy(local_model=model, config=cfg, uniform_step_time=uniform.get)
    assert plain.decide(surv, max_len=4).budget == 4
    assert abs(plain.last_pred_drafts - (0.9 + 0.72 + 0.504 + 0.3024)) < 1e-6
    # ... but ragged steps have been accepting 30% more than it said: ragged wins
    tipped = BudgetPolicy(local_model=model, config=_old(explore_prob_young=0.0, explore_prob=0.0, admission=True),
                          uniform_step_time=uniform.get)
    for _ in range(ADMISSION_MIN_STEPS):
        tipped.observe_step(survival=None, accepted=[13], verified=None, pred_drafts=10.0, uniform=False)
        tipped.observe_step(survival=None, accepted=[10], verified=None, pred_drafts=10.0, uniform=True)
    assert abs(tipped.admission.factor(uniform=False) - 1.3) < 1e-9 and tipped.admission.factor(uniform=True) == 1.0
    d = tipped.decide(surv, max_len=4)
    assert d.budget == ragged.budget < 4
    assert abs(tipped.last_pred_drafts - (ragged.predicted_theta * ragged.predicted_step_seconds - 1)) < 1e-6


def test_the_admission_gain_moves_the_ragged_budget_and_the_plan_keeps_the_forecasts_price():
    """A ragged budget is chosen on the lagged survival scaled by the ragged steps'
    realised-over-predicted accepted drafts (clipped at 1): SGLang admits by live
    confidences, so the admitted drafts accept more than the lagged top-K at the margin.
    The plan's price stays the unscaled forecast's, which the gain learns against."""
    from dspark_controller.core.strategies import ADMISSION_MIN_STEPS

    model = _ragged_model()                     # R = 1: 20 ms + 10 ms per verified draft
    surv = _rows([[0.9, 0.9, 0.8, 0.5]])        # survival 0.9, 0.81, 0.648, 0.324
    cfg = dict(explore_prob_young=0.0, explore_prob=0.0, probe=False)
    plain = BudgetPolicy(local_model=model, config=_old(**cfg)).decide(surv, max_len=4)
    assert plain.budget == 2                    # 2.71 tokens / 40 ms beats 3.36 / 50 ms
    pol = BudgetPolicy(local_model=model, config=_old(admission=True, **cfg))
    assert pol.decide(surv, max_len=4).budget == 2          # factor 1 before enough steps
    for _ in range(ADMISSION_MIN_STEPS):
        pol.observe_step(survival=None, accepted=[13], verified=None, pred_drafts=10.0, uniform=False)
    assert abs(pol.admission.factor(uniform=False) - 1.3) < 1e-9
    d = pol.decide(surv, max_len=4)
    assert d.budget == 3                        # x1.3: 3.84 tokens / 50 ms beats 3.0 / 40 ms
    t3 = float(model.predict_step_time(1, 4))
    assert d.predicted_step_seconds == pytest.approx(t3)
    assert d.predicted_theta == pytest.approx((1 + 0.9 + 0.81 + 0.648) / t3)   # unscaled
    assert pol.last_pred_drafts == pytest.approx(0.9 + 0.81 + 0.648)
    # ragged steps that accepted less than forecast pull the budget down the same way
    low = BudgetPolicy(local_model=model, config=_old(admission=True, **cfg))
    for _ in range(ADMISSION_MIN_STEPS):
        low.observe_step(survival=None, accepted=[6], verified=None, pred_drafts=10.0, uniform=False)
    assert low.decide(surv, max_len=4).budget < 2


def test_a_controller_planned_budget_is_chosen_on_the_admitted_survival_and_teaches_the_gain():
    """A controller-planned step's K (the fleet's curve, planned here) is chosen on the
    survival scaled by the admission gain as a local plan's is, with the unscaled forecast
    as its price; and a ragged one's realised drafts teach the gain, so a worker that
    follows a controller learns it too (before, controller at 256 users in the simulator verified
    0.6-1.1 drafts per request where the oracle verified 1.4)."""
    from dspark_controller.core.strategies import ADMISSION_MIN_STEPS

    model = _ragged_model()                     # the fleet's curve and the local profile
    surv = _rows([[0.9, 0.9, 0.8, 0.5]])        # survival 0.9, 0.81, 0.648, 0.324
    cfg = dict(explore_prob_young=0.0, explore_prob=0.0, explore_prob_settled=0.0, probe=False)
    d = _controller_decision(model)
    pol = BudgetPolicy(local_model=model, config=_old(admission=True, **cfg), latest_decision=lambda _a: d,
                       fleet_model=lambda: model)
    assert pol.decide(surv, max_len=4).budget == 2 and pol.last_source == "controller"
    for _ in range(ADMISSION_MIN_STEPS):        # controller-planned steps that accepted 30% more
        pol.observe_step(survival=None, accepted=[13], verified=None, pred_drafts=10.0, uniform=False,
                         step_s=0.04, source="controller")
    assert abs(pol.admission.factor(uniform=False) - 1.3) < 1e-9
    for _ in range(ADMISSION_MIN_STEPS):        # its uniform-path steps teach only the local plans' gain
        pol.observe_step(survival=None, accepted=[5], verified=None, pred_drafts=10.0, uniform=True,
                         step_s=0.04, source="controller")
    assert pol.admission.factor(uniform=True) == 1.0
    out = pol.decide(surv, max_len=4)
    assert pol.last_source == "controller" and out.budget == 3   # x1.3: 3.84 / 50 ms beats 3.0 / 40 ms
    t3 = float(model.predict_step_time(1, 4))
    assert out.predicted_theta == pytest.approx((1 + 0.9 + 0.81 + 0.648) / t3)   # unscaled
    # an SLA floor plans on the unscaled survival (its floor is a promise on the forecast)
    floor = _controller_decision(model, mode="sla")
    floor.policy.floor_tok_s = 1.0
    sla = BudgetPolicy(local_model=model, config=_old(admission=True, **cfg), latest_decision=lambda _a: floor)
    sla.admission = pol.admission
    assert sla.decide(surv, max_len=4).budget == 2


def test_a_capped_controller_budget_carries_the_price_of_the_k_that_runs():
    """Under a controller's ``max_budget_tokens`` the plan is the best K within the cap, and
    the decision carries that K's predicted step time and tokens/s, which the admission gain
    and the gate's realised rate compare the step's outcome with (before, a capped K carried
    the uncapped plan's price: 4 drafts' tokens over 2 drafts' step)."""
    cheap = SpsModel()                          # the fleet's curve: drafts nearly free
    for _ in range(20):
        for b in range(1, 6):
            cheap.update(1, b, 0.010 + 0.0005 * (b - 1))
    surv = _rows([[0.9, 0.9, 0.8, 0.5]])        # survival 0.9, 0.81, 0.648, 0.324
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0, explore_prob_settled=0.0, probe=False)
    for cap, want in ((None, 4), (2, 2), (0, 0)):
        d = _controller_decision(cheap, max_budget_tokens=cap)
        pol = BudgetPolicy(local_model=None, config=cfg, latest_decision=lambda _a: d, fleet_model=lambda: cheap)
        out = pol.decide(surv, max_len=4)
        assert pol.last_source == "controller" and out.budget == want, cap
        t = float(cheap.predict_step_time(1, 1 + want))
        assert out.predicted_step_seconds == pytest.approx(t), cap
        assert out.predicted_theta == pytest.approx((1 + float(np.sort(surv[0])[::-1][:want].sum())) / t), cap


def test_ragged_time_prices_the_ragged_plan_on_what_its_steps_took():
    """strategies.RaggedTime: predicted over realised seconds of the local ragged plans, per
    R, 1 until enough steps there; the uniform comparison scales the ragged plan's tokens/s
    by it, so a profile that prices a ragged plan fast while its steps run slow loses to a
    measured uniform path (the deep pair's young profile priced one draft per request at
    16 requests at 131-135 tok/s; those steps realised about 105)."""
    from dspark_controller.core.strategies import RAGGED_TIME_MIN, RaggedTime

    g = RaggedTime()
    for _ in range(RAGGED_TIME_MIN - 1):
        g.observe(1, 0.02, 0.04)
    assert g.factor(1) == 1.0                                   # not enough steps yet
    g.observe(1, 0.02, 0.04)
    g.observe(1, None, 0.04)                                    # not a ragged plan: ignored
    g.observe(1, float("nan"), 0.04)
    assert abs(g.factor(1) - 0.5) < 1e-9 and g.factor(2) == 1.0  # per R
    assert g.summary()[1]["steps"] == RAGGED_TIME_MIN
    for _ in range(200):                                         # it forgets: the ratio follows
        g.observe(1, 0.02, 0.025)
    assert abs(g.factor(1) - 0.8) < 1e-6

    model = _ragged_model()
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0, probe=False)
    ragged = BudgetPolicy(local_model=model, config=cfg).decide(surv, max_len=4)
    assert ragged.budget < 4
    # the uniform path measured a little slower than the profile's word on the ragged plan
    t_u = ((1 + 0.9 + 0.72 + 0.504 + 0.3024) / ragged.predicted_theta) * 1.1
    uniform = {1: t_u}
    pol = BudgetPolicy(local_model=model, config=cfg, uniform_step_time=uniform.get)
    assert pol.decide(surv, max_len=4).budget == ragged.budget
    assert abs(pol.last_pred_ragged_s - ragged.predicted_step_seconds) < 1e-12
    # ... but the ragged plan's steps have taken 1.5x what it predicted: uniform wins
    for _ in range(RAGGED_TIME_MIN):
        pol.decide(surv, max_len=4)
        pol.observe_step(survival=None, accepted=[2], verified=None, pred_drafts=pol.last_pred_drafts,
                         uniform=False, step_s=1.5 * pol.last_pred_ragged_s, pred_ragged_s=pol.last_pred_ragged_s)
    assert abs(pol.ragged_time.factor(1) - 1 / 1.5) < 1e-9
    d = pol.decide(surv, max_len=4)
    assert d.budget == 4 and pol.last_pred_ragged_s is None      # a uniform plan predicts no ragged time
    # with the strategy off the profile's word stands
    off = BudgetPolicy(local_model=model, config=dataclasses.replace(cfg, ragged_time=False),
                       uniform_step_time=uniform.get)
    for _ in range(RAGGED_TIME_MIN):
        off.decide(surv, max_len=4)
        off.observe_step(survival=None, accepted=[2], verified=None, pred_drafts=off.last_pred_drafts,
                         uniform=False, step_s=1.5 * off.last_pred_ragged_s, pred_ragged_s=off.last_pred_ragged_s)
    assert off.ragged_time is None and off.decide(surv, max_len=4).budget == ragged.budget


def test_a_full_budget_plan_is_priced_on_the_uniform_path_it_runs_on():
    """A plan whose best budget is the full one runs on the uniform path: with that path's
    time measured at this R it is priced on it, not on the ragged profile's full-budget
    cell (on the deep pair a young profile priced 16 requests' full budget at 248 ms where
    the uniform step took about 100, and the gate switched drafting off on that price)."""
    model = _ragged_model()
    surv = _rows([[0.99, 0.99, 0.99, 0.99]])
    cfg = _old(explore_prob_young=0.0, explore_prob=0.0, probe=False)
    ragged = BudgetPolicy(local_model=model, config=cfg).decide(surv, max_len=4)
    assert ragged.budget == 4
    assert ragged.predicted_step_seconds == pytest.approx(float(model.predict_step_time(1, 5)))
    for t_u in (0.5 * ragged.predicted_step_seconds, 2.0 * ragged.predicted_step_seconds):
        d = BudgetPolicy(local_model=model, config=cfg, uniform_step_time={1: t_u}.get).decide(surv, max_len=4)
        assert d.budget == 4 and d.predicted_step_seconds == pytest.approx(t_u)
        assert d.predicted_theta == pytest.approx((1 + float(surv.sum())) / t_u)


def test_a_boundary_recheck_votes_with_the_uniform_path_not_its_thin_ragged_plan():
    """A boundary re-check runs a thin ragged plan to measure its cell; the verdict on plain
    decoding is the uniform path's, which the policy would run otherwise.  Here the ragged
    plan (about 65 tokens/s) loses to measured no-draft steps (100) and the uniform path
    (137) beats them: drafting must stay on however many re-checks run (the deep pair's
    trace had a re-check at 4 requests ask for eight no-draft steps)."""
    model = SpsModel(config=SpsModelConfig(min_ready_samples=5))
    for b in range(1, 6):                  # one sample per ragged budget: ready, but thin
        model.update(1, b, 0.02 + 0.01 * (b - 1))
    surv = _rows([[0.9, 0.8, 0.7, 0.6]])
    pol = BudgetPolicy(local_model=model, config=_old(explore_prob_young=0.0, explore_prob=0.0, probe=False),
                       uniform_step_time={1: 0.025}.get)
    for _ in range(pol.off_times.MIN_SAMPLES):
        pol.off_times.observe_off(1, 0.01)
    assert pol.off_times.measured(1)
    for _ in range(400):
        if pol.draft_step(1):
            pol.decide(surv, max_len=4)
    assert pol.boundary_checks > 40
    assert not pol.gate.off and pol.gate.switches["off"] == 0, pol.gate.summary()
