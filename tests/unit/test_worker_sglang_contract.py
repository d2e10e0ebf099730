"""What our worker relies on from SGLang 0.5.23, checked against SGLang's own objects.

* ``_forward_decode`` keeps SGLang's parameters and forwards every one (SGLang passes
  ``coordination_plan=`` under DP-attention prefill coordination); so do the no-draft
  step's stand-ins for the verify executor's ``_run_ragged`` and ``commit_hidden``.
* The engine id's ranks are the ones SGLang publishes to the scheduler process (the DP
  replica index), not attributes the worker does not have.
* Budgets that say what every request verifies get layouts whose lengths are on the host
  (no device read before the verify), on SGLang's real ``DSparkVerifyPlanner`` and
  ``RaggedVerifyLayout``; SGLang's simulated-acceptance guard holds after our flip.

The planner checks run in a child process (``python THIS_FILE``): they publish SGLang's
process-wide configuration, which must not leak into other tests.  The child stands in
for a GPU model runner with captured ragged verify graphs (``decode_cuda_graph_runner``
with ``capture_num_tokens``), the one input a CPU machine cannot build: with it SGLang's
``schedule_layout`` takes its device path (``from_verify_lens_device``, no host lengths),
as it does on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "tiny-stdlib" / "target"


# ---------------------------------------------------------------- _forward_decode
def _sglang_worker():
    from sglang_dspark.worker import DSparkControlledWorker

    return DSparkControlledWorker, DSparkControlledWorker.__mro__[1]


def test_forward_decode_takes_sglangs_parameters():
    import inspect

    from sglang_dspark import seams

    ours, base = _sglang_worker()
    assert base.__module__.endswith("dspark_worker_v2") and base.__name__ == "DSparkWorkerV2"
    theirs = inspect.signature(base._forward_decode).parameters
    mine = inspect.signature(ours._forward_decode).parameters
    assert list(theirs) == ["self", "batch", "on_publish", "grammar_barrier", "coordination_plan"]
    assert [(p.name, p.kind, p.default) for p in mine.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.values()]
    seams.check_override_signatures()      # what install() runs at start-up
    names = {s.target.rsplit(".", 1)[-1] for s in seams.all_seams()}
    assert "_forward_decode" in names


def test_signature_check_refuses_an_override_that_drops_a_parameter():
    from sglang_dspark import seams

    _, base = _sglang_worker()

    class Old(base):       # the override before issue 23: no coordination_plan
        def _forward_decode(self, batch, on_publish, grammar_barrier):
            raise AssertionError

    with pytest.raises(seams.SeamError, match=r"coordination_plan.*sglang==0\.5\.23"):
        seams.check_override_signatures([(Old, "_forward_decode")])


def test_no_draft_stand_ins_take_sglangs_parameters(monkeypatch):
    # DecodeForward / AnchorCommit are installed on SGLang's verify executor in place of
    # _run_ragged / commit_hidden for a no-draft step; SGLang calls them by keyword
    import inspect

    from sglang_dspark import no_draft, seams
    from sglang.srt.speculative.dspark_components.dspark_verify import TargetVerifyExecutor

    for ours, theirs in ((no_draft.DecodeForward, "_run_ragged"), (no_draft.AnchorCommit, "commit_hidden")):
        a = inspect.signature(ours.__call__).parameters
        b = inspect.signature(getattr(TargetVerifyExecutor, theirs)).parameters
        assert list(a) == list(b) and all(p.kind == p.KEYWORD_ONLY for p in list(b.values())[1:])

    def changed(self, *, batch, layout, ragged_window, sampling_info):     # kv_loc_plan dropped
        raise AssertionError

    monkeypatch.setattr(no_draft.DecodeForward, "__call__", changed)
    with pytest.raises(seams.SeamError, match=r"stands in for .*_run_ragged.*sglang==0\.5\.23"):
        seams.check_override_signatures()


def test_anchor_slots_mapped_reads_each_requests_next_position():
    import torch

    from sglang_dspark.no_draft import anchor_slots_mapped

    req_to_token = torch.zeros((4, 16), dtype=torch.int32)
    req_to_token[2, 5], req_to_token[0, 9] = 77, 31
    rows, lens = torch.tensor([2, 0]), torch.tensor([5, 9])
    assert anchor_slots_mapped(req_to_token, rows, lens, torch.tensor([77, 31], dtype=torch.int64))
    assert not anchor_slots_mapped(req_to_token, rows, lens, torch.tensor([77, 30], dtype=torch.int64))


def test_decode_forward_route_only_for_eager_cpu_targets():
    from sglang_dspark.no_draft import DecodeForward

    def executor(device, graphs):
        return SimpleNamespace(target_worker=SimpleNamespace(model_runner=SimpleNamespace(
            device=device, decode_cuda_graph_runner=object() if graphs else None)))

    route, why = DecodeForward.for_executor(executor("cpu", False))
    assert isinstance(route, DecodeForward) and why == ""
    route, why = DecodeForward.for_executor(executor("cuda", True))
    assert route is None and "graphs captured for the verify" in why
    route, why = DecodeForward.for_executor(executor("cuda", False))     # --disable-cuda-graph
    assert route is None and "verified on CPU only" in why


def test_forward_decode_forwards_every_argument(monkeypatch):
    ours, base = _sglang_worker()
    calls = []

    def sglang_step(self, batch, on_publish, grammar_barrier=None, coordination_plan=None):
        calls.append((batch, on_publish, grammar_barrier, coordination_plan))
        return "result"

    monkeypatch.setattr(base, "_forward_decode", sglang_step)
    w = object.__new__(ours)
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False))
    plan = object()
    w.__dict__.update(_dspark_ready=False)
    assert w._forward_decode(batch, "pub", "barrier", coordination_plan=plan) == "result"
    assert w._forward_decode(batch, "pub") == "result"
    seen = []
    w.__dict__.update(_dspark_ready=True, _clock=SimpleNamespace(start=lambda: None, gap_s=None), _gap_prev=None,
                      _telemetry_time_s=0.0, _telemetry_calls=0, _online_planner=None,
                      _null_proposer=None,
                      _after_step=lambda b, r, drafted: seen.append((b, r, drafted)))
    assert w._forward_decode(batch, "pub", "barrier", plan) == "result"
    assert calls == [(batch, "pub", "barrier", plan), (batch, "pub", None, None),
                     (batch, "pub", "barrier", plan)]
    assert seen == [(batch, "result", True)] and w._telemetry_calls == 1


def test_forward_batch_generation_flushes_before_a_non_decode_non_extend_forward_and_forwards_every_argument(
        monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    ours, base = _sglang_worker()
    calls, flushes = [], []

    def sglang_forward(self, batch, on_publish=None, grammar_barrier=None, *, pp_proxy_tensors=None):
        calls.append((batch.name, on_publish, grammar_barrier, pp_proxy_tensors, len(flushes)))
        return "result"

    monkeypatch.setattr(base, "forward_batch_generation", sglang_forward)
    w = object.__new__(ours)
    w.__dict__.update(_anchor_commit=SimpleNamespace(flush=lambda: flushes.append(1)))

    def batch(name, mode):
        return SimpleNamespace(name=name, forward_mode=mode, is_extend_in_batch=False)

    last_step = (1, False, 0.012)      # (R, drafted, seconds) of the last timed decode step
    w._gap_prev = last_step
    assert w.forward_batch_generation(batch("decode", ForwardMode.DECODE), "pub", "gb",
                                      pp_proxy_tensors="pp") == "result"
    assert w._gap_prev == last_step    # a decode step's gap is timed in _forward_decode
    w.forward_batch_generation(batch("prefill", ForwardMode.EXTEND), "pub")
    # the gap after the last decode step now holds a prefill: no gap sample (on the bench
    # pair a 42 ms one stood for a 1-request no-draft step's host work, its only sample)
    assert w._gap_prev is None
    w._gap_prev = last_step
    w.forward_batch_generation(batch("idle", ForwardMode.IDLE))
    assert w._gap_prev is None
    # a decode batch decides in _forward_decode (a no-draft step keeps the rows pending); a
    # prefill queues its rows behind them (AnchorCommit.prefill); anything else lands them
    assert calls == [("decode", "pub", "gb", "pp", 0), ("prefill", "pub", None, None, 0),
                     ("idle", None, None, None, 1)]


# ---------------------------------------------------------------- child-process checks
@pytest.fixture(scope="module")
def probe():
    env = dict(os.environ, SGLANG_RAGGED_VERIFY_MODE="compact", PYTHONUNBUFFERED="1")
    for k in ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_DSPARK_ONLINE", "TRITON_INTERPRET"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, __file__], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-6000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_engine_ranks_are_sglangs_published_replica_index(probe):
    # the scheduler of replica 1 of --dp-size 2 (SGLang's SpawnRanks(dp_rank=1))
    assert probe["ranks_replica1"] == [0, 1]
    # no data-parallel controller: SGLang publishes dp_rank None -> 0
    assert probe["ranks_no_dp"] == [0, 0]
    # the worker itself has no such attribute (the old lookup always said dp0)
    assert probe["worker_has_dp_rank"] is False


def test_sglangs_verify_all_layout_has_host_lengths_and_our_flip_loses_them(probe):
    # what upstream does without a table: the cached uniform layout, lengths on the host
    assert probe["upstream_verify_all"] is True
    assert probe["upstream_full"] == {"host": [5, 5, 5], "total": 15}
    # our flip alone: the same full budget now takes SGLang's device path (a read per step)
    assert probe["flipped_full_host"] is None


def test_host_length_layouts(probe):
    h = probe["host"]
    # full budget: SGLang's own verify-all layout (same lengths, graph size, indptr), cached
    assert h["full"]["host"] == [5, 5, 5] and h["full_equals_sglang_uniform"] and h["full_cached"]
    # zero budget: SGLang's layout, host lengths = the device lengths SGLang computed
    assert h["zero"]["host"] == [1, 1, 1] and h["zero"]["device"] == [1, 1, 1]
    assert h["zero"]["graph_num_tokens"] == h["zero_inner_graph_num_tokens"]
    # a ragged budget: SGLang's layout unchanged (which requests get the tokens is the
    # live top-K on the device)
    assert h["ragged"]["host"] is None and sum(h["ragged"]["device"]) == 3 + 5
    # a DP-gathered verify tier keeps SGLang's layout even at a full budget
    assert h["full_dp_tier"]["host"] is None
    # SGLang raising a zero budget to fill the graph tier: not attached
    assert h["zero_aligned"]["host"] is None
    assert h["summary"] == {"uniform_steps": 2, "floor_steps": 1, "device_length_steps": 2}


def test_simulated_acceptance_guard_is_applied_after_the_flip(probe):
    g = probe["guard"]
    assert g["verify_all_2.0"] is None and g["flipped_1.0"] is None and g["flipped_0"] is None
    msg = g["flipped_2.0"]
    assert msg and "SGLANG_SIMULATE_ACC_LEN=2.0" in msg and "SGLANG_DSPARK_ONLINE=0" in msg


def _layout(l):
    if l is None:
        return None
    return {"host": l.verify_lens_cpu, "total": l.total_verify_tokens,
            "device": [int(x) for x in l.verify_lens.tolist()], "graph_num_tokens": int(l.graph_num_tokens)}


def _probe() -> dict:
    import torch
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkVerifyPlanner
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    from sglang_dspark.budget import HostLengthLayouts
    from sglang_dspark.link import engine_ranks
    from sglang_dspark.worker import _refuse_simulated_acceptance

    out = {}
    sa = ServerArgs(model_path=str(TARGET), device="cpu")
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    out["ranks_no_dp"] = list(engine_ranks())
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=1))
    out["ranks_replica1"] = list(engine_ranks())
    assert get_parallel().dp_rank == 1
    out["worker_has_dp_rank"] = any("dp_rank" in vars(c) for c in DSparkWorkerV2.__mro__)

    # a model runner with captured ragged verify graphs (what a GPU run has)
    runner = SimpleNamespace(ragged_verify_mode=True, capture_num_tokens=[4, 8, 12, 16, 24, 32, 40],
                             max_bs=8)
    model_runner = SimpleNamespace(decode_cuda_graph_runner=runner)

    def planner():
        return DSparkVerifyPlanner(draft_model=SimpleNamespace(confidence_head=object()), gamma=4,
                                   model_runner=model_runner, device=torch.device("cpu"), tp_rank=0,
                                   verify_num_draft_tokens=5,
                                   tp_sync=SpecTpSync(SimpleNamespace(world_size=1)))

    rows = torch.arange(3)
    conf = torch.tensor([[0.9, 0.8, 0.7, 0.6], [0.5, 0.4, 0.3, 0.2], [0.99, 0.9, 0.1, 0.1]])

    def kw(budget, **extra):
        return dict(req_pool_indices=rows, prefix_lens=torch.tensor([7, 9, 11]), device=torch.device("cpu"),
                    confidence=conf, budget=budget, **extra)

    p = planner()
    out["upstream_verify_all"] = bool(p.is_verify_all)
    up = p.schedule_layout(**kw(12))
    out["upstream_full"] = {"host": up.verify_lens_cpu, "total": up.total_verify_tokens}
    p._is_verify_all = False                       # what the worker does in compact mode
    out["flipped_full_host"] = p.schedule_layout(**kw(12)).verify_lens_cpu

    inner_zero = p.schedule_layout(**kw(0))
    host = HostLengthLayouts(p)
    p.schedule_layout = host
    full = host(**kw(12))
    h = {"full": _layout(full), "full_cached": host(**kw(12)) is full}
    h["full_equals_sglang_uniform"] = (full.graph_num_tokens == up.graph_num_tokens
                                       and torch.equal(full.verify_lens, up.verify_lens)
                                       and torch.equal(full.qo_indptr_device, up.qo_indptr_device))
    h["zero"] = _layout(host(**kw(0)))
    h["zero_inner_graph_num_tokens"] = int(inner_zero.graph_num_tokens)
    h["ragged"] = _layout(host(**kw(5)))
    h["full_dp_tier"] = _layout(host(**kw(12, global_num_reqs=3, dp_tier_num_tokens=15)))
    p2 = planner()
    p2._is_verify_all = False
    p2._align_verify_tokens_to_graph_tier = True
    h["zero_aligned"] = _layout(HostLengthLayouts(p2)(**kw(0)))
    h["summary"] = host.summary()
    out["host"] = h

    def guard(acc, pl):
        try:
            _refuse_simulated_acceptance(acc, pl)
        except ValueError as e:
            return str(e)
        return None

    out["guard"] = {"verify_all_2.0": guard(2.0, planner()), "flipped_2.0": guard(2.0, p),
                    "flipped_1.0": guard(1.0, p), "flipped_0": guard(0.0, p)}
    return out


if __name__ == "__main__":
    print(json.dumps(_probe()))



def test_deterministic_inference_is_told_that_drafted_steps_ignore_seeds():
    from sglang.srt.server_args import ServerArgs

    from sglang_dspark.worker import unseeded_sampling_warning

    assert hasattr(ServerArgs, "enable_deterministic_inference")
    assert unseeded_sampling_warning(SimpleNamespace(enable_deterministic_inference=False)) == ""
    said = unseeded_sampling_warning(SimpleNamespace(enable_deterministic_inference=True))
    assert "sampling_seed" in said and "not reproducible" in said
