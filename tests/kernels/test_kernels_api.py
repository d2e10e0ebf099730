"""The backend switch, argument validation and the benchmark's CPU smoke mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_kernel_testutil import make_inputs
from dspark_testlib import load_benchmark
from dspark_kernels import ENV_VAR, select_backend, sequential_head
from dspark_kernels.triton_seq_head import plan_launch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "value,device,expected",
    [
        (None, "cpu", "torch"),
        ("", "cpu", "torch"),
        ("auto", "cpu", "torch"),
        ("AUTO", "cuda", "upstream"),
        ("auto", "cuda", "upstream"),
        ("triton", "cuda", "triton"),
        ("triton", "cpu", "triton"),  # TRITON_INTERPRET=1 in these tests
        ("torch", "cuda", "torch"),
        (" upstream ", "cpu", "upstream"),
    ],
)
def test_select_backend(monkeypatch, value, device, expected):
    if value is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, value)
    assert select_backend(device=device) == expected


def test_select_backend_rejects_bad_values(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "fast")
    with pytest.raises(ValueError, match="SGLANG_DSPARK_FUSED_SEQ_HEAD"):
        select_backend(device="cpu")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        select_backend(device="cpu")


def _good():
    return make_inputs(batch=2, gamma=3, vocab=40, seed=1)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda k: k.update(base_logits=k["base_logits"][0]), r"\[batch, gamma, vocab\]"),
        (lambda k: k.update(base_logits=torch.zeros(2, 17, 40)), "gamma"),
        (lambda k: k.update(anchor_tokens=k["anchor_tokens"].float()), "anchor_tokens"),
        (lambda k: k.update(w2=k["w2"][:30]), "w2 must be markov_w2.weight"),
        (lambda k: k.update(w2=k["w2"].double()), "share a dtype"),
        (lambda k: k.update(temperatures=None), "temperatures"),
        (lambda k: k.update(offset=None), "offset"),
        (lambda k: k.update(offset=torch.tensor([1.0])), "offset"),
        (lambda k: k.update(seed=-1), "seed"),
        (lambda k: k.update(logits_out=torch.zeros(2, 3, 40, dtype=torch.bfloat16)), "step dtype"),
        (lambda k: k.update(conf_weight=k["conf_weight"][:-1]), "conf_weight must have"),
        (lambda k: k.update(hidden=None), "hidden"),
        (lambda k: k.update(sts_temperatures=torch.ones(2)), "sts_temperatures"),
    ],
)
def test_validation_errors(mutate, message):
    kwargs = _good()
    mutate(kwargs)
    with pytest.raises(ValueError, match=message):
        sequential_head(backend="torch", **kwargs)


def test_unknown_kernel_backend():
    with pytest.raises(ValueError, match="upstream"):
        sequential_head(backend="upstream", **_good())


def test_launch_plan_shapes():
    plan = plan_launch(batch=5, vocab=1000, rank=256, device=torch.device("cpu"), num_splits=3)
    assert plan.num_splits == 3 and plan.tiles_per_split * plan.block_v * 3 >= 1000
    # num_splits is capped by the tile count and never leaves an empty split.
    plan = plan_launch(batch=1, vocab=256, rank=16, device=torch.device("cpu"), num_splits=3, block_v=64)
    assert (plan.num_splits, plan.tiles_per_split) == (2, 2)
    with pytest.raises(ValueError, match="block_m"):
        plan_launch(batch=1, vocab=64, rank=16, device=torch.device("cpu"), block_m=8)
    with pytest.raises(ValueError, match="launch_mode"):
        plan_launch(batch=1, vocab=64, rank=16, device=torch.device("cpu"), launch_mode="fast")


def test_gpu_bench_script_cpu_smoke(tmp_path):
    """benchmarks/run_gpu_bench.sh --cpu-smoke: the GPU machine's four steps (checks, kernel
    timing, the policy's host cost, one summary table) on CPU in tiny sizes."""
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    env.pop("TRITON_INTERPRET", None)  # the script sets it for --cpu-smoke
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "run_gpu_bench.sh"), "--cpu-smoke"],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for name in ("check.json", "bench.json", "policy.json", "summary.txt"):
        assert (tmp_path / name).exists(), name
    assert "perstep/f" in out and "RESULT: PASS" in out
    summary = (tmp_path / "summary.txt").read_text()
    assert "SUMMARY: PASS" in summary
    for row in ("graph ", "capture ", "tokens ", "kernel ms ", "policy us "):
        assert row in summary, row
    assert all(f"R={r} " in summary for r in (1, 4, 16, "mixed"))
    policy = json.loads((tmp_path / "policy.json").read_text())
    assert policy["backend"] == "planner" and all(r["steps"] == 20 for r in policy["rows"])


def _host_bench():
    return load_benchmark("gpu_bench_host")


def test_gpu_bench_summary_fails_on_a_failed_or_missing_part(tmp_path, capsys):
    host = _host_bench()
    good = tmp_path / "check.json"
    good.write_text(json.dumps({"kind": "check", "graph_check": {"available_sms": 132, "triton-auto-greedy": "PASS"},
                                "capture_check": {"result": "PASS", "observe_ms": 0.1,
                                                  "returned_while_device_busy": True}, "configs": []}))
    assert host.main(["summary", str(good)]) == 0
    assert "SUMMARY: PASS" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "check", "graph_check": {"torch-auto-sample": "FAIL (RuntimeError: x)"}}))
    assert host.main(["summary", str(good), str(bad)]) == 1
    assert host.main(["summary", str(good), str(tmp_path / "timed_out.json")]) == 1
    out = capsys.readouterr().out
    assert "torch-auto-sample" in out and "no result file" in out


def test_empty_batch():
    kwargs = make_inputs(batch=1, gamma=3, vocab=40, seed=2)
    for name in ("base_logits", "anchor_tokens", "temperatures", "hidden", "logits_out"):
        kwargs[name] = kwargs[name][:0]
    out = sequential_head(backend="triton", **kwargs)
    assert out.tokens.shape == (0, 3) and out.confidence.shape == (0, 3)
