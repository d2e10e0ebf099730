import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "engine_job.py"


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """Sharp tiny pair: greedy margins far above bf16 rounding."""
    from sglang_dspark.tiny_models import TinySpec, build_pair

    out = tmp_path_factory.mktemp("tiny")
    manifest = build_pair(out, TinySpec(seed=0))
    return {"target": str(out / "target"), "draft": str(out / "draft"), "manifest": manifest}


@pytest.fixture(scope="session")
def sps_table(tmp_path_factory):
    """A steep SGLang SpsCostTable: every extra verify token costs, so budgets fall."""
    p = tmp_path_factory.mktemp("sps") / "table.json"
    bt = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    p.write_text(json.dumps({"sample_batch_tokens": bt,
                             "sample_steps_per_sec": [400.0 / b for b in bt],
                             "max_batch_tokens": 256}))
    return str(p)


def run_engine_job(job: dict, tmp_path: Path, timeout: int = 600) -> dict:
    """Run one engine config in a fresh process (tests/engine_job.py)."""
    jf, of = tmp_path / "job.json", tmp_path / "out.json"
    jf.write_text(json.dumps(job))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
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
