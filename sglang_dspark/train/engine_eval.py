"""Measure accepted length through the real SGLang engine (greedy), in a subprocess.

``python -m sglang_dspark.train.engine_eval JOB.json OUT.json`` where JOB holds
``{"target", "draft", "input_ids": [[...]], "max_new_tokens", "env": {...}}``.
SGLang reports per request ``spec_verify_ct`` and ``completion_tokens``; tau is
``sum(completion_tokens) / sum(spec_verify_ct)`` (bonus token included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def engine_kwargs(target: str, draft: str | None, dtype: str = "float32") -> dict:
    kw = dict(model_path=target, device="cpu", mem_fraction_static=0.3, max_total_tokens=8192,
              disable_overlap_schedule=True, log_level="warning", max_running_requests=16,
              random_seed=0, dtype=dtype, skip_tokenizer_init=False)
    if draft:
        kw.update(speculative_algorithm="DSPARK", speculative_draft_model_path=draft)
    return kw


def run_engine(target: str, draft: str | None, input_ids: list[list[int]], max_new_tokens: int,
               workdir: Path, mode: str = "static", timeout: int = 900) -> dict:
    """Start one engine in a fresh process; return per-request results and tau."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tag = "base" if draft is None else Path(draft).name
    jf, of = workdir / f"job-{tag}.json", workdir / f"out-{tag}.json"
    jf.write_text(json.dumps({"engine": engine_kwargs(target, draft), "input_ids": input_ids,
                              "max_new_tokens": max_new_tokens,
                              "env": {"SGLANG_RAGGED_VERIFY_MODE": mode}}))
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "sglang_dspark.train.engine_eval", str(jf), str(of)],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"SGLang engine run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(of.read_text())
    metas = [r["meta_info"] for r in res["results"]]
    if draft is not None:
        tok = sum(m["completion_tokens"] for m in metas)
        ver = sum(m.get("spec_verify_ct") or 0 for m in metas)
        res["tau"] = tok / ver if ver else None
    return res


def _main(job_path: str, out_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    os.environ.update({k: str(v) for k, v in job.get("env", {}).items()})
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    import sglang as sgl

    engine = sgl.Engine(**job["engine"])
    try:
        sampling = {"temperature": 0.0, "max_new_tokens": int(job["max_new_tokens"]),
                    "ignore_eos": True}
        outs = engine.generate(input_ids=job["input_ids"], sampling_params=sampling)
        results = [{"output_ids": o.get("output_ids"),
                    "meta_info": {k: v for k, v in o["meta_info"].items()
                                  if isinstance(v, (int, float, str, type(None)))}}
                   for o in outs]
    finally:
        engine.shutdown()
    Path(out_path).write_text(json.dumps({"results": results}, default=str))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
