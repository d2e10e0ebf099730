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


def seams() -> list[Seam]:
    return [
        Seam(f"{_SPEC_HOOK}._handle_dspark", "around",
             "DSPARK argument handling rejects device=cpu", True, handle_dspark_on_cpu),
        Seam(f"{_SPEC_HOOK}.resolving_view", "requires",
             "swapped for one call by handle_dspark_on_cpu", True),
        Seam(f"{_PLATFORM_HOOK}.handle_cpu_backends", "after",
             "pick the dspark_cpu attention backend for target and draft", True,
             choose_cpu_attention_backend),
        Seam("sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend"
             "._build_extend_metadata", "requires",
             "subclassed as dspark_cpu: chain + ragged verify extend metadata", True),
        Seam("sglang.srt.arg_groups.choices.add_attention_backend_choices", "requires",
             "dspark_cpu becomes a valid --attention-backend", True),
        Seam("sglang.srt.arg_groups.choices.add_draft_attention_backend_choices", "requires",
             "dspark_cpu becomes a valid draft attention backend", True),
    ]
