"""The numpy-only core of dspark_controller imports neither torch nor SGLang (nor ZeroMQ)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["planner", "sps_model", "profile_file", "protocol"])
def test_core_module_imports_no_torch_no_sglang(module):
    code = (f"import sys, dspark_controller.{module}; "
            "bad = [m for m in ('torch', 'sglang', 'sglang_dspark', 'zmq') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
