import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from sglang_dspark.checkpoint import DraftCheckpointError, validate_draft
from sglang_dspark.tiny_models import TinySpec, build_pair, main as tiny_main


def test_builder_is_deterministic_and_validates(tmp_path, tiny_pair):
    m = build_pair(tmp_path / "again", TinySpec(seed=0))
    assert m["sha256"] == tiny_pair["manifest"]["sha256"]
    other = build_pair(tmp_path / "other", TinySpec(seed=1))
    assert other["sha256"]["target"] != m["sha256"]["target"]
    validate_draft(tmp_path / "again" / "draft", tmp_path / "again" / "target")


def test_builder_rejects_bad_layer_ids(tmp_path, capsys):
    with pytest.raises(ValueError, match="below num_target_layers - 1"):
        TinySpec(target_layer_ids=(1, 3)).validate()
    assert tiny_main(["--out", str(tmp_path), "--target-layer-ids", "3"]) == 2
    assert "num_target_layers - 1" in capsys.readouterr().err


def test_target_is_real_qwen3_and_draft_tracks_it(tiny_pair):
    """HF transformers loads the target; the draft's Markov table predicts the
    target's greedy next token for about (1 - draft_error_rate) of tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_pair["target"], dtype=torch.float32)
    w = load_file(tiny_pair["draft"] + "/model.safetensors")
    ids = torch.arange(4, 300).view(1, -1)
    with torch.no_grad():
        nxt = model(ids).logits[0].argmax(-1)
    bias = w["markov_head.markov_w1.weight"][ids[0]] @ w["markov_head.markov_w2.weight"].T
    agree = (bias.argmax(-1) == nxt).float().mean().item()
    assert 0.6 < agree < 0.9, agree
    # the confidence head separates right rows from wrong rows
    rank = w["markov_head.markov_w1.weight"].shape[1]
    hidden = model.config.hidden_size
    conf_w = w["confidence_head.proj.weight"][0, hidden:]
    conf = torch.sigmoid(w["markov_head.markov_w1.weight"][ids[0]] @ conf_w
                         + w["confidence_head.proj.bias"])
    right = bias.argmax(-1) == nxt
    assert conf[right].mean() > 0.85 and conf[~right].mean() < 0.15
    assert rank == TinySpec().markov_rank


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_validate_missing_tensors(tmp_path, tiny_pair):
    d = _copy(tiny_pair["draft"], tmp_path / "d")
    w = load_file(str(d / "model.safetensors"))
    del w["layers.0.self_attn.q_proj.weight"], w["markov_head.markov_w2.weight"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(DraftCheckpointError, match="missing tensors.*markov_w2"):
        validate_draft(d, tiny_pair["target"])


def test_validate_vocab_and_layer_ids(tmp_path, tiny_pair):
    d = _copy(tiny_pair["draft"], tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftCheckpointError, match="vocabulary mismatch"):
        validate_draft(d, tiny_pair["target"])
    cfg["vocab_size"] = 512
    cfg["target_layer_ids"] = [1, 3]
    cfg["dflash_config"]["target_layer_ids"] = [1, 3]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DraftCheckpointError, match=r"bad target_layer_ids \[3\]"):
        validate_draft(d, tiny_pair["target"])


def test_validate_corrupt_files(tmp_path, tiny_pair):
    d = _copy(tiny_pair["draft"], tmp_path / "d")
    (d / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(DraftCheckpointError, match="truncated"):
        validate_draft(d, tiny_pair["target"])
    (d / "config.json").write_text("{not json")
    with pytest.raises(DraftCheckpointError, match="not valid JSON"):
        validate_draft(d, tiny_pair["target"])
