"""Targeted patches that let SGLang 0.5.23's DSPARK path run on CPU.

Each patch is one small function with the SGLang symbol it targets listed in
:func:`seams` (resolved eagerly at start-up; a moved symbol fails loudly, naming
the SGLang version).  All of them are registered only when SGLang runs on CPU
(``SGLANG_USE_CPU_ENGINE=1``), so GPU runs are untouched.
"""

from __future__ import annotations

import logging

import torch

from sglang_dspark.seams import CPU_ATTENTION_BACKEND, Seam

logger = logging.getLogger(__name__)

_SPEC_HOOK = "sglang.srt.arg_groups.speculative_hook"
_PLATFORM_HOOK = "sglang.srt.arg_groups.platform_hook"


# 1. `_handle_dspark` refuses every device but CUDA/NPU/XPU (unlike DFLASH, it has
#    no out-of-tree escape).  On CPU we run it with a view reporting an accelerator
#    device for that one check; everything else it resolves is device-independent.
class _AcceleratorDeviceView:
    __slots__ = ("_view",)

    def __init__(self, view):
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        if name == "device":
            return "cuda"
        return getattr(object.__getattribute__(self, "_view"), name)


def handle_dspark_on_cpu(original, server_args):
    import importlib

    mod = importlib.import_module(_SPEC_HOOK)
    real_view = mod.resolving_view
    if real_view(server_args).device != "cpu":
        return original(server_args)
    mod.resolving_view = lambda sa: _AcceleratorDeviceView(real_view(sa))
    try:
        return original(server_args)
    finally:
        mod.resolving_view = real_view


# 2. CPU attention: SGLang downgrades `intel_amx` to `torch_native` (which cannot
#    verify speculative batches) when AMX weight packing is missing.  We register
#    SGLang's IntelAMXAttnBackend as `dspark_cpu` for target and draft and make it
#    the CPU default when the user did not pick a backend.
def choose_cpu_attention_backend(result, server_args):
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    if cfg.device != "cpu":
        return result
    decl = {}
    if cfg.attention_backend in (None, "intel_amx"):
        decl["attention_backend"] = CPU_ATTENTION_BACKEND
    if getattr(cfg, "speculative_draft_attention_backend", None) in (None, "intel_amx"):
        decl["speculative_draft_attention_backend"] = CPU_ATTENTION_BACKEND
    if cfg.max_total_tokens is None:    # SGLang would size the pool from free RAM (cpu/pool.py)
        from sglang_dspark.cpu.pool import default_cpu_pool_tokens

        tokens, how = default_cpu_pool_tokens(str(cfg.model_path), getattr(cfg, "kv_cache_dtype", None)
                                              if getattr(cfg, "kv_cache_dtype", "auto") != "auto"
                                              else getattr(cfg, "dtype", None))
        decl["max_total_tokens"] = tokens
        logger.info("sglang-dspark: --device cpu without --max-total-tokens: KV pool of %d tokens, "
                    "%s; pass --max-total-tokens to choose another size", tokens, how)
    if decl:
        declare_resolution(server_args, "sglang_dspark.cpu", **decl)
    return result


def register_backends() -> None:
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )

    if CPU_ATTENTION_BACKEND in ATTENTION_BACKENDS:
        return

    @register_attention_backend(CPU_ATTENTION_BACKEND)
    def _create(runner):
        from sglang_dspark.cpu.attention import DSparkCpuAttnBackend

        return DSparkCpuAttnBackend(runner)

    choices.add_attention_backend_choices([CPU_ATTENTION_BACKEND])
    choices.add_draft_attention_backend_choices([CPU_ATTENTION_BACKEND])
    _patch_record_stream()


# 3. DSpark's decode step calls `Tensor.record_stream` (a CUDA-stream notion) on
#    batch tensors; on CPU tensors it is meaningless and raises.  No-op it there.
def _patch_record_stream() -> None:
    original = torch.Tensor.record_stream
    if getattr(original, "__sglang_dspark__", False):
        return

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return original(self, stream)

    record_stream.__sglang_dspark__ = True
    torch.Tensor.record_stream = record_stream


# 4. Temperature > 0: DSpark's torch accept path still launches the Triton chain
#    rejection-sampling kernel; CPU tensors get the torch implementation.
def chain_sampling_on_cpu(original, *args, **kwargs):
    candidates = kwargs.get("candidates", args[3] if len(args) > 3 else None)
    if candidates is not None and candidates.device.type == "cpu":
        from sglang_dspark.cpu.rejection import chain_speculative_sampling_torch

        return chain_speculative_sampling_torch(*args, **kwargs)
    return original(*args, **kwargs)


# 5. bf16 only: the draft's fused context-KV write bundle is a Triton kernel; on
#    CPU return no bundle so SGLang takes its per-layer torch path.
def no_fused_kv_bundle_on_cpu(original, self, pool):
    if _first_param_device(self) == "cpu":
        return None
    return original(self, pool)


# 6. bf16 only: DFlash draft attention's fused table qk-norm-rope is Triton-only;
#    on CPU the draft attention uses SGLang's unfused norm + rope path.
def no_table_qk_norm_rope_on_cpu(result, self, *args, **kwargs):
    self.use_table_qk_norm_rope = False
    return result


def _first_param_device(module) -> str:
    for p in module.parameters():
        return p.device.type
    return "cpu"


def seams() -> list[Seam]:
    return [
        Seam(f"{_SPEC_HOOK}._handle_dspark", "around",
             "DSPARK argument handling rejects device=cpu", True, handle_dspark_on_cpu),
        Seam(f"{_SPEC_HOOK}.resolving_view", "requires",
             "swapped for one call by handle_dspark_on_cpu", True),
        Seam(f"{_PLATFORM_HOOK}.handle_cpu_backends", "after",
             "pick the dspark_cpu attention backend for target and draft, and a bounded KV "
             "pool when --max-total-tokens is unset (cpu/pool.py)", True,
             choose_cpu_attention_backend),
        Seam("sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend"
             "._build_extend_metadata", "requires",
             "subclassed as dspark_cpu: chain + ragged verify extend metadata", True),
        Seam("sglang.srt.arg_groups.choices.add_attention_backend_choices", "requires",
             "dspark_cpu becomes a valid --attention-backend", True),
        Seam("sglang.srt.arg_groups.choices.add_draft_attention_backend_choices", "requires",
             "dspark_cpu becomes a valid draft attention backend", True),
        Seam("sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton",
             "around", "torch chain rejection sampling for CPU tensors (temperature > 0)",
             True, chain_sampling_on_cpu),
        Seam("sglang.srt.models.dspark.DSparkDraftMixin._build_fused_kv_write_bundle",
             "around", "bf16: fused Triton KV write unavailable on CPU", True,
             no_fused_kv_bundle_on_cpu),
        Seam("sglang.srt.models.dflash.DFlashAttention.__init__", "after",
             "bf16: Triton table qk-norm-rope unavailable on CPU", True,
             no_table_qk_norm_rope_on_cpu),
    ]
