"""The numpy-only core of dspark_controller imports neither torch nor SGLang (nor ZeroMQ), and
the package's imports point one way: service, profiling and the simulator use the core,
never the reverse."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["core", "core.method", "core.strategies", "core.policy", "core.sps_model",
                                    "core.profile_file", "service.protocol"])
def test_core_module_imports_no_torch_no_sglang(module):
    code = (f"import sys, dspark_controller.{module}; "
            "bad = [m for m in ('torch', 'sglang', 'sglang_dspark', 'zmq', 'dspark_controller.service.server', "
            "'dspark_controller.profiling', 'dspark_controller.sim') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_core_imports_nothing_outside_it():
    """grep: no module of dspark_controller.core imports another subpackage or sglang_dspark."""
    import re
    from pathlib import Path

    core = Path(__file__).resolve().parents[2] / "controller" / "dspark_controller" / "core"
    bad = []
    for path in core.glob("*.py"):
        for m in re.finditer(r"^\s*(?:from|import)\s+([\w.]+)", path.read_text(), re.M):
            mod = m.group(1)
            if mod.startswith(("sglang", "torch", "zmq")) or (
                    mod.startswith("dspark_controller.") and not mod.startswith("dspark_controller.core")):
                bad.append(f"{path.name}: {mod}")
    assert not bad, bad
