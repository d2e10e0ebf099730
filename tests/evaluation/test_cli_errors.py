"""Bad input fails fast (before any engine starts) with exit 2 and a message that
says what to fix."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dspark.evaluate.prompts import PromptSetError, load_prompts

PAIR = Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib"   # committed, valid


def _cli(module, *args, tmp_path):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)   # validation imports SGLang


@pytest.fixture
def fake_pair():
    """A pair that passes every check made before the engine (the committed tiny pair), so
    each test below fails on the one input it breaks."""
    return PAIR / "target", PAIR / "draft"


def test_load_prompts_errors_name_the_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"turns": ["ok"]}\n\n{"turns": ["a"]\n')
    with pytest.raises(PromptSetError, match=r"p.jsonl:3: not valid JSON"):
        load_prompts(f)
    f.write_text('{"turns": ["ok"]}\n{"turns": []}\n')
    with pytest.raises(PromptSetError, match=r":2: invalid prompt record.*turns"):
        load_prompts(f)
    f.write_text('{"turns": ["ok", "  "]}\n')
    with pytest.raises(PromptSetError, match="non-empty"):
        load_prompts(f)
    f.write_text('["just", "a", "list"]\n')
    with pytest.raises(PromptSetError, match="expected a JSON object"):
        load_prompts(f)
    f.write_text("\n")
    with pytest.raises(PromptSetError, match="no prompts"):
        load_prompts(f)
    f.write_text('{"turns": ["a"], "question_id": 7}\n{"turns": ["b", "c"]}\n')
    recs = load_prompts(f)
    assert [r.turns for r in recs] == [["a"], ["b", "c"]]
    assert load_prompts(f, limit=1)[0].turns == ["a"]


def test_evaluate_bad_jsonl_line(tmp_path, fake_pair):
    t, d = fake_pair
    f = tmp_path / "bad.jsonl"
    f.write_text('{"turns": ["fine"]}\n{"turns": "not a list"}\n')
    r = _cli("sglang_dspark.evaluate", "--target", t, "--draft", d, "--prompts", f,
             "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2
    assert "bad.jsonl:2" in r.stderr and "turns" in r.stderr


def test_evaluate_missing_files(tmp_path, fake_pair):
    t, d = fake_pair
    f = tmp_path / "p.jsonl"
    f.write_text('{"turns": ["x"]}\n')
    r = _cli("sglang_dspark.evaluate", "--target", tmp_path / "nope", "--draft", d,
             "--prompts", f, "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "--target" in r.stderr and "not a directory" in r.stderr
    r = _cli("sglang_dspark.evaluate", "--target", t, "--draft", d,
             "--prompts", tmp_path / "missing.jsonl", "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _cli("sglang_dspark.evaluate", "--target", t, "--draft", t, "--prompts", f,
             "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "not a DSpark draft" in r.stderr
    r = _cli("sglang_dspark.evaluate", "--target", t, "--draft", d, "--prompts", f,
             "--sts", tmp_path / "none.json", "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "--sts" in r.stderr
    r = _cli("sglang_dspark.evaluate", "--target", t, "--draft", d, "--prompts", f,
             "--temperature", "-1", "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "temperature" in r.stderr


def test_evaluate_mismatched_pair_exits_2_before_any_engine(tmp_path, fake_pair):
    """A draft whose hidden size does not match the target: exit 2 with the checkpoint
    validator's message, before any engine starts (no traceback)."""
    t, d = fake_pair
    f = tmp_path / "p.jsonl"
    f.write_text('{"turns": ["x"]}\n')
    wide = tmp_path / "wide-target"
    shutil.copytree(t, wide)
    cfg = json.loads((wide / "config.json").read_text())
    assert cfg["hidden_size"] == 128
    (wide / "config.json").write_text(json.dumps(dict(cfg, hidden_size=256)))
    for module in ("sglang_dspark.evaluate", "sglang_dspark.calibrate"):
        r = _cli(module, "--target", wide, "--draft", d, "--prompts", f, "--out", tmp_path / "o",
                 tmp_path=tmp_path)
        assert r.returncode == 2, (module, r.stderr[-2000:])
        assert "hidden_size mismatch: draft 128 vs target 256" in r.stderr, r.stderr[-2000:]
        assert "--draft" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "o" / "capture.jsonl").exists()
    # (a draft with a tensor missing takes the same exit: the validator's refusal, checked
    # through the launch command in tests/integration/test_http_server.py)


def test_calibrate_input_errors(tmp_path, fake_pair):
    t, d = fake_pair
    r = _cli("sglang_dspark.calibrate", "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "--capture" in r.stderr
    r = _cli("sglang_dspark.calibrate", "--capture", tmp_path / "none.jsonl",
             "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr
    f = tmp_path / "one.jsonl"
    f.write_text('{"turns": ["x"]}\n')
    r = _cli("sglang_dspark.calibrate", "--target", t, "--draft", d, "--prompts", f,
             "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "too few" in r.stderr
    r = _cli("sglang_dspark.calibrate", "--target", t, "--draft", d, "--prompts", f,
             "--heldout-frac", "1.5", "--out", tmp_path / "o", tmp_path=tmp_path)
    assert r.returncode == 2 and "--heldout-frac" in r.stderr


def test_calibrate_from_capture_file(tmp_path):
    """Offline mode on a synthetic capture: fit, held-out metrics, SGLang-readable JSON."""
    import numpy as np

    rng = np.random.default_rng(0)
    true_t = [0.5, 2.0, 1.0]
    lines = []
    for step in range(8000):
        z = rng.normal(1.0, 2.0, size=(2, 3))
        ok = rng.random((2, 3)) < 1 / (1 + np.exp(-z / np.array(true_t)))
        acc = [int(np.cumprod(o).sum()) for o in ok]
        lines.append(json.dumps({"step": step, "gamma": 3, "rids": [f"c{step % 50}-p0-t0",
                                                                    f"d{step % 50}-p1-t0"],
                                 "temps": [0.0, 0.0], "conf_raw": z.tolist(), "conf": None,
                                 "accepted": acc, "verified": [3, 3]}))
    cap = tmp_path / "capture.jsonl"
    cap.write_text("\n".join(lines) + "\n")
    r = _cli("sglang_dspark.calibrate", "--capture", cap, "--out", tmp_path / "o",
             "--max-ece", "0.04", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "o" / "calibration.json").read_text())
    assert rep["temperatures"] == pytest.approx(true_t, rel=0.3)
    assert all(m["ece_after"] < m["ece_before"] for m in rep["heldout"] if m["position"] != 3)
    assert (tmp_path / "o" / "reliability.png").stat().st_size > 1000
    from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

    assert load_sts_calibration_from_path(str(tmp_path / "o" / "sts.json")).temperatures == \
        rep["temperatures"]
