"""Lower the kernel to an sm_90 cubin without a GPU (catches GPU-only compile errors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _ptxas_available() -> bool:
    import triton

    return (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not _ptxas_available(), reason="triton's bundled ptxas is missing")
def test_kernel_compiles_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO / "kernels") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_kernels.gpu_compile_check", "--json"],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = {k: v["error"] for k, v in report.items() if "error" in v}
    assert not errors, errors
    assert proc.returncode == 0
    for label, entry in report.items():
        assert entry["spill_store_bytes"] == 0, (label, entry)
        assert entry["uses_barrier"] == ("persistent" in label), (label, entry)
