"""Compile the fused kernel for an NVIDIA target on a machine without a GPU.

``python -m dspark_kernels.gpu_compile_check [--arch 90] [--json]`` plans real GPU
launches (``sm_count`` of an H200), lowers every listed variant through Triton to
a cubin with the bundled ``ptxas`` and reports registers and spills. It catches
GPU-only compile errors (the persistent barrier, native 16-bit ``tl.dot``) that the
Triton interpreter cannot see. Must run WITHOUT ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# (label, batch, gamma, vocab, dtype, greedy, launch_mode)
DEFAULT_VARIANTS = [
    ("b1-sample-persistent", 1, 7, 32000, torch.bfloat16, False, "persistent"),
    ("b1-greedy-persistent", 1, 7, 32000, torch.bfloat16, True, "persistent"),
    ("b64-sample-stepwise", 64, 7, 32000, torch.bfloat16, False, "stepwise"),
    ("b256-sample-persistent", 256, 7, 32000, torch.bfloat16, False, "persistent"),
    ("b256-greedy-stepwise", 256, 7, 32000, torch.bfloat16, True, "stepwise"),
    ("b16-sample-fp32-persistent", 16, 4, 32000, torch.float32, False, "persistent"),
    ("b16-greedy-fp16-stepwise", 16, 4, 32000, torch.float16, True, "stepwise"),
]

_PTR_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
              torch.int64: "i64", torch.int32: "i32"}  # fmt: skip


def _ptxas() -> Path | None:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.exists() else None


def _inputs(batch, gamma, vocab, dtype, greedy, rank=256, hidden=64):
    from dspark_kernels.contract import validate_inputs

    # Shapes only matter through strides and dtypes: keep the tensors tiny where possible.
    return validate_inputs(
        base_logits=torch.empty((batch, gamma, vocab), dtype=dtype),
        anchor_tokens=torch.zeros(batch, dtype=torch.int64),
        w1=torch.empty((vocab, rank), dtype=dtype),
        w2=torch.empty((vocab, rank), dtype=dtype),
        temperatures=torch.ones(batch),
        seed=0x2D2A9C317E44B1F3,
        offset=torch.zeros(1, dtype=torch.int64),
        greedy=greedy,
        logits_out=None if greedy else torch.empty((batch, gamma, vocab), dtype=dtype),
        hidden=torch.empty((batch, gamma, hidden), dtype=dtype),
        conf_weight=torch.empty(hidden + rank),
        conf_bias=torch.empty(1),
        conf_with_markov=True,
        sts_temperatures=torch.ones(gamma),
        compute_draft_probs=True,
    )


def compile_variant(*, batch, gamma, vocab, dtype, greedy, launch_mode, arch=90, sm_count=132):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dspark_kernels import triton_seq_head as tsh

    if tsh._is_interpreter():
        raise RuntimeError("gpu_compile_check must run without TRITON_INTERPRET=1")
    inputs = _inputs(batch, gamma, vocab, dtype, greedy)
    plan = tsh.plan_launch(
        batch=batch, vocab=vocab, rank=inputs.rank, device=torch.device("cpu"),
        launch_mode=launch_mode, sm_count=sm_count, interpret=False,
    )  # fmt: skip
    launch = tsh.build_launch(inputs, plan)
    meta = dict(launch.meta)
    num_warps = meta.pop("num_warps")
    signature = {}
    for name, value in zip(tsh._ARG_NAMES, launch.kernel_args(0, gamma)):
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + _PTR_NAMES[value.dtype]
        else:
            signature[name] = "i64" if name == "SEED" else "i32"
    for name in meta:
        signature[name] = "constexpr"
    kernel = triton.runtime.jit.JITFunction(tsh._seq_head_kernel.fn)
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs=meta),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": num_warps},
    )
    report = {"plan": repr(plan), "shared": compiled.metadata.shared}
    ptxas = _ptxas()
    if ptxas is not None:
        with tempfile.TemporaryDirectory() as tmp:
            ptx = Path(tmp) / "k.ptx"
            ptx.write_text(compiled.asm["ptx"])
            out = subprocess.run(
                [str(ptxas), "-v", f"-arch=sm_{arch}a", str(ptx), "-o", str(Path(tmp) / "k.cubin")],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
        regs = re.search(r"Used (\d+) registers", out.stderr)
        spills = re.search(r"(\d+) bytes spill stores", out.stderr)
        report["registers"] = int(regs.group(1)) if regs else None
        report["spill_store_bytes"] = int(spills.group(1)) if spills else 0
    report["uses_barrier"] = "atom.global" in compiled.asm["ptx"]
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET first", file=sys.stderr)
        return 2
    results = {}
    for label, batch, gamma, vocab, dtype, greedy, mode in DEFAULT_VARIANTS:
        try:
            results[label] = compile_variant(
                batch=batch, gamma=gamma, vocab=vocab, dtype=dtype, greedy=greedy,
                launch_mode=mode, arch=args.arch,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            results[label] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        if not args.json:
            print(label, results[label], flush=True)
    if args.json:
        print(json.dumps(results))
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
