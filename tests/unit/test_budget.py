"""The worker's side of the budget policy (no engine): the numpy adapter, the policy's
config from the settings, and the full-budget layout shortcut.  The policy itself
(dspark_controller.core.policy.BudgetPolicy) is tested in tests/controller/test_policy.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_host_array_gives_the_same_float64_array_for_a_cpu_tensor_and_numpy():
    from sglang_dspark.budget import _host_array

    s = np.cumprod(np.array([[0.9, 0.8, 0.2, 0.1], [0.5, 0.5, 0.5, 0.5], [0.99, 0.99, 0.99, 0.99]]),
                   axis=1).astype(np.float32)
    t = torch.from_numpy(s.copy())
    from_tensor, from_numpy = _host_array(t), _host_array(s)
    assert from_tensor.dtype == np.float64 and from_numpy.dtype == np.float64
    assert np.array_equal(from_tensor, from_numpy)
    assert np.array_equal(from_tensor, s.astype(np.float64))
    # the adapter hands it a column slice of SGLang's survival (a strided view)
    assert np.array_equal(_host_array(t[:, :3]), s[:, :3].astype(np.float64))
    assert np.array_equal(_host_array(s.astype(np.float64)), s.astype(np.float64))
    # the copy never aliases the tensor
    out = _host_array(t)
    out[0, 0] = -1.0
    assert float(t[0, 0]) == pytest.approx(float(s[0, 0]))


def test_policy_config_from_settings():
    from dspark_controller.core.policy import PolicyConfig
    from sglang_dspark.budget import policy_config
    from sglang_dspark.settings import Settings

    cfg = policy_config(Settings.from_env({"SGLANG_DSPARK_EXPLORE_PROB": "0",
                                           "SGLANG_DSPARK_DECISION_MAX_AGE_S": "7.5"}))
    assert cfg.explore_prob_young == cfg.explore_prob == cfg.explore_prob_settled == 0.0
    assert cfg.decision_max_age_s == 7.5
    fixed = policy_config(Settings.from_env({"SGLANG_DSPARK_EXPLORE_PROB": "0.1"}))
    assert fixed.explore_prob_young == fixed.explore_prob == fixed.explore_prob_settled == 0.1
    # unset: the policy's own schedule and age limit
    default = policy_config(Settings.from_env({}))
    assert default == PolicyConfig()


def test_full_budget_static_default_and_env():
    from sglang_dspark.settings import Settings, SettingsError
    from sglang_dspark.worker import _full_budget_static

    def resolved(raw, device):
        env = {} if raw is None else {"SGLANG_DSPARK_FULL_BUDGET_STATIC": raw}
        return _full_budget_static(Settings.from_env(env).full_budget_static, device)

    assert resolved(None, "cpu") is True          # auto: on for CPU devices
    assert resolved("auto", "cuda") is False      # ... off elsewhere (unmeasured)
    assert resolved("0", "cpu") is False
    assert resolved("on", "cuda") is True
    with pytest.raises(SettingsError, match="write 1/0, true/false, on/off or auto"):
        resolved("sometimes", "cpu")


def test_full_budget_static_wrapper_skips_the_layout_only_at_full_budget():
    from sglang_dspark.worker import _FullBudgetStatic

    calls = []
    wrap = _FullBudgetStatic(lambda **kw: calls.append(kw) or "ragged", gamma=4)
    rows = torch.arange(3)
    assert wrap(budget=12, req_pool_indices=rows) is None and wrap.last_static   # 3 x 4: full
    assert wrap(budget=11, req_pool_indices=rows) == "ragged" and not wrap.last_static
    # DP tiers or a global batch larger than this rank's keep SGLang's layout
    assert wrap(budget=12, req_pool_indices=rows, dp_tier_num_tokens=[15]) == "ragged"
    assert wrap(budget=12, req_pool_indices=rows, global_num_reqs=5) == "ragged"
    assert wrap(budget=None, req_pool_indices=rows) == "ragged"
    assert wrap.static_steps == 1 and len(calls) == 4


def test_relayed_rows_are_unknown_until_the_request_drafted_in_its_slot():
    # SGLang's CPU relay stamps a row with the slot's current generation, so a request that
    # has not drafted yet reads the slot's previous request's (or uninitialised) confidences
    from sglang_dspark.budget import RelayedRows

    rel = RelayedRows(lag=1)
    conf = torch.tensor([[0.9, 0.8], [1e33, float("nan")]])
    slots, gen = torch.tensor([3, 7]), torch.tensor([1, 1])
    out = rel.mask(conf, slots, gen)            # both requests' first drafted step
    assert torch.isnan(out).all() and rel.unknown_rows == 2
    out = rel.mask(conf, slots, gen)            # each drafted once in its slot: their own now
    assert out is conf
    # slot 7 handed to a new request (generation 2): unknown again, slot 3 stays known
    out = rel.mask(conf, slots, torch.tensor([1, 2]))
    assert torch.equal(out[0], conf[0]) and torch.isnan(out[1]).all() and rel.unknown_rows == 3
    # a larger slot than seen so far grows the tables
    assert torch.isnan(rel.mask(conf[:1], torch.tensor([1000]), torch.tensor([5]))).all()
    # lag 0 (no overlap scheduling: SGLang plans on the step's own confidences): never masked
    assert torch.equal(RelayedRows(lag=0).mask(conf[:1], slots[:1], gen[:1]), conf[:1])
    # a GPU's ring lag: known after that many drafted steps
    ring = RelayedRows(lag=2)
    assert torch.isnan(ring.mask(conf, slots, gen)).all() and torch.isnan(ring.mask(conf, slots, gen)).all()
    assert ring.mask(conf, slots, gen) is conf
    with pytest.raises(ValueError, match="lag=-1"):
        RelayedRows(lag=-1)
