"""``benchmarks/upstream_table.py``'s failure message: when SGLang's profiler says a round
never stabilized, it names the round and the two ways out, and the fact it rests on (SGLang's
step recorder keeps no step longer than 1 s) is read from the pinned SGLang itself."""

import inspect

import pytest
from dspark_testlib import load_benchmark


@pytest.fixture(scope="module")
def ut():
    return load_benchmark("upstream_table")


def test_the_hint_rests_on_sglangs_one_second_step_limit():
    from sglang.srt.speculative.dspark_components import dspark_observability

    assert dspark_observability.INFO_DUMP_MAX_STEP_CPU_SECONDS == 1.0


def test_a_round_that_never_stabilized_names_the_round_and_the_way_out(ut):
    from sglang.benchmark import dspark_sps_profiler

    # the profiler's own message, as it raises it (its format string, filled in)
    src = inspect.getsource(dspark_sps_profiler.postprocess_round)
    assert "never stabilized" in src and "Round bs=" in src
    log = ("RuntimeError: Round bs=24 never stabilized: only 7 of 7 common decode steps had "
           "every rank at the target 24 requests (need at least 40).")
    hint = ut.failure_hint(log)
    assert "24-request round" in hint and "--max-batch-size 23" in hint and "--round-timeout" in hint
    assert ut.failure_hint("RuntimeError: DP rank count changed mid-profile: 1 -> 2.") == ""


def test_round_timeout_must_be_positive(ut, capsys):
    with pytest.raises(SystemExit) as e:
        ut.main(["--round-timeout", "0"])
    assert e.value.code == 2
    assert "--round-timeout must be > 0 seconds, got 0" in capsys.readouterr().err
