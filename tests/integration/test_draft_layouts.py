"""Every published draft layout is served by the real SGLang engine on CPU with
greedy output equal to the non-speculative engine's, and with the same verify
rounds as the flat layout.  The layouts are rewritten from the committed trained
pair (models/tiny-stdlib), whose draft backbone matters: a tensor SGLang failed to
load, e.g. an unaliased ``encoder.fc.weight``, would stay random and (measured with
the training-side simulator) roughly double the verify rounds.  (The sharp
``tiny_pair`` draft would not show it: its backbone adds no logits.)  A draft path
that does not exist stops ``launch_server`` with one line.
One engine per served layout, plus one non-speculative engine."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_testlib import engine_kwargs, run_engine_job
from draft_layouts import LAYOUTS, make_layout
from sglang_dspark.checkpoint import validate_draft

PAIR = Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib"

PROMPTS = ["def f(x):", "import os\nimport sys\n" * 4, "x",
           "class Point:\n    def __init__(self, x, y):\n"]
MAX_NEW = [30, 21, 14, 25]
SAMPLING = [{"temperature": 0.0, "max_new_tokens": n} for n in MAX_NEW]

_cache: dict = {}


def _run(tmp_path_factory, draft=None):
    key = str(draft)
    if key not in _cache:
        kw = engine_kwargs({"target": str(PAIR / "target")}, dtype="float32")
        if draft:
            kw.update(speculative_algorithm="DSPARK", speculative_draft_model_path=str(draft))
        job = {"engine": kw, "server_info": bool(draft),
               "batches": [{"prompts": PROMPTS, "sampling": SAMPLING}]}
        _cache[key] = run_engine_job(job, tmp_path_factory.mktemp("job"))
    return _cache[key]


def _ids(res):
    return [o["output_ids"] for o in res["results"][0]]


def _verify_cts(res):
    return [o["meta_info"]["spec_verify_ct"] for o in res["results"][0]]


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    return {name: make_layout(PAIR / "draft", root / name, name) for name in LAYOUTS}


# ``encoder`` is the ``nested`` config plus the vendor tensor names (what published drafts
# ship), so serving it serves the nested config too; ``dspark`` renames config keys only
# (its tensors are the flat layout's), and every layout, ``nested`` and ``dspark``
# included, is parsed by SGLang's own parsers in tests/unit/test_checkpoint_layouts.py
# (CI time: each layout served here is an engine start)
SERVED = ("flat", "encoder")


@pytest.mark.parametrize("layout", SERVED)
def test_layout_served_lossless(layout, drafts, tmp_path_factory):
    assert validate_draft(drafts[layout], PAIR / "target") == []
    base = _run(tmp_path_factory)
    spec = _run(tmp_path_factory, drafts[layout])
    assert _ids(spec) == _ids(base)
    info = spec["server_info"]
    # gamma 8 came from the layout's block size (SGLang's default would be 7)
    assert info["speculative_num_draft_tokens"] == 9, info["speculative_num_draft_tokens"]
    flat = _run(tmp_path_factory, drafts["flat"])
    verify, tokens = _verify_cts(spec), sum(len(x) for x in _ids(spec))
    assert 0 < sum(verify) < tokens  # drafts were accepted
    assert verify == _verify_cts(flat)  # every tensor loaded as in the flat layout


def test_missing_draft_path_stops_launch_in_one_line(tmp_path):
    missing = tmp_path / "no-such-draft"
    env = {k: v for k, v in os.environ.items()
           if k not in ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET")}
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", str(PAIR / "target"),
         "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(missing),
         "--device", "cpu", "--port", "1"],
        capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [ln for ln in out.splitlines() if "does not exist" in ln]
    assert lines == [f"sglang-dspark: error: DSpark draft path {missing} does not exist (and is "
                     "not a Hugging Face repo id): pass an existing draft checkpoint directory "
                     "to --speculative-draft-model-path."], out[-3000:]
    assert "Traceback" not in out and "Repo id" not in out, out[-3000:]
