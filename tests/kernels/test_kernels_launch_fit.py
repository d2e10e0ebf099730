"""The persistent launch's grid fits the SMs this process has (MPS limits included).

The spin barrier of a persistent launch with several vocab splits waits for every
program of its row block, so the whole grid must be resident at once. These tests
plan GPU launches on CPU (``interpret=False``) and run the fallback plan through the
Triton interpreter.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from dspark_kernel_testutil import clone_kwargs, make_inputs
from dspark_kernels import sequential_head_reference
from dspark_kernels import triton_seq_head as tsh
from dspark_kernels.contract import validate_inputs

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "sms,text,expected",
    [
        (132, None, 132),
        (132, "", 132),
        (132, "  ", 132),
        (132, "100", 132),
        (132, " 50 ", 66),
        (132, "12.5", 16),  # floor(16.5)
        (132, "0.5", 1),  # never below one SM
        (132, "0", 1),  # not a percentage: no cross-program barrier
        (132, "-20", 1),
        (132, "150", 1),
        (132, "half", 1),
        (132, "nan", 1),
        (0, None, 1),
    ],
)
def test_available_sms(sms, text, expected):
    assert tsh.available_sms(sms, text) == expected


def test_bad_percentage_is_logged_once(caplog):
    tsh._LOGGED.discard("bad-mps-percentage")
    with caplog.at_level(logging.WARNING, logger=tsh.__name__):
        tsh.available_sms(132, "lots")
        tsh.available_sms(132, "lots")
    lines = [r for r in caplog.records if tsh.MPS_PERCENTAGE_ENV in r.getMessage()]
    assert len(lines) == 1 and "'lots'" in lines[0].getMessage()


def _grid(plan):
    return plan.num_splits * plan.row_blocks


@pytest.mark.parametrize("sms", [1, 2, 7, 16, 33, 66, 132])
@pytest.mark.parametrize("mode", ["auto", "persistent"])
def test_barrier_grid_never_exceeds_available_sms(sms, mode):
    for batch in (1, 5, 16, 17, 64, 65, 200, 256, 1000, 4096):
        for vocab in (37, 1000, 32000, 151936):
            plan = tsh.plan_launch(batch=batch, vocab=vocab, rank=256, device=CPU, launch_mode=mode,
                                   sm_count=sms, interpret=False)
            if plan.mode == "persistent" and plan.num_splits > 1:
                assert _grid(plan) <= sms, (sms, batch, vocab, plan)


def test_requested_splits_that_do_not_fit_run_stepwise_logged_once(caplog):
    tsh._LOGGED.discard("persistent-does-not-fit")
    with caplog.at_level(logging.WARNING, logger=tsh.__name__):
        fits = tsh.plan_launch(batch=40, vocab=32000, rank=256, device=CPU, launch_mode="persistent",
                               num_splits=4, sm_count=8, interpret=False)
        assert fits.mode == "persistent" and _grid(fits) == 8
        assert not caplog.records
        big = tsh.plan_launch(batch=40, vocab=32000, rank=256, device=CPU, launch_mode="persistent",
                              num_splits=5, sm_count=8, interpret=False)
        again = tsh.plan_launch(batch=300, vocab=32000, rank=256, device=CPU, launch_mode="persistent",
                                num_splits=3, sm_count=8, interpret=False)
    assert (big.mode, big.num_splits) == ("stepwise", 5)
    assert again.mode == "stepwise"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "does not fit the 8 available SMs" in lines[0], lines


@pytest.fixture
def fake_cuda_device(monkeypatch):
    """torch.cuda reporting a 132-SM device 0 (no GPU needed)."""
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    tsh._AVAILABLE_SMS.clear()
    yield torch.device("cuda", 0)
    tsh._AVAILABLE_SMS.clear()


def test_device_sms_respect_the_mps_percentage(monkeypatch, fake_cuda_device, caplog):
    monkeypatch.setenv(tsh.MPS_PERCENTAGE_ENV, "25")
    tsh._LOGGED.discard("mps-limit-0")
    with caplog.at_level(logging.INFO, logger=tsh.__name__):
        assert tsh.device_available_sms(fake_cuda_device) == 33
        assert tsh.device_available_sms(torch.device("cuda")) == 33  # current device, cached
    assert sum("leaves 33" in r.getMessage() for r in caplog.records) == 1
    for batch in (1, 16, 64, 256):
        plan = tsh.plan_launch(batch=batch, vocab=151936, rank=256, device=fake_cuda_device,
                               launch_mode="persistent", interpret=False)
        assert plan.mode == "persistent" and _grid(plan) <= 33, plan
    # without the limit the same planner fills the device
    monkeypatch.delenv(tsh.MPS_PERCENTAGE_ENV)
    tsh._AVAILABLE_SMS.clear()
    plan = tsh.plan_launch(batch=1, vocab=151936, rank=256, device=fake_cuda_device,
                           launch_mode="persistent", interpret=False)
    assert 33 < _grid(plan) <= 132
    assert tsh.device_available_sms(CPU) == 1


def test_fallback_plan_runs_and_matches_the_reference():
    """A GPU-planned persistent request that does not fit, run stepwise (interpreted)."""
    kwargs = make_inputs(batch=3, gamma=4, vocab=700, rank=32, seed=41)
    plan = tsh.plan_launch(batch=3, vocab=700, rank=32, device=CPU, launch_mode="persistent",
                           num_splits=4, sm_count=2, interpret=False)
    assert plan.mode == "stepwise" and plan.num_splits == 4
    run = clone_kwargs(kwargs)
    out = tsh.build_launch(validate_inputs(**run, compute_draft_probs=True), plan).run()
    ref = sequential_head_reference(**clone_kwargs(kwargs))
    assert torch.equal(out.tokens, ref.tokens)
    torch.testing.assert_close(out.draft_probs, ref.draft_probs, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(out.confidence, ref.confidence, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.step_logits, ref.step_logits, rtol=1e-5, atol=1e-5)
