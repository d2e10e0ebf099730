"""Short real training runs: the loss falls, checkpoints have the SGLang layout."""

import json
import subprocess
import sys

import pytest
from safetensors import safe_open

from sglang_dspark.checkpoint import DraftCheckpointError, validate_draft


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize("mode", ["dspark", "dflash"])
def test_loss_decreases(trained_drafts, mode):
    h = trained_drafts[f"{mode}_history"]
    first, last = _mean([r["loss"] for r in h[:8]]), _mean([r["loss"] for r in h[-8:]])
    # soft CE is floored at the target's entropy, so require an absolute drop
    assert last < first - 0.1, (first, last)
    agree0 = _mean([r["top1_agree"] for r in h[:8]])
    agree1 = _mean([r["top1_agree"] for r in h[-8:]])
    assert agree1 > agree0 + 0.1, (agree0, agree1)
    if mode == "dspark":
        assert _mean([r["tv"] for r in h[-8:]]) < _mean([r["tv"] for r in h[:8]])


def _keys(d):
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_dspark_checkpoint_validates(trained_drafts, small_target):
    d = trained_drafts["dspark"]
    validate_draft(d, small_target["dir"])
    keys = _keys(d)
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
            "confidence_head.proj.weight", "confidence_head.proj.bias", "fc.weight",
            "hidden_norm.weight", "norm.weight"} <= keys
    assert not any(k.startswith(("embed", "lm_head")) for k in keys)  # shared with the target
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["block_size"] == 4
    assert cfg["dspark_train"]["loss_weights"]["tv"] == 0.9


def test_dflash_checkpoint_has_no_markov_or_confidence(trained_drafts, small_target):
    keys = _keys(trained_drafts["dflash"])
    assert not any(k.startswith(("markov_head", "confidence_head")) for k in keys)
    assert "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    # as trained it is not a DSpark draft; the serving export is (zero Markov head)
    with pytest.raises(DraftCheckpointError):
        validate_draft(trained_drafts["dflash"], small_target["dir"])
    served = trained_drafts["dflash_served"]
    validate_draft(served, small_target["dir"])
    with safe_open(str(served / "model.safetensors"), "pt") as f:
        assert f.get_tensor("markov_head.markov_w2.weight").abs().max() == 0
    cfg = json.loads((served / "config.json").read_text())
    assert cfg["enable_confidence_head"] is False


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sglang_dspark.train", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_cli_errors(small_target, text_file, tmp_path):
    t = small_target["dir"]
    r = _cli("draft", "--target", tmp_path / "nope", "--data", text_file, "--out", tmp_path / "o")
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = _cli("draft", "--target", t, "--data", text_file, "--out", tmp_path / "o",
             "--target-layer-ids", "2")
    assert r.returncode == 2 and "[0, 1]" in r.stderr, r.stderr
    bad = tmp_path / "data.csv"
    bad.write_text("a,b\n")
    r = _cli("draft", "--target", t, "--data", bad, "--out", tmp_path / "o")
    assert r.returncode == 2 and "unsupported data file type" in r.stderr
    r = _cli("draft", "--target", t, "--data", text_file, "--out", tmp_path / "o", "--steps", "0")
    assert r.returncode == 2 and "positive integer" in r.stderr
    r = _cli("draft", "--target", t, "--data", tmp_path / "missing.txt", "--out", tmp_path / "o")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _cli("export-dflash", "--draft", tmp_path, "--out", tmp_path / "x")
    assert r.returncode == 2 and "no config.json" in r.stderr


def test_cli_trains_a_valid_draft(small_target, text_file, tmp_path):
    out = tmp_path / "cli-draft"
    r = _cli("draft", "--target", small_target["dir"], "--data", text_file, "--out", out,
             "--steps", "3", "--block-size", "3", "--seq-len", "48", "--max-sequences", "16",
             "--target-layer-ids", "0,1", "--threads", "2")
    assert r.returncode == 0, r.stderr
    validate_draft(out, small_target["dir"])
    assert json.loads((out / "config.json").read_text())["target_layer_ids"] == [0, 1]
