"""Early CPU bootstrap, run through SGLang's platform-plugin seam.

The entry point is shipped by its own distribution (``packaging/cpu-boot``), never by
``sglang-dspark``: SGLang skips every plugin of a distribution that ships an unselected
platform entry point, which would take our general plugin down with it.

SGLang resolves its platform (entry-point group ``sglang.srt.platforms``) in every
process before any module does ``from sgl_kernel import ..._cpu``.  When the
process is meant to run on CPU, :func:`activate` makes SGLang's CPU engine usable
on a stock PyPI install and then returns ``None``, so SGLang's own
``CpuSRTPlatform`` stays in charge:

* sets ``SGLANG_USE_CPU_ENGINE=1`` (child processes inherit it), and
* provides ``sgl_kernel``'s CPU ops from :mod:`sglang_dspark.cpu.ops` when the
  installed ``sgl_kernel`` cannot provide them (the PyPI wheel is CUDA-only).

CPU intent = ``SGLANG_USE_CPU_ENGINE=1`` already set, or ``--device cpu`` on the
command line.  ``SGLANG_DSPARK_CPU=0`` disables all of this.  On GPU runs nothing
here happens.
"""

from __future__ import annotations

import logging
import os
import sys
import types

logger = logging.getLogger(__name__)
_installed = False


def cpu_intended(argv: list[str] | None = None) -> bool:
    from sglang_dspark.settings import check_environment

    if not check_environment().cpu:   # the platform seam runs first: validate here too
        return False
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        return True
    argv = sys.argv if argv is None else argv
    for i, a in enumerate(argv):
        if a == "--device" and i + 1 < len(argv) and argv[i + 1] == "cpu":
            return True
        if a == "--device=cpu":
            return True
    return False


ENTRY_POINT = "dspark_cpu_boot"   # our name in sglang.srt.platforms (packaging/cpu-boot)
CPU_PLATFORM = "sglang.srt.platforms.cpu.CpuSRTPlatform"


def activate():
    """Platform-plugin entry point (distribution sglang-dspark-cpu-boot).

    Returns None, so SGLang picks the platform itself (its CPU fallback under
    ``SGLANG_USE_CPU_ENGINE=1``), except when ``SGLANG_PLATFORM`` names this entry point:
    then SGLang requires a platform class, and on a CPU run that is SGLang's own
    ``CpuSRTPlatform``.  Logs a warning when SGLang is going to skip our general plugin
    (:func:`sglang_dspark.plugin.skip_reason`).
    """
    from sglang_dspark.plugin import skip_reason

    reason = skip_reason()
    if reason:
        logger.warning("sglang-dspark: %s", reason)
    if not cpu_intended():
        return None
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    install_sgl_kernel_cpu_ops()
    return CPU_PLATFORM if os.environ.get("SGLANG_PLATFORM") == ENTRY_POINT else None


def _real_sgl_kernel_has_cpu_ops() -> types.ModuleType | None:
    try:
        import sgl_kernel  # noqa: F401
        import torch

        if hasattr(torch.ops.sgl_kernel, "decode_attention_cpu"):
            return sgl_kernel
    except Exception:  # the CUDA-only wheel raises on a machine without libcuda
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            sys.modules.pop(name, None)
    return None


def install_sgl_kernel_cpu_ops() -> None:
    """Make ``import sgl_kernel`` and ``torch.ops.sgl_kernel.*_cpu`` work on CPU."""
    global _installed
    if _installed:
        return
    _installed = True
    if _real_sgl_kernel_has_cpu_ops() is not None:
        logger.info("sgl_kernel provides CPU ops; sglang-dspark stand-ins not installed.")
        return
    from sglang_dspark.cpu import ops

    mod = types.ModuleType("sgl_kernel")
    mod.__doc__ = "sglang-dspark pure-torch stand-in for sgl_kernel's CPU ops."
    mod.__dict__.update(ops.MODULE_OPS)
    mod.__sglang_dspark_standin__ = True

    def __getattr__(name: str):
        if name.endswith("_cpu"):
            return ops.make_unsupported(name)
        raise AttributeError(f"sgl_kernel stand-in has no attribute {name!r}")

    mod.__getattr__ = __getattr__
    sys.modules["sgl_kernel"] = mod
    _register_torch_ops(ops.TORCH_OPS)
    logger.info("sglang-dspark: installed pure-torch sgl_kernel CPU ops.")


def _register_torch_ops(table: dict) -> None:
    import torch

    ns = torch.ops.sgl_kernel
    for name, fn in table.items():
        # torch.ops.sgl_kernel.<name> lookups resolve to our callable.
        setattr(ns, name, fn)
