"""Validate a DSpark draft checkpoint against its target before SGLang loads it.

SGLang 0.5.23's DFlash/DSpark loader ignores unexpected tensors and does not
report missing backbone tensors (they stay randomly initialised), so a broken
draft serves garbage or hangs instead of failing.  :func:`validate_draft` reads
only ``config.json`` files and safetensors *headers* (no weights) and raises
:class:`DraftCheckpointError` with a message that says what to fix.

The rule is: accept exactly the drafts SGLang 0.5.23 serves, refuse the ones it
would load broken.  So the config is read the way SGLang reads it, with SGLang's
own functions (each listed in :mod:`sglang_dspark.seams`):

* the config object is SGLang's ``get_config`` (Hugging Face config class, its
  defaults, ``--json-model-override-args``); the target's text config is
  ``get_hf_text_config``;
* ``parse_dflash_draft_config`` decides what the draft's ``fc`` projection takes:
  ``block_size``, ``target_layer_ids``, ``mask_token_id``, ``num_target_layers``
  from a nested ``dflash_config`` first, then the top level;
* ``parse_dspark_draft_config`` decides what the worker and the target's capture
  use: ``dspark_*``-prefixed keys first, then ``dspark_config`` / ``dflash_config``,
  then ``text_config``, then the top level;
* the Markov and confidence heads are built from the *top-level* ``markov_rank``,
  ``markov_head_type`` (default ``vanilla``) and ``confidence_head_with_markov``
  (``build_markov_head``, ``build_confidence_head``), so a value present only in a
  nested block is refused with a message saying to put it at the top level;
* the confidence head is built only when ``SGLANG_RAGGED_VERIFY_MODE`` is not
  ``static`` (and then whatever ``enable_confidence_head`` says), so its tensors are
  required exactly in those modes;
* ``mask_token_id`` must be below the target's embedding rows (its
  ``padded_vocab_size`` when it has one, else ``vocab_size``), as the worker checks
  (``resolve_runtime_config``);
* tensor names resolve as SGLang's loader resolves them: an optional ``model.``
  prefix, and the vendor names ``encoder.fc.weight`` / ``encoder.output_norm_enc.weight``
  for ``fc.weight`` / ``hidden_norm.weight`` (``VENDOR_ENCODER_ALIASES``, a copy of
  the alias table inside ``DFlashDraftModel.load_weights``, checked against
  SGLang's source by the unit tests).  Confidence tensors count only without the
  ``model.`` prefix (SGLang's DSpark loader routes them by the raw name).

Beyond SGLang, hidden states are captured *before* layer k+1, so every captured
layer id must be below the target's layer count minus one (the last layer
yields nothing, silently).

Only local directories are checked (a hub id cannot be inspected offline), and
only the dense DSpark drafts (``Qwen3DSparkModel``, ``LingDSparkModel``,
``DSparkDraftModel``); other DSpark families (DeepSeek-V4, MiniMax, LFM2,
Nemotron 3.5) pass with a warning and are left to SGLang's own loader.

:func:`check_draft_path` runs before SGLang reads the draft at all: a draft path
that does not exist (and cannot be a hub repo id) is refused in one line instead
of SGLang's hub tracebacks.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

#: DFlashDraftModel.load_weights (srt/models/dflash.py) aliases these vendor names.
VENDOR_ENCODER_ALIASES = {
    "encoder.fc.weight": "fc.weight",
    "encoder.output_norm_enc.weight": "hidden_norm.weight",
}
#: srt/models/dspark.py EntryClass: one dense backbone (DFlash layers + heads).
DENSE_DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "LingDSparkModel", "DSparkDraftModel")
#: DSpark drafts SGLang serves with other backbones; not checked here.
OTHER_DSPARK_ARCHITECTURES = ("Lfm2DSparkDraftModel", "DSparkMiniMaxDraftModel",
                              "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMDSpark")
# DSparkDraftMixin.load_weights skips these (after removing a "model." prefix)
_SKIPPED_PREFIXES = ("lm_head.", "rotary_emb.", "embed_tokens.")
_MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


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


def safetensors_header_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name (as stored) -> shape for every ``*.safetensors`` file (headers only)."""
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
                shapes[name] = tuple(meta.get("shape", ()))
    return shapes


def safetensors_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name without a ``model.`` prefix -> shape (headers only)."""
    return {k.removeprefix("model."): v for k, v in safetensors_header_shapes(directory).items()}


# ------------------------------------------------------------------ draft path


def _could_be_hub_id(path: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def check_draft_path(path: str | os.PathLike) -> None:
    """Refuse a draft path SGLang could only fail on, before it tries the hub.

    A path that exists must be a directory with a ``config.json`` (or a file, e.g.
    GGUF, left to SGLang).  A path that does not exist is refused unless it could be
    a Hugging Face repo id (``name`` or ``namespace/name``) or is a URL
    (``scheme://...``), which SGLang resolves itself.
    """
    p = str(path)
    if os.path.exists(p):
        if os.path.isdir(p) and not os.path.isfile(os.path.join(p, "config.json")):
            raise DraftCheckpointError(
                f"DSpark draft directory {p} has no config.json: point "
                "--speculative-draft-model-path at the draft checkpoint directory "
                "(config.json next to its *.safetensors).")
        return
    if "://" in p or _could_be_hub_id(p):
        return
    raise DraftCheckpointError(
        f"DSpark draft path {p} does not exist (and is not a Hugging Face repo id): "
        "pass an existing draft checkpoint directory to --speculative-draft-model-path.")


# ------------------------------------------------------------------ SGLang's config view


def _sglang_config(path: Path, *, trust_remote_code: bool, revision: str | None,
                   model_override_args: dict | None):
    """SGLang's config object for ``path``, read from disk now.

    ``get_config`` memoises by arguments (a directory edited since would read stale),
    so its undecorated function is called; the result is ours to read and change.
    """
    from sglang.srt.utils.hf_transformers_utils import get_config

    read = getattr(get_config, "__wrapped__", get_config)
    try:
        cfg = read(str(path), trust_remote_code=trust_remote_code, revision=revision,
                         model_override_args=model_override_args or None)
    except Exception as e:  # SGLang/transformers raise many types here
        raise DraftCheckpointError(
            f"SGLang cannot read the config in {path}: {type(e).__name__}: {e}") from None
    return cfg


def _target_text_config(target_dir: Path, **kw):
    if not (target_dir / "config.json").is_file():
        return None
    _read_json(target_dir / "config.json")  # a clear message for a broken file
    from sglang.srt.utils.hf_transformers_utils import get_hf_text_config

    return get_hf_text_config(_sglang_config(target_dir, **kw))


def _where(cfg, key: str) -> str:
    """Where a key is set outside the top level (for messages)."""
    places = []
    if getattr(cfg, f"dspark_{key}", None) is not None:
        places.append(f"dspark_{key}")
    for block in ("dspark_config", "dflash_config", "text_config"):
        sub = getattr(cfg, block, None)
        sub = sub if isinstance(sub, dict) else getattr(sub, "__dict__", {}) or {}
        if sub.get(key) is not None:
            places.append(f"{block}.{key}")
    return ", ".join(places) or "a nested block"


def _layer_tensors(cfg, i: int) -> dict[str, tuple[int, ...]]:
    """DFlashDecoderLayer's checkpoint tensors and shapes (srt/models/dflash.py)."""
    h = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", heads))
    hd = int(getattr(cfg, "head_dim", h // heads))
    inter = int(getattr(cfg, "intermediate_size", 0))
    p = f"layers.{i}."
    t = {
        p + "self_attn.q_proj.weight": (heads * hd, h),
        p + "self_attn.k_proj.weight": (kv * hd, h),
        p + "self_attn.v_proj.weight": (kv * hd, h),
        p + "self_attn.o_proj.weight": (h, heads * hd),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_proj.weight": (inter, h),
        p + "mlp.up_proj.weight": (inter, h),
        p + "mlp.down_proj.weight": (h, inter),
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
    }
    if bool(getattr(cfg, "attention_bias", False)):
        t.update({p + "self_attn.q_proj.bias": (heads * hd,),
                  p + "self_attn.k_proj.bias": (kv * hd,),
                  p + "self_attn.v_proj.bias": (kv * hd,),
                  p + "self_attn.o_proj.bias": (h,)})
    return t


def _markov_tensors(head_type: str, vocab: int, rank: int, hidden: int) -> dict:
    """build_markov_head's tensors (srt/models/dspark.py VanillaMarkov/GatedMarkovHead/RNNHead)."""
    t = {"markov_head.markov_w1.weight": (vocab, rank),
         "markov_head.markov_w2.weight": (vocab, rank)}
    if head_type == "gated":
        t.update({"markov_head.gate_proj.weight": (rank, hidden + rank),
                  "markov_head.gate_proj.bias": (rank,)})
    elif head_type == "rnn":
        t.update({"markov_head.joint_proj.weight": (3 * rank, 2 * rank + hidden),
                  "markov_head.joint_proj.bias": (3 * rank,)})
    return t


def _resolve_backbone(name: str, expected) -> str | None:
    """DFlashDraftModel.load_weights' resolve_param_name, on checkpoint names."""
    if name in expected:
        return name
    if name.startswith("model.") and name[len("model."):] in expected:
        return name[len("model."):]
    alias = VENDOR_ENCODER_ALIASES.get(name)
    return alias if alias in expected else None


# ------------------------------------------------------------------ validation


def validate_draft(draft_dir: str | Path, target_dir: str | Path, *,
                   ragged_mode: str | None = None, num_draft_tokens: int | None = None,
                   trust_remote_code: bool = False, revision: str | None = None,
                   model_override_args: dict | None = None) -> list[str]:
    """Raise DraftCheckpointError on a draft SGLang would load broken; return warnings.

    ``ragged_mode``: SGLANG_RAGGED_VERIFY_MODE the server runs with (default: SGLang's
    reading of the environment); it decides whether the confidence head is loaded.
    ``num_draft_tokens``: the resolved ``--speculative-num-draft-tokens`` (default: the
    draft's gamma + 1, or SGLang's default gamma + 1).  The remaining arguments are
    passed to SGLang's ``get_config`` as SGLang passes them.
    """
    from sglang.srt.speculative.dflash_utils import (
        is_nemotron_35_draft_config, parse_dflash_draft_config)
    from sglang.srt.speculative.dspark_components.dspark_config import (
        DEFAULT_DSPARK_GAMMA, parse_dspark_draft_config, resolve_runtime_config)

    draft_dir, target_dir = Path(draft_dir), Path(target_dir)
    warnings: list[str] = []
    errors: list[str] = []
    _read_json(draft_dir / "config.json")  # clear messages for a missing/broken file
    kw = dict(trust_remote_code=trust_remote_code, revision=revision,
              model_override_args=model_override_args)
    cfg = _sglang_config(draft_dir, **kw)
    tcfg = _target_text_config(target_dir, **{**kw, "revision": None})
    raw_shapes = safetensors_header_shapes(draft_dir)

    def fail():
        raise DraftCheckpointError(
            f"DSpark draft checkpoint {draft_dir} is unusable with target {target_dir}: "
            + "; ".join(errors) + ".")

    archs = list(getattr(cfg, "architectures", None) or [])
    if is_nemotron_35_draft_config(cfg) or (
            not set(archs) & set(DENSE_DSPARK_ARCHITECTURES)
            and set(archs) & set(OTHER_DSPARK_ARCHITECTURES)):
        warnings.append(f"draft {draft_dir} ({archs}) is not a dense DSpark draft; its "
                        "tensors are not checked here (SGLang's loader checks them)")
        return warnings
    if not set(archs) & set(DENSE_DSPARK_ARCHITECTURES):
        errors.append(f"architectures {archs} names no DSpark draft model SGLang serves "
                      f"(expected one of {list(DENSE_DSPARK_ARCHITECTURES)})")
        fail()

    try:
        dfl = parse_dflash_draft_config(draft_hf_config=cfg)
        dsp = parse_dspark_draft_config(draft_hf_config=cfg)
    except ValueError as e:
        errors.append(f"SGLang's draft config parser refuses it: {e}")
        fail()

    vocab = int(cfg.vocab_size)
    hidden = int(cfg.hidden_size)
    n_layers = int(cfg.num_hidden_layers)
    if tcfg is not None:
        if getattr(tcfg, "vocab_size", None) not in (None, vocab):
            errors.append(f"vocabulary mismatch: draft vocab_size={vocab} but target "
                          f"vocab_size={tcfg.vocab_size}; the draft shares the target's "
                          "embedding and LM head, so they must match")
        if getattr(tcfg, "hidden_size", None) not in (None, hidden):
            errors.append(f"hidden_size mismatch: draft {hidden} vs target {tcfg.hidden_size}")

    # the draft's fc input width: DFlashDraftModel.__init__
    if dfl.num_target_layers is not None:
        fc_target_layers = int(dfl.num_target_layers)
    elif dfl.target_layer_ids is not None:
        fc_target_layers = max(dfl.target_layer_ids) + 1
    else:
        fc_target_layers = n_layers
    fc_ids = None
    try:
        fc_ids = dfl.resolve_target_layer_ids(target_num_layers=fc_target_layers,
                                              draft_num_layers=n_layers)
    except ValueError as e:
        errors.append(f"SGLang cannot build the draft's fc projection: {e}")

    # the layers the target captures: spec_aux_hidden_state._resolve_dflash_aux_hidden_state
    t_layers = None
    if tcfg is not None and getattr(tcfg, "num_hidden_layers", None) is not None:
        t_layers = int(tcfg.num_hidden_layers) * int(getattr(tcfg, "num_loops", 1) or 1)
        if dfl.num_target_layers is not None and int(dfl.num_target_layers) != t_layers:
            warnings.append(f"draft num_target_layers={dfl.num_target_layers} differs from the "
                            f"target's {t_layers} layers; SGLang captures by the target")
    elif dfl.num_target_layers is not None:
        t_layers = int(dfl.num_target_layers)
    capture = None
    if dsp.target_layer_ids is not None:
        capture = list(dsp.target_layer_ids)
    elif t_layers is not None:
        try:
            capture = dfl.resolve_target_layer_ids(target_num_layers=t_layers,
                                                   draft_num_layers=n_layers)
        except ValueError as e:
            errors.append(f"SGLang cannot choose the target layers to capture: {e}")
    else:
        capture = fc_ids
    if capture is not None and t_layers is not None:
        bad = [i for i in capture if not 0 <= i < t_layers - 1]
        if bad:
            errors.append(
                f"bad target_layer_ids {bad}: each id must be in [0, {t_layers - 2}] "
                f"for a {t_layers}-layer target (hidden states are captured before layer "
                "k+1, so the last layer yields nothing)")
    if capture is not None and fc_ids is not None and len(capture) != len(fc_ids):
        errors.append(
            f"the target captures {len(capture)} layers {capture} (the DSpark parser's "
            f"target_layer_ids, dspark_target_layer_ids first) but the draft's fc takes "
            f"{len(fc_ids)} {fc_ids} (the DFlash parser's target_layer_ids, dflash_config "
            "first): make both lists the same")

    # mask token: DSparkWorkerV2 via resolve_runtime_config
    mask_id = dsp.mask_token_id
    rows = None
    if tcfg is not None:
        rows = getattr(tcfg, "padded_vocab_size", None) or getattr(tcfg, "vocab_size", None)
    if mask_id is None:
        errors.append("mask_token_id is not set in the draft config")
    elif rows is not None and int(mask_id) >= int(rows):
        errors.append(f"mask_token_id={mask_id} is outside the target's embedding "
                      f"({rows} rows)")

    # Markov head: build_markov_head reads the TOP-LEVEL fields
    rank = int(getattr(cfg, "markov_rank", 0) or 0)
    head_type = str(getattr(cfg, "markov_head_type", "vanilla")).lower()
    if rank <= 0:
        if dsp.markov_rank > 0:
            errors.append(
                f"markov_rank={dsp.markov_rank} is set only in {_where(cfg, 'markov_rank')}, "
                "but SGLang builds the Markov head from the top-level markov_rank: add "
                f"\"markov_rank\": {dsp.markov_rank} at the top level of config.json")
        else:
            errors.append(f"markov_rank must be > 0 for DSpark, got "
                          f"{getattr(cfg, 'markov_rank', None)!r}")
    elif dsp.markov_rank != rank:
        warnings.append(f"markov_rank {dsp.markov_rank} in {_where(cfg, 'markov_rank')} "
                        f"differs from the top-level {rank}; SGLang builds the head with {rank}")
    if head_type not in _MARKOV_HEAD_TYPES:
        errors.append(f"unsupported markov_head_type={head_type!r}; SGLang supports "
                      f"{list(_MARKOV_HEAD_TYPES)}")
    elif dsp.markov_head_type is not None and dsp.markov_head_type != head_type:
        errors.append(
            f"markov_head_type={dsp.markov_head_type!r} in "
            f"{_where(cfg, 'markov_head_type')}, but SGLang builds the Markov head from the "
            f"top-level markov_head_type ({head_type!r}): set \"markov_head_type\": "
            f"\"{dsp.markov_head_type}\" at the top level of config.json")

    if not errors:  # anything else SGLang's worker would refuse at start-up
        gamma = dsp.resolve_gamma(default=None) or DEFAULT_DSPARK_GAMMA
        try:
            resolve_runtime_config(
                draft_hf_config=cfg, target_vocab_size=int(rows if rows else vocab),
                speculative_num_draft_tokens=num_draft_tokens or int(gamma) + 1)
        except ValueError as e:
            errors.append(str(e).rstrip("."))

    # tensors
    if ragged_mode is None:
        from sglang.srt.speculative.ragged_verify import read_ragged_verify_mode

        try:
            ragged_mode = read_ragged_verify_mode().value
        except ValueError as e:
            errors.append(str(e))
            ragged_mode = "static"
    expected: dict[str, tuple[int, ...] | None] = {
        "fc.weight": (hidden, hidden * len(fc_ids)) if fc_ids else None,
        "hidden_norm.weight": (hidden,), "norm.weight": (hidden,),
    }
    for i in range(n_layers):
        try:
            expected.update(_layer_tensors(cfg, i))
        except (TypeError, ValueError, ZeroDivisionError) as e:
            errors.append(f"SGLang cannot build draft layer {i} from this config: {e}")
            break
    markov = _markov_tensors(head_type, vocab, rank, hidden) if rank > 0 else {}
    expected.update(markov)
    confidence: dict[str, tuple[int, ...]] = {}
    if ragged_mode != "static":  # build_confidence_head: built in every non-static mode
        with_markov = bool(getattr(cfg, "confidence_head_with_markov", rank > 0))
        confidence = {"confidence_head.proj.weight": (1, hidden + (rank if with_markov else 0)),
                      "confidence_head.proj.bias": (1,)}

    loaded: dict[str, tuple[int, ...]] = {}
    misplaced_confidence = []
    for name, shape in raw_shapes.items():
        bare = name.removeprefix("model.")
        if bare.startswith(_SKIPPED_PREFIXES):
            continue
        if name.startswith("confidence_head."):
            if confidence and name not in confidence:
                errors.append(f"unexpected confidence head tensor {name} (SGLang refuses it)")
            elif confidence:
                loaded[name] = shape
            continue
        if name.startswith("markov_head.") and name not in markov and rank > 0:
            errors.append(f"unexpected Markov head tensor {name} for a {head_type!r} head "
                          "(SGLang refuses it): check markov_head_type")
            continue
        target = _resolve_backbone(name, expected)
        if target is not None:
            loaded[target] = shape
        elif bare.startswith("confidence_head.") and confidence:
            misplaced_confidence.append(name)

    missing = sorted(k for k in {**expected, **confidence} if k not in loaded)
    if missing:
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        hint = ""
        if {"fc.weight", "hidden_norm.weight"} & set(missing):
            hint = (" (SGLang also reads encoder.fc.weight as fc.weight and "
                    "encoder.output_norm_enc.weight as hidden_norm.weight)")
        errors.append(f"missing tensors {missing[:8]}{more}{hint}")
        conf_missing = [k for k in missing if k in confidence]
        if conf_missing and misplaced_confidence:
            errors.append(f"the confidence head is stored as {sorted(misplaced_confidence)}; "
                          "SGLang loads it only without the model. prefix")
        elif conf_missing:
            errors.append(
                f"SGLANG_RAGGED_VERIFY_MODE={ragged_mode} builds SGLang's confidence head "
                "(whatever enable_confidence_head says): use a draft with trained "
                "confidence_head.proj weights, or SGLANG_RAGGED_VERIFY_MODE=static")
    for name, shape in {**expected, **confidence}.items():
        if shape is not None and name in loaded and loaded[name] != shape:
            why = ""
            if name == "fc.weight":
                why = f" ({len(fc_ids)} target layers x hidden {hidden})"
            errors.append(f"tensor {name} has shape {list(loaded[name])}, expected "
                          f"{list(shape)}{why}")
    if errors:
        fail()
    return warnings


# ------------------------------------------------------------------ server hooks


def _report_in_one_line() -> None:
    """Print an uncaught DraftCheckpointError as one line (no traceback) at exit.

    Only our own error type is affected; every other exception keeps the previous
    ``sys.excepthook``.  Installed just before a hook raises.
    """
    previous = sys.excepthook
    if getattr(previous, "_sglang_dspark", False):
        return

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, DraftCheckpointError):
            print(f"sglang-dspark: error: {exc}", file=sys.stderr, flush=True)
        else:
            previous(exc_type, exc, tb)

    hook._sglang_dspark = True
    sys.excepthook = hook


def _dspark_view(server_args):
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_dspark.seams import names_dspark

    cfg = resolving_view(server_args)
    if not names_dspark(getattr(cfg, "speculative_algorithm", None)):
        return None
    return cfg


def check_draft_path_from_server_args(server_args) -> None:
    """BEFORE SGLang's speculative arg handling, which reads the draft's config first."""
    cfg = _dspark_view(server_args)
    if cfg is None or not cfg.speculative_draft_model_path:
        return
    try:
        check_draft_path(cfg.speculative_draft_model_path)
    except DraftCheckpointError:
        _report_in_one_line()
        raise


def validate_from_server_args(server_args) -> None:
    """Validate when both paths are local directories (hook on DSPARK arg handling)."""
    cfg = _dspark_view(server_args)
    if cfg is None:
        return
    draft, target = cfg.speculative_draft_model_path, cfg.model_path
    if not (draft and Path(draft).is_dir() and Path(target).is_dir() and draft != target):
        return
    try:
        override = json.loads(getattr(cfg, "json_model_override_args", None) or "{}")
        for w in validate_draft(
                draft, target, num_draft_tokens=cfg.speculative_num_draft_tokens,
                trust_remote_code=bool(cfg.trust_remote_code),
                revision=cfg.speculative_draft_model_revision, model_override_args=override):
            logger.warning("sglang-dspark: %s", w)
    except DraftCheckpointError:
        _report_in_one_line()
        raise
