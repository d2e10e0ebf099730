"""Shared helpers for the test suite (importable as ``dspark_testlib``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "engine_job.py"
# variables the suite's engine jobs may set that a user's shell does not
TEST_ONLY_ENV = ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", "SGLANG_RAGGED_VERIFY_MODE")


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_under_test", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_greedy(target: str, prompt: str, n: int, *, ignore_eos: bool = False) -> list[int]:
    """The target's greedy continuation of ``prompt`` (``n`` tokens, fewer at its EOS unless
    ``ignore_eos``, which decodes on past it as SGLang's ``ignore_eos`` does) by HF
    transformers: an engine-independent reference for lossless checks."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt").input_ids
    if not ignore_eos:
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
        return out[0, ids.shape[1]:].tolist()
    tokens, past, x = [], None, ids
    with torch.no_grad():
        for _ in range(n):
            step = model(input_ids=x, past_key_values=past, use_cache=True)
            past = step.past_key_values
            tokens.append(int(step.logits[0, -1].argmax()))
            x = torch.tensor([[tokens[-1]]])
    return tokens


def user_env() -> dict:
    """This process's environment without :data:`TEST_ONLY_ENV`: what a user's command sees."""
    return {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}


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


# Every prompt a test compares with the target alone (no speculation).  Their greedy
# outputs come from one engine run per (target, dtype) in the whole test session
# (nospec_ids): each engine start costs tens of seconds on a 2-core CI machine.
BASELINE_PROMPTS = GREEDY_PROMPTS + [
    "for i in range(10):\n",
    "import os\nimport sys\n" * 4,
    "class Point:\n    def __init__(self):\n",
    "def g(y):",
]
BASELINE_NEW = 48
_BASELINES: dict = {}


def nospec_ids(pair: dict, prompts: list, max_new: list, tmp_path_factory, dtype: str = "float32") -> list:
    """The target's own greedy output ids for each prompt, ``max_new[i]`` tokens at most.

    A greedy continuation of n tokens is the first n of a longer one, so one run of
    :data:`BASELINE_PROMPTS` with :data:`BASELINE_NEW` tokens serves every caller."""
    missing = [p for p in prompts if p not in BASELINE_PROMPTS]
    assert not missing, f"add {missing!r} to dspark_testlib.BASELINE_PROMPTS"
    assert max(max_new) <= BASELINE_NEW, f"raise dspark_testlib.BASELINE_NEW to {max(max_new)}"
    key = (pair["target"], dtype)
    if key not in _BASELINES:
        job = {"engine": engine_kwargs(pair, dtype=dtype),
               "batches": [{"prompts": BASELINE_PROMPTS,
                            "sampling": {"temperature": 0.0, "max_new_tokens": BASELINE_NEW}}]}
        res = run_engine_job(job, tmp_path_factory.mktemp("nospec"))
        _BASELINES[key] = {p: o["output_ids"] for p, o in zip(BASELINE_PROMPTS, res["results"][0])}
    return [_BASELINES[key][p][:n] for p, n in zip(prompts, max_new)]
