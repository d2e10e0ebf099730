"""Rewrite a tiny DSpark draft into the config / tensor layouts published drafts use
(importable as ``draft_layouts``).  Same weights, same values; only where they are
written changes, so SGLang must serve every layout identically.

* ``flat``:    DeepSpec layout, every field at the top level, no ``dflash_config``.
* ``nested``:  ``block_size``, ``target_layer_ids``, ``mask_token_id``,
  ``num_target_layers`` only inside ``dflash_config``.
* ``dspark``:  gamma and capture layers from ``dspark_block_size`` /
  ``dspark_target_layer_ids``, ``mask_token_id`` and ``markov_head_type`` only in
  ``dspark_config``; ``markov_rank`` stays at the top level (SGLang's Markov head
  reads it there) and ``target_layer_ids`` too (SGLang's DFlash parser sizes the
  draft's ``fc`` from it).
* ``encoder``: the ``nested`` config with the vendor tensor names
  ``encoder.fc.weight`` and ``encoder.output_norm_enc.weight``.
"""

import json
import shutil
from pathlib import Path

LAYOUTS = ("flat", "nested", "dspark", "encoder")
DFLASH_KEYS = ("block_size", "target_layer_ids", "mask_token_id", "num_target_layers")


def _values(cfg: dict) -> dict:
    nested = cfg.get("dflash_config") or {}
    return {k: nested.get(k, cfg.get(k)) for k in DFLASH_KEYS}


def rewrite_config(cfg: dict, layout: str) -> dict:
    cfg = json.loads(json.dumps(cfg))
    vals = _values(cfg)
    cfg.pop("dflash_config", None)
    for k in DFLASH_KEYS:
        cfg.pop(k, None)
    if layout == "flat":
        cfg.update(vals)
    elif layout in ("nested", "encoder"):
        cfg["dflash_config"] = vals
    elif layout == "dspark":
        cfg["num_target_layers"] = vals["num_target_layers"]
        cfg["target_layer_ids"] = vals["target_layer_ids"]
        cfg["dspark_block_size"] = vals["block_size"]
        cfg["dspark_target_layer_ids"] = vals["target_layer_ids"]
        cfg["dspark_config"] = {"mask_token_id": vals["mask_token_id"],
                                "markov_head_type": cfg.pop("markov_head_type"),
                                "markov_rank": cfg["markov_rank"]}
    else:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    return cfg


def rename_tensors(path: Path, mapping: dict) -> None:
    from safetensors.torch import load_file, save_file

    w = load_file(str(path))
    save_file({mapping.get(k, k): v for k, v in w.items()}, str(path))


def make_layout(src: str | Path, dst: str | Path, layout: str) -> Path:
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(rewrite_config(cfg, layout), indent=2))
    if layout == "encoder":
        rename_tensors(dst / "model.safetensors",
                       {"fc.weight": "encoder.fc.weight",
                        "hidden_norm.weight": "encoder.output_norm_enc.weight"})
    return dst
