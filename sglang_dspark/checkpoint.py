"""Validate a DSpark draft checkpoint against its target before SGLang loads it.

SGLang 0.5.23's DFlash/DSpark loader ignores unexpected tensors and does not
report missing backbone tensors (they stay randomly initialised), so a broken
draft serves garbage or hangs instead of failing.  :func:`validate_draft` reads
only ``config.json`` files and safetensors *headers* (no weights) and raises
:class:`DraftCheckpointError` with a message that says what to fix.

Only local directories are checked (a hub id cannot be inspected offline).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_QWEN3_LAYER_TENSORS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight",
)


class DraftCheckpointError(ValueError):
    pass


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DraftCheckpointError(f"{path} is missing: a DSpark draft directory needs a "
                                   "config.json next to its safetensors.") from None
    except ValueError as e:
        raise DraftCheckpointError(f"{path} is not valid JSON: {e}") from None


def safetensors_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for every ``*.safetensors`` file (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise DraftCheckpointError(f"no *.safetensors files in {directory}.")
    for f in files:
        with open(f, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise DraftCheckpointError(f"{f} is truncated (no safetensors header).")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 * 1024 * 1024:
                raise DraftCheckpointError(f"{f} has an implausible header size {n}.")
            try:
                header = json.loads(fh.read(n))
            except ValueError as e:
                raise DraftCheckpointError(f"{f} has a corrupt safetensors header: {e}") from None
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name.removeprefix("model.")] = tuple(meta.get("shape", ()))
    return shapes


def _get(cfg: dict, key: str, default=None):
    if key in cfg:
        return cfg[key]
    return (cfg.get("dflash_config") or {}).get(key, default)


def validate_draft(draft_dir: str | Path, target_dir: str | Path) -> list[str]:
    """Raise DraftCheckpointError on a broken draft; return a list of warnings."""
    draft_dir, target_dir = Path(draft_dir), Path(target_dir)
    warnings: list[str] = []
    dcfg = _read_json(draft_dir / "config.json")
    tcfg_path = target_dir / "config.json"
    tcfg = _read_json(tcfg_path) if tcfg_path.is_file() else None
    tcfg = (tcfg or {}).get("text_config", tcfg)
    errors: list[str] = []

    vocab = dcfg.get("vocab_size")
    hidden = dcfg.get("hidden_size")
    if tcfg is not None:
        if vocab is not None and tcfg.get("vocab_size") not in (None, vocab):
            errors.append(f"vocabulary mismatch: draft vocab_size={vocab} but target "
                          f"vocab_size={tcfg.get('vocab_size')}; the draft shares the target's "
                          "embedding and LM head, so they must match")
        if hidden is not None and tcfg.get("hidden_size") not in (None, hidden):
            errors.append(f"hidden_size mismatch: draft {hidden} vs target "
                          f"{tcfg.get('hidden_size')}")
    n_target = _get(dcfg, "num_target_layers") or (tcfg or {}).get("num_hidden_layers")
    layer_ids = _get(dcfg, "target_layer_ids")
    t_layers = (tcfg or {}).get("num_hidden_layers", n_target)
    if layer_ids is not None and t_layers is not None:
        if not isinstance(layer_ids, list) or not all(isinstance(i, int) for i in layer_ids):
            errors.append(f"target_layer_ids must be a list of ints, got {layer_ids!r}")
        else:
            bad = [i for i in layer_ids if not 0 <= i < int(t_layers) - 1]
            if bad:
                errors.append(
                    f"bad target_layer_ids {bad}: each id must be in [0, {int(t_layers) - 2}] "
                    f"for a {t_layers}-layer target (hidden states are captured before layer "
                    "k+1, so the last layer yields nothing)")
    mask_id = _get(dcfg, "mask_token_id")
    if mask_id is None:
        errors.append("mask_token_id is not set in the draft config")
    elif vocab is not None and not 0 <= int(mask_id) < int(vocab):
        errors.append(f"mask_token_id={mask_id} is outside the vocabulary (size {vocab})")
    rank = int(dcfg.get("markov_rank") or 0)
    if rank <= 0:
        errors.append(f"markov_rank must be > 0 for DSpark, got {dcfg.get('markov_rank')!r}")

    shapes = safetensors_shapes(draft_dir)
    expected: dict[str, tuple[int, ...] | None] = {
        "fc.weight": None, "hidden_norm.weight": (hidden,) if hidden else None,
        "norm.weight": (hidden,) if hidden else None,
    }
    if rank > 0 and vocab:
        expected["markov_head.markov_w1.weight"] = (vocab, rank)
        expected["markov_head.markov_w2.weight"] = (vocab, rank)
    if dcfg.get("enable_confidence_head", True):
        with_markov = dcfg.get("confidence_head_with_markov", rank > 0)
        expected["confidence_head.proj.weight"] = (
            (1, hidden + (rank if with_markov else 0)) if hidden else None)
    if "Qwen3DSparkModel" in (dcfg.get("architectures") or []):
        for i in range(int(dcfg.get("num_hidden_layers") or 0)):
            for t in _QWEN3_LAYER_TENSORS:
                expected[f"layers.{i}.{t}"] = None
    missing = sorted(k for k in expected if k not in shapes)
    if missing:
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        errors.append(f"missing tensors {missing[:8]}{more}")
    for name, shape in expected.items():
        if shape is not None and name in shapes and shapes[name] != shape:
            errors.append(f"tensor {name} has shape {list(shapes[name])}, expected {list(shape)}")
    if "fc.weight" in shapes and hidden and layer_ids:
        want = (hidden, hidden * len(layer_ids))
        if shapes["fc.weight"] != want:
            errors.append(f"fc.weight has shape {list(shapes['fc.weight'])}, expected "
                          f"{list(want)} ({len(layer_ids)} target layers x hidden {hidden})")
    if errors:
        raise DraftCheckpointError(
            f"DSpark draft checkpoint {draft_dir} is unusable with target {target_dir}: "
            + "; ".join(errors) + ".")
    return warnings


def validate_from_server_args(server_args) -> None:
    """Validate when both paths are local directories (hook on DSPARK arg handling)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    if str(getattr(cfg, "speculative_algorithm", "") or "").upper() != "DSPARK":
        return
    draft, target = cfg.speculative_draft_model_path, cfg.model_path
    if draft and Path(draft).is_dir() and Path(target).is_dir() and draft != target:
        validate_draft(draft, target)
