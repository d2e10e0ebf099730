"""Shared helpers for the test suite (importable as ``dspark_testlib``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "engine_job.py"


def run_engine_job(job: dict, tmp_path: Path, timeout: int = 600) -> dict:
    """Run one engine config in a fresh process (tests/engine_job.py)."""
    jf, of = tmp_path / "job.json", tmp_path / "out.json"
    jf.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)  # engines must run SGLang's real code paths
    proc = subprocess.run([sys.executable, str(JOB), str(jf), str(of)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"engine job failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(of.read_text())


def engine_kwargs(pair: dict, **over) -> dict:
    kw = dict(model_path=pair["target"], device="cpu", mem_fraction_static=0.3,
              max_total_tokens=8192, disable_overlap_schedule=True, log_level="warning",
              max_running_requests=16, random_seed=0)
    kw.update(over)
    return kw


# greedy-equality prompts: different lengths and shapes, so requests finish at different steps
GREEDY_PROMPTS = [
    "def f(x):",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import os\nimport sys\n" * 6,
    "x",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
]
