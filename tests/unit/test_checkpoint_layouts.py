"""The draft validator reads a draft the way SGLang 0.5.23 does: every layout SGLang
serves passes, drafts SGLang would load broken are refused with a message.  Drafts
are rewritten from the tiny fixture pair (tests/draft_layouts.py); the served side
of each layout is tests/integration/test_draft_layouts.py."""

import inspect
import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from draft_layouts import LAYOUTS, make_layout, rename_tensors
from sglang_dspark.checkpoint import (
    VENDOR_ENCODER_ALIASES, DraftCheckpointError, check_draft_path, validate_draft)


def _edit_cfg(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _tensors(d, fn):
    w = load_file(str(d / "model.safetensors"))
    fn(w)
    save_file(w, str(d / "model.safetensors"))
    return d


@pytest.fixture
def layout(tmp_path, tiny_pair):
    return lambda name: make_layout(tiny_pair["draft"], tmp_path / name, name)


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_published_layout_validates(name, layout, tiny_pair):
    d = layout(name)
    cfg = json.loads((d / "config.json").read_text())
    if name in ("nested", "encoder"):  # the DFlash fields really are only nested
        assert not {"block_size", "target_layer_ids", "mask_token_id"} & set(cfg)
    if name == "dspark":
        assert "mask_token_id" not in cfg and "markov_head_type" not in cfg
        assert "block_size" not in cfg and "dflash_config" not in cfg
    if name == "flat":
        assert "dflash_config" not in cfg
    for mode in ("static", "compact"):
        assert validate_draft(d, tiny_pair["target"], ragged_mode=mode) == []


def test_vendor_names_refused_before_now_accepted_exactly_as_sglang(layout, tiny_pair):
    """SGLang aliases only the bare vendor names; model.encoder.* stays unloaded."""
    d = layout("encoder")
    rename_tensors(d / "model.safetensors", {"encoder.fc.weight": "model.encoder.fc.weight"})
    with pytest.raises(DraftCheckpointError,
                       match=r"missing tensors \['fc.weight'\].*encoder.fc.weight as fc.weight"):
        validate_draft(d, tiny_pair["target"])


def test_alias_table_is_sglangs():
    from sglang.srt.models.dflash import DFlashDraftModel

    src = inspect.getsource(DFlashDraftModel.load_weights)
    assert "_VENDOR_ENCODER_ALIASES" in src
    for vendor, ours in VENDOR_ENCODER_ALIASES.items():
        assert f'"{vendor}": "{ours}"' in src


def test_nested_dflash_config_wins_over_top_level(layout, tiny_pair):
    """SGLang's DFlash parser reads dflash_config first: a bad nested value is refused
    even when the top-level one is fine (the old validator read the top level first)."""
    d = layout("flat")
    _edit_cfg(d, lambda c: c.update(dflash_config={"target_layer_ids": [1, 3]}))
    with pytest.raises(DraftCheckpointError, match=r"bad target_layer_ids \[3\]"):
        validate_draft(d, tiny_pair["target"])


def test_markov_rank_only_nested_is_refused(layout, tiny_pair):
    d = layout("dspark")
    _edit_cfg(d, lambda c: c.pop("markov_rank"))
    with pytest.raises(DraftCheckpointError,
                       match=r"markov_rank=64 is set only in dspark_config.markov_rank.*"
                             r"add \"markov_rank\": 64 at the top level"):
        validate_draft(d, tiny_pair["target"])


def test_markov_head_type_must_match_the_built_head(layout, tiny_pair):
    d = layout("dspark")
    _edit_cfg(d, lambda c: c["dspark_config"].update(markov_head_type="gated"))
    with pytest.raises(DraftCheckpointError, match=r"markov_head_type='gated'.*top-level"):
        validate_draft(d, tiny_pair["target"])


def test_capture_count_must_match_the_fc(layout, tiny_pair):
    d = layout("dspark")
    _edit_cfg(d, lambda c: c.update(dspark_target_layer_ids=[0, 1, 2]))
    with pytest.raises(DraftCheckpointError, match=r"captures 3 layers.*fc takes 2"):
        validate_draft(d, tiny_pair["target"])


def test_mask_token_bounded_by_target_embedding_rows(layout, tiny_pair, tmp_path):
    d = layout("nested")
    _edit_cfg(d, lambda c: c["dflash_config"].update(mask_token_id=600))
    with pytest.raises(DraftCheckpointError, match=r"mask_token_id=600 .*512 rows"):
        validate_draft(d, tiny_pair["target"])
    # a target with a padded embedding takes the mask in its padding rows
    t = tmp_path / "padded_target"
    shutil.copytree(tiny_pair["target"], t)
    _edit_cfg(t, lambda c: c.update(padded_vocab_size=640))
    assert validate_draft(d, t) == []
    _edit_cfg(d, lambda c: c["dflash_config"].update(mask_token_id=640))
    with pytest.raises(DraftCheckpointError, match=r"mask_token_id=640 .*640 rows"):
        validate_draft(d, t)


def test_mask_token_unset_is_refused(layout, tiny_pair):
    d = layout("nested")
    _edit_cfg(d, lambda c: c["dflash_config"].pop("mask_token_id"))
    with pytest.raises(DraftCheckpointError, match="mask_token_id is not set"):
        validate_draft(d, tiny_pair["target"])


def test_confidence_head_required_only_where_sglang_builds_it(layout, tiny_pair):
    d = layout("flat")
    _tensors(d, lambda w: [w.pop(k) for k in list(w) if k.startswith("confidence_head.")])
    assert validate_draft(d, tiny_pair["target"], ragged_mode="static") == []
    for flag in (True, False):  # SGLang builds it in compact mode whatever the flag says
        _edit_cfg(d, lambda c: c.update(enable_confidence_head=flag))
        with pytest.raises(DraftCheckpointError,
                           match=r"missing tensors \['confidence_head.proj.bias', "
                                 r"'confidence_head.proj.weight'\].*MODE=compact builds"):
            validate_draft(d, tiny_pair["target"], ragged_mode="compact")


def test_confidence_head_with_model_prefix_is_refused(layout, tiny_pair):
    d = layout("flat")
    _tensors(d, lambda w: w.update({"model." + k: w.pop(k) for k in list(w)
                                    if k.startswith("confidence_head.")}))
    with pytest.raises(DraftCheckpointError, match="only without the model. prefix"):
        validate_draft(d, tiny_pair["target"], ragged_mode="cap-accept")


def test_unexpected_markov_tensor_and_bad_shapes(layout, tiny_pair):
    d = layout("nested")
    _tensors(d, lambda w: w.update(
        {"markov_head.gate_proj.weight": w["norm.weight"][None].clone()}))
    with pytest.raises(DraftCheckpointError, match="unexpected Markov head tensor "
                                                   "markov_head.gate_proj.weight"):
        validate_draft(d, tiny_pair["target"])
    d = layout("flat")
    _tensors(d, lambda w: w.update({"layers.0.mlp.down_proj.weight":
                                    w["layers.0.mlp.down_proj.weight"][:, :64].contiguous()}))
    with pytest.raises(DraftCheckpointError, match=r"tensor layers.0.mlp.down_proj.weight has "
                                                   r"shape \[64, 64\], expected \[64, 128\]"):
        validate_draft(d, tiny_pair["target"])


def test_not_a_dspark_architecture(layout, tiny_pair):
    d = layout("flat")
    _edit_cfg(d, lambda c: c.update(architectures=["Qwen3ForCausalLM"]))
    with pytest.raises(DraftCheckpointError, match="names no DSpark draft model"):
        validate_draft(d, tiny_pair["target"])


def test_sglang_parser_errors_are_reported(layout, tiny_pair):
    d = layout("nested")
    _edit_cfg(d, lambda c: c["dflash_config"].update(block_size=0))
    with pytest.raises(DraftCheckpointError, match="parser refuses it: DFLASH block_size"):
        validate_draft(d, tiny_pair["target"])


def test_check_draft_path(tmp_path, tiny_pair):
    check_draft_path(tiny_pair["draft"])
    for hub_like in ("org/some-draft", "some-draft", "s3://bucket/draft"):
        check_draft_path(hub_like)  # left to SGLang's hub / remote resolution
    with pytest.raises(DraftCheckpointError, match=r"draft path .*/nope does not exist"):
        check_draft_path(tmp_path / "nope")
    with pytest.raises(DraftCheckpointError, match="does not exist"):
        check_draft_path("./drafts/nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftCheckpointError, match="has no config.json"):
        check_draft_path(tmp_path / "empty")
