"""The serving benchmark's realised-budget column (``benchmarks/worker_bench.py``):
verified tokens per request from SGLang's meta_info when a server mixes ragged steps
(which report a cap length) with uniform full-budget steps (which do not)."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "worker_bench.py"


@pytest.fixture(scope="module")
def wb():
    spec = importlib.util.spec_from_file_location("worker_bench_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_uniform_rounds_count_as_full_budget(wb):
    # 10 rounds: ragged caps 2, 3, 3, 5 (histogram index = cap length incl. the anchor)
    # and 6 uniform rounds, which verify all 4 drafts + the anchor
    mi = {"spec_verify_ct": 10, "spec_cap_lens_histogram": [0, 0, 1, 2, 0, 1],
          "spec_cap_length": (2 + 3 + 3 + 5) / 10}
    assert wb.cap_tokens(mi, gamma=4) == 13 + 6 * 5
    # SGLang's own average alone under-counts this request (1.3 tokens per round, which
    # is below one verified draft per round)
    assert mi["spec_cap_length"] * 10 < 13 + 6 * 5


def test_all_ragged_matches_sglangs_cap_length(wb):
    mi = {"spec_verify_ct": 3, "spec_cap_lens_histogram": [0, 0, 1, 1, 1],
          "spec_cap_length": 3.0}
    assert wb.cap_tokens(mi, gamma=4) == pytest.approx(9.0)


def test_no_caps_depends_on_the_server_layout(wb):
    mi = {"spec_verify_ct": 7}
    assert wb.cap_tokens(mi, compact=True, gamma=4) == 35        # every round uniform
    assert wb.cap_tokens(mi, compact=False, gamma=4) is None      # static: not reported
    assert wb.cap_tokens({}, compact=True, gamma=4) is None       # no speculation


def test_run_level_reports_realised_drafts_per_round(wb, monkeypatch):
    metas = [{"completion_tokens": 8, "spec_verify_ct": 4,
              "spec_cap_lens_histogram": [0, 0, 2], "spec_cap_length": 1.0},
             {"completion_tokens": 8, "spec_verify_ct": 4}]
    it = iter(metas)
    monkeypatch.setattr(wb, "http_json", lambda *a, **k: {"meta_info": next(it)})
    out = wb.run_level("http://unused", 1, 2, 8, compact=True)
    # request 1: 2 ragged rounds of cap 2 + 2 uniform rounds of cap gamma + 1
    g = wb.BENCH_SPEC.block_size
    assert out["verified_per_round"] == pytest.approx((4 + 2 * (g + 1) + 4 * (g + 1)) / 8 - 1)
    assert out["accept_len"] == pytest.approx(16 / 8)
