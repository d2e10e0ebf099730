"""StepCapture's line format, and its deferred (background-writer) path on CPU tensors.

On CUDA the capture copies a step's tensors without blocking and a writer thread
writes the line once the copies are done; here the same queue/thread path runs with
CPU tensors (``deferred=True``) and must write exactly what the inline path writes,
even when the step's buffers are overwritten right after the step (as graph-static
buffers are). The device copy itself is checked by benchmarks/gpu_kernel_bench.py on
a GPU.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import torch

from sglang_dspark.capture import StepCapture

GAMMA = 4


def _step(i: int, bs: int = 3, pad: int = 2) -> dict:
    """Observer kwargs of one step, with padded (graph-sized) buffers like SGLang's."""
    g = torch.Generator().manual_seed(i)
    n = bs + pad
    raw = torch.randn(n, GAMMA, generator=g).to(torch.bfloat16)
    return {
        "bs": bs,
        "confidence_raw": raw,
        "confidence": torch.sigmoid(raw.float()),
        "correct_len": torch.randint(0, GAMMA + 1, (n,), generator=g),
        "layout": SimpleNamespace(verify_lens=torch.randint(1, GAMMA + 2, (n,), generator=g)),
        "sampling_info": SimpleNamespace(temperatures=torch.rand(n, 1, generator=g)),
        "reqs": [SimpleNamespace(rid=f"r{i}-{j}") for j in range(n)],
    }


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_inline_line_format(tmp_path):
    cap = StepCapture(str(tmp_path / "c.jsonl"), gamma=GAMMA)
    kw = _step(0)
    cap.observe(kw)
    (rec,) = _lines(tmp_path / "c.jsonl")  # written in the step: CPU tensors
    assert cap._writer is None
    verified = [max(int(v) - 1, 0) for v in kw["layout"].verify_lens[:3]]
    assert rec["step"] == 0 and rec["gamma"] == GAMMA
    assert rec["rids"] == ["r0-0", "r0-1", "r0-2"]
    assert rec["verified"] == verified
    assert rec["accepted"] == [min(int(a), v) for a, v in zip(kw["correct_len"][:3], verified)]
    assert rec["conf_raw"] == kw["confidence_raw"][:3].float().tolist()
    assert rec["conf"] == kw["confidence"][:3].tolist()
    assert rec["temps"] == [float(x) for x in kw["sampling_info"].temperatures.reshape(-1)[:3]]
    # a layout with SGLang's host copy of its lengths: that list is used (nothing to copy)
    kw["layout"].verify_lens_cpu = [2, 1, 5, 5, 5]
    kw["layout"].verify_lens = None
    cap.observe(kw)
    rec = _lines(tmp_path / "c.jsonl")[-1]
    assert rec["step"] == 1 and rec["verified"] == [1, 0, 4]
    cap.close()


def test_deferred_writes_what_inline_writes_even_if_buffers_are_reused(tmp_path):
    inline = StepCapture(str(tmp_path / "inline.jsonl"), gamma=GAMMA, deferred=False)
    deferred = StepCapture(str(tmp_path / "deferred.jsonl"), gamma=GAMMA, deferred=True)
    for i in range(20):
        kw = _step(i, bs=1 + i % 4)
        inline.observe(kw)
        deferred.observe(kw)
        for t in (kw["confidence_raw"], kw["confidence"], kw["correct_len"], kw["layout"].verify_lens):
            t.zero_()  # the next step overwrites the static buffers
    deferred.flush()
    assert isinstance(deferred._writer, threading.Thread) and deferred._writer.is_alive()
    want = _lines(tmp_path / "inline.jsonl")
    assert len(want) == 20 and [r["step"] for r in want] == list(range(20))
    assert _lines(tmp_path / "deferred.jsonl") == want
    assert deferred.errors == 0 and deferred.enabled
    deferred.close()
    assert not (deferred._writer and deferred._writer.is_alive())
    inline.close()


def test_deferred_stops_at_max_rows_with_every_line_written(tmp_path):
    cap = StepCapture(str(tmp_path / "c.jsonl"), gamma=GAMMA, max_rows=7, deferred=True)
    for i in range(6):
        cap.observe(_step(i, bs=3))
    assert not cap.enabled and cap.rows == 9  # stopped after the third step (9 >= 7)
    assert cap._writer is None and cap._fh is None  # closed: writer joined, file closed
    assert [r["step"] for r in _lines(tmp_path / "c.jsonl")] == [0, 1, 2]


def test_a_failing_step_turns_capture_off(tmp_path):
    cap = StepCapture(str(tmp_path / "c.jsonl"), gamma=GAMMA, deferred=True)
    bad = _step(0)
    bad["correct_len"] = torch.zeros(5, dtype=torch.complex64)  # int(complex) fails in the writer
    cap.observe(bad)
    cap.flush()
    assert cap.errors == 1 and not cap.enabled
    cap.observe(_step(1))  # ignored from now on
    cap.close()
    assert not (tmp_path / "c.jsonl").exists() or _lines(tmp_path / "c.jsonl") == []
