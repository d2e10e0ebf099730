"""The serving benchmark's realised-budget column (``benchmarks/worker_bench.py``):
verified tokens per request from SGLang's meta_info when a server mixes ragged steps
(which report a cap length) with uniform full-budget steps (which do not)."""

import pytest
from dspark_testlib import load_benchmark


@pytest.fixture(scope="module")
def wb():
    return load_benchmark("worker_bench")


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


def _res(**per_round):
    """results[name][lv] as merge() makes them, from per-round tok/s (equal chunk sizes);
    keyword names spell "~" as "__", "@" as "_at_" and "." as "_"."""
    out = {}
    for name, rounds in per_round.items():
        name = name.replace("__", "~").replace("_at_", "@").replace("0_5", "0.5")
        out[name] = {
            4: {"tok_s": len(rounds) / sum(1.0 / x for x in rounds), "per_round_tok_s": list(rounds)}}
    return out


def test_visit_plan_pins_the_sweep_and_references(wb):
    assert wb.visit_plan("nospec", [1.0, 0.5], True) == [("nospec", None)]
    assert wb.visit_plan("verify_all", [1.0, 0.5], True) == [("verify_all", None)]
    # the online server's fixed@0.5 doubles as its reference chunk
    assert wb.visit_plan("online", [1.0, 0.5], True) == [("online", None), ("fixed@1", 1.0), ("fixed@0.5", 0.5)]
    assert wb.visit_plan("online", [1.0, 0.25], True)[-1] == ("online~ref", wb.REF_FRAC)
    assert wb.visit_plan("upstream", [1.0], True) == [("upstream", None), ("upstream~ref", wb.REF_FRAC)]
    assert [wb.server_of(c) for c in ("fixed@0.75", "controller~ref", "upstream")] == \
        ["online", "controller", "upstream"]


def test_compare_removes_a_per_server_offset(wb):
    # the upstream server runs everything 10% slower than the online server; on equal work
    # (the reference chunks) that shows, and the normalized ratio removes it
    res = _res(online=[110.0, 90.0, 100.0], fixed_at_0_5=[100.0, 80.0, 95.0],
               upstream=[99.0, 81.0, 90.0], upstream__ref=[90.0, 72.0, 85.5], fixed_at_1=[105.0, 85.0, 98.0])
    c = wb.compare(res, "online", "upstream", 4)
    assert c["how"] == "normalized"
    assert c["per_round"] == pytest.approx([1.0, 1.0, 1.0])
    assert c["ratio"] == pytest.approx(1.0)
    assert wb.compare(res, "online", "upstream", 4)["rounds"]["se"] == pytest.approx(0.0, abs=1e-12)
    # the fixed sweep ran on the online server: a plain paired ratio
    s = wb.compare(res, "online", "fixed@1", 4)
    assert s["how"] == "same server"
    assert s["per_round"] == pytest.approx([110 / 105, 90 / 85, 100 / 98])
    # a server with no reference chunk (no speculation, the static server) stays raw
    res.update(_res(verify_all=[50.0, 50.0, 50.0]))
    r = wb.compare(res, "online", "verify_all", 4)
    assert r["how"] == "raw" and r["per_round"] == pytest.approx([2.2, 1.8, 2.0])


def test_reference_speed_discounts_the_references_accept_length(wb):
    # same pinned K on both servers, but the reference's admissions happened to accept more
    # in round 2 on the upstream server: its rounds per second are what measure the server
    res = _res(online=[100.0, 100.0], fixed_at_0_5=[90.0, 90.0], upstream=[90.0, 90.0], upstream__ref=[81.0, 91.125])
    res["fixed@0.5"][4]["per_round_accept_len"] = [2.0, 2.0]
    res["upstream~ref"][4]["per_round_accept_len"] = [2.0, 2.25]
    c = wb.compare(res, "online", "upstream", 4)
    assert c["per_round"] == pytest.approx([100 / 45 / (90 / 40.5)] * 2)
    assert c["ratio"] == pytest.approx(100 / 45 / (90 / 40.5))


def test_summary_targets_use_the_fair_ratios(wb):
    res = _res(online=[100.0, 100.0], fixed_at_1=[98.0, 98.0], fixed_at_0_5=[101.0, 101.0],
               upstream=[85.0, 85.0], upstream__ref=[85.0, 85.0], verify_all=[120.0, 120.0])
    s = wb.summarize(res, {}, [4])
    row = s["targets"]["online"][4]
    assert s["verify_all_chunk"] == "fixed@1" and s["best_fixed"][4]["config"] == "fixed@0.5"
    # the static server reads 1.2x faster (an offset), but verify-all is judged on the sweep
    assert row["vs_verify_all"]["ratio"] == pytest.approx(100 / 98)
    assert row["vs_verify_all_server"]["how"] == "raw"
    # upstream is 15% slower raw, but exactly as fast as online once each is normalized
    assert row["vs_upstream"]["ratio"] == pytest.approx((100 / 101) / (85 / 85))
    assert row["vs_best_fixed"]["ratio"] == pytest.approx(100 / 101)
    assert not row["ok"]      # below upstream once normalized
    assert s["server_offsets"][4]["upstream"] == pytest.approx(85 / 101)


def test_cpu_seconds_ratio_and_the_no_draft_cost_line(wb):
    def run(tok_s, cpu_s, tokens=256):
        return {"tokens": tokens, "wall_s": tokens / tok_s, "tok_s": tok_s, "tok_s_per_user": tok_s,
                "requests": 4, "cpu_s": cpu_s}

    # no-draft steps: 10% slower in wall time, but the plain server lost CPU to other tenants
    res = {"nospec": {1: wb.merge([run(100.0, 5.0), run(100.0, 5.2)])},
           "online_off": {1: wb.merge([run(90.0, 5.0), run(90.0, 5.2)])}}
    assert res["nospec"][1]["tok_per_cpu_s"] == pytest.approx(512 / 10.2)
    c = wb.compare_cpu(res, "online_off", "nospec", 1)
    assert c["ratio"] == pytest.approx(1.0) and c["per_round"] == pytest.approx([1.0, 1.0])
    s = wb.summarize(res, {}, [1])
    line = s["no_draft_vs_plain"][1]
    assert line["ratio"] == pytest.approx(0.9) and line["ok"] is False      # 1.11x > 1.10x
    assert line["cpu_seconds"]["ratio"] == pytest.approx(1.0)
    # a chunk without CPU seconds (an unreadable /proc) drops the CPU column, not the run
    res["nospec"][1] = wb.merge([run(100.0, None), run(100.0, 5.0)])
    assert "tok_per_cpu_s" not in res["nospec"][1] and wb.compare_cpu(res, "online_off", "nospec", 1) is None


def test_no_draft_share_and_transitions_from_chunk_counters(wb):
    # a chunk's counters are the difference of the server's gate counters around it
    before = {"nd:drafted": 10, "nd:no_draft": 4, "nd:switch_off": 1}
    after = {"nd:drafted": 16, "nd:no_draft": 22, "nd:redraft": 2, "nd:switch_off": 3, "nd:switch_on": 2}
    from collections import Counter
    chunk = dict(Counter(after) - Counter(before))
    c = wb.no_draft_share(chunk)
    assert c == {"share": 18 / 26, "steps": 26, "switches_off": 2, "switches_on": 2}
    assert wb.no_draft_share({"local": 5}) is None      # a server without the gate


@pytest.mark.parametrize("levels", ["0,4", "1,x", ""])
def test_levels_are_checked_before_anything_starts(wb, levels):
    with pytest.raises(SystemExit, match="--levels"):
        wb.main(["--levels", levels])
