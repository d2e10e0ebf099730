"""AnchorCommit's batching rule (sglang_dspark.no_draft): the no-draft steps' anchor rows
are written in one call, each slot's latest row wins, and a full buffer is written at once.
The engine tests (tests/integration/test_no_draft_engine.py) check the drafts that follow."""

from types import SimpleNamespace

import pytest
import torch

from sglang_dspark.no_draft import AnchorCommit, _latest


class Injector:
    """Records SGLang's ``inject_target_hidden`` calls; ``ids_for`` is the identity map."""
    swa_ring_size = None

    def __init__(self):
        self.calls = []
        self.draft_model_runner = SimpleNamespace(token_to_kv_pool=object())

    def ids_for(self, plan):
        return plan

    def inject_target_hidden(self, *, target_hidden, cache_loc, positions):
        self.calls.append((target_hidden.clone(), cache_loc.clone(), positions.clone()))


def _step(commit, slots, positions, stride=3, width=2):
    bs = len(slots)
    loc = torch.tensor([[s] + [-1] * (stride - 1) for s in slots])
    pos = torch.tensor([[p + i for i in range(stride)] for p in positions])
    hidden = torch.arange(bs * stride * width, dtype=torch.float32).view(bs * stride, width) + 100 * pos.view(-1, 1)
    window = SimpleNamespace(verify_cache_loc_2d=loc, kv_loc_plan=loc.view(-1), positions_2d=pos)
    commit(batch=None, layout=None, hidden_strided=hidden, verify_window=window, logits_output=None,
           commit_lens=None, bs=bs, run_compact=True)
    return hidden.view(bs, stride, width)[:, 0]


def test_rows_wait_for_flush_and_are_written_in_one_call():
    inj = Injector()
    commit = AnchorCommit(SimpleNamespace(commit_hidden=None), inj)
    h1 = _step(commit, [5, 9], [10, 20])
    h2 = _step(commit, [6, 10], [11, 21])
    assert inj.calls == [] and commit.pending_rows == 4 and commit.steps == 2
    commit.flush()
    (hidden, loc, pos), = inj.calls
    assert loc.tolist() == [5, 9, 6, 10] and pos.tolist() == [10, 20, 11, 21]
    assert torch.equal(hidden, torch.cat([h1, h2]))
    commit.flush()                       # nothing pending: no call
    assert len(inj.calls) == 1 and commit.flushes == 1 and commit.pending_rows == 0


def test_a_slot_reused_between_steps_keeps_its_latest_row():
    # slot 7 freed after the first step (its request finished) and handed to another request
    inj = Injector()
    commit = AnchorCommit(SimpleNamespace(commit_hidden=None), inj)
    _step(commit, [7, 8], [30, 40])
    h2 = _step(commit, [9, 7], [41, 2])
    commit.flush()
    (hidden, loc, pos), = inj.calls
    assert loc.tolist() == [8, 9, 7] and pos.tolist() == [40, 41, 2]
    assert torch.equal(hidden[1:], h2)


def test_a_full_buffer_is_written_at_once():
    inj = Injector()
    commit = AnchorCommit(SimpleNamespace(commit_hidden=None), inj, max_rows=4)
    _step(commit, [1, 2], [5, 5])
    assert inj.calls == []
    _step(commit, [3, 4], [6, 6])
    assert len(inj.calls) == 1 and commit.pending_rows == 0
    with pytest.raises(ValueError, match="max_rows=0"):
        AnchorCommit(SimpleNamespace(commit_hidden=None), inj, max_rows=0)


def test_latest_occurrence_per_slot():
    assert _latest(torch.tensor([3, 1, 2])) is None
    assert _latest(torch.tensor([3, 1, 3, 2, 1])).tolist() == [2, 3, 4]


class PrefillInjector(Injector):
    """Also records SGLang's direct prefill write (the class method AnchorCommit wraps)."""

    def inject_prefill(self, placement, *, target_hidden, token_indices, target_hidden_is_projected):
        self.calls.append(("prefill", placement.cache_loc.clone()))


def _placement(slots, positions, **kw):
    from sglang.srt.speculative.dspark_components.dspark_kv_inject import PrefillPlacement

    fields = {"state_slot": None, "final_pos": None, "swa_loc": None, **kw}
    return PrefillPlacement(torch.tensor(slots), torch.tensor(positions, dtype=torch.int32), **fields)


def _prefill(inj, placement, n, projected=False, token_indices=None):
    hidden = torch.arange(n * 2, dtype=torch.float32).view(n, 2) + 1000
    inj.inject_prefill(placement, target_hidden=hidden, token_indices=token_indices,
                       target_hidden_is_projected=projected)
    return hidden


def test_a_prefill_queues_its_rows_behind_the_pending_ones_and_the_latest_row_wins():
    inj = PrefillInjector()
    commit = AnchorCommit(SimpleNamespace(commit_hidden=None), inj)
    commit.install_prefill()
    _step(commit, [7, 8], [30, 40])          # an off step; then slot 7's request finished
    h = _prefill(inj, _placement([7, 9, 11], [0, 1, 2]), 3)     # a new request's prompt reuses slot 7
    assert inj.calls == [] and commit.pending_rows == 5 and commit.prefills == 1
    commit.flush()
    (hidden, loc, pos), = inj.calls
    assert loc.tolist() == [8, 7, 9, 11] and pos.tolist() == [40, 0, 1, 2] and pos.dtype == torch.int64
    assert torch.equal(hidden[1:], h)
    # only the selected tokens of a prefill are written (SGLang's token_indices)
    _prefill(inj, _placement([20, 21, 22], [5, 6, 7]), 3, token_indices=torch.tensor([0, 2]))
    commit.flush()
    assert inj.calls[-1][1].tolist() == [20, 22]


@pytest.mark.parametrize("case", ["ring", "swa_rows", "projected", "too_many"])
def test_a_prefill_sglang_must_write_now_lands_the_pending_rows_first(case):
    inj = PrefillInjector()
    commit = AnchorCommit(SimpleNamespace(commit_hidden=None), inj, max_rows=4)
    commit.install_prefill()
    _step(commit, [1, 2], [5, 5])
    kw = {"ring": {"state_slot": torch.tensor([0, 0]), "final_pos": torch.tensor([1, 1])},
          "swa_rows": {"swa_loc": torch.tensor([3, 4])}}.get(case, {})
    n = 3 if case == "too_many" else 2
    _prefill(inj, _placement(list(range(10, 10 + n)), list(range(n)), **kw), n, projected=case == "projected")
    # the anchors first (one write), then SGLang's own write of the prompt
    assert [c[0] if isinstance(c[0], str) else "pending" for c in inj.calls] == ["pending", "prefill"]
    assert inj.calls[0][1].tolist() == [1, 2] and commit.pending_rows == 0 and commit.prefills == 0
