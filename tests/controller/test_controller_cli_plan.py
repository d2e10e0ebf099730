"""``dspark-controller plan``: exact answers, input forms, clear errors (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsc_helpers import fingerprint, run_cli
from dspark_controller.cli import main
from dspark_controller.core.profile_file import ErrorMetrics, ProfileFile, SpsModelState, make_provenance, save_profile
from dspark_controller.sim.synthetic import CURVES, synth_step
from dspark_controller.core.sps_model import SpsModel

APPENDIX = ["[[0.8]]", "--sps", "1:1.0,2:0.5,3:0.45"]


def test_appendix_a_json_in_a_real_process():
    r = run_cli("plan", *APPENDIX, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["lengths"] == [0]
    assert out["expected_tau"] == pytest.approx(1.0) and out["predicted_throughput"] == pytest.approx(1.0)
    assert any("STOP" in line for line in out["explanation"])


def test_human_output_explains_why(capsys):
    assert main(["plan", *APPENDIX]) == 0
    out = capsys.readouterr().out
    assert "lengths: [0]" in out and "early stop" in out and "Theta=0.9000 <= best 1.0000" in out


def test_confidences_from_file_and_stdin(tmp_path, capsys):
    f = tmp_path / "c.json"
    f.write_text("[[0.9, 0.8], [0.5]]")
    assert main(["plan", str(f), "--sps", "1:10,2:10,3:10,4:10,5:10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == [2, 1]          # flat SPS: verify everything
    r = run_cli("plan", "-", "--sps", "1:1.0,2:0.5,3:0.45", "--json", stdin="[[0.8]]")
    assert r.returncode == 0 and json.loads(r.stdout)["lengths"] == [0]


def test_lagged_and_policies(capsys):
    conf = "[[0.95, 0.9, 0.85], [0.3, 0.2, 0.1]]"
    sps = "1:1.0,2:0.99,3:0.98,4:0.7,5:0.69,6:0.68,7:0.5,8:0.5"
    assert main(["plan", conf, "--sps", sps, "--algorithm", "lagged", "--json"]) == 0
    lag = json.loads(capsys.readouterr().out)
    assert lag["algorithm"] == "lagged" and len(lag["lengths"]) == 2
    assert main(["plan", conf, "--sps", sps, "--policy", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == [3, 3]
    assert main(["plan", conf, "--sps", sps, "--policy", "fixed", "--frac", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_tokens"] == 3
    assert main(["plan", conf, "--sps", sps, "--policy", "cap", "--max", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget_tokens"] <= 1


def test_plan_with_profile_files(tmp_path, capsys):
    rng = np.random.default_rng(0)
    m = SpsModel()
    for _ in range(800):
        s = synth_step(rng, CURVES["smooth"])
        m.update(s.num_requests, s.verify_tokens, s.step_time_s)
    fp = fingerprint()
    pf = ProfileFile(profile_key=fp.profile_key(), fingerprint=fp, model=SpsModelState(**m.to_state()),
                     heldout_error=ErrorMetrics.from_summary(m.heldout_error()), samples_seen=800,
                     provenance=make_provenance(command="test"))
    path = save_profile(tmp_path / "p.json", pf)
    conf = json.dumps(np.full((8, 7), 0.8).tolist())
    assert main(["plan", conf, "--profile", str(path), "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    sg = tmp_path / "sglang.json"
    sg.write_text(json.dumps(m.to_sglang_cost_table(num_requests=8)))
    assert main(["plan", conf, "--profile", str(sg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == ours["lengths"]
    add = tmp_path / "add.json"
    add.write_text(json.dumps(m.to_sglang_additive_table()))
    assert main(["plan", conf, "--profile", str(add), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == ours["lengths"]


@pytest.mark.parametrize("args,needle", [
    (["not json", "--sps", "1:1"], "neither JSON"),
    (["[[1.5]]", "--sps", "1:1"], "not a probability"),
    (["[0.5]", "--sps", "1:1"], "wrap each"),
    (["[[0.5]]"], "exactly one of"),
    (["[[0.5]]", "--sps", "1-1"], "B:steps_per_sec"),
    (["[[0.5]]", "--sps", "1:0"], "positive"),
    (["[[0.5]]", "--sps", "1:1", "--policy", "sla"], "floor"),
    (["[[0.5]]", "--sps", "1:1", "--frac", "0.5"], "only applies to policy 'fixed'"),
    (["[[0.5]]", "--sps", "1:1", "--budget", "2"], "only apply to --algorithm lagged"),
    (["[[0.5]]", "--profile", "/nonexistent/p.json"], "cannot read profile"),
])
def test_bad_input_exits_2_with_a_clear_message(args, needle, capsys):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and needle in err, err


def test_bad_input_exit_code_in_a_real_process():
    r = run_cli("plan", "[[0.5, 7]]", "--sps", "1:1")
    assert r.returncode == 2 and "not a probability" in r.stderr
