"""Rollouts through the real SGLang engine, with per-step capture (:mod:`sglang_dspark.capture`).

One engine per call of :func:`run_rollouts`; every prompt set / temperature in the
call runs on it (``Engine.generate`` per turn), each request with a known ``rid`` so
captured verify rounds map back to their request.  Multi-turn prompts follow
DeepSpec / MT-Bench: turn ``i`` is asked with the model's own earlier answers in the
conversation.  The tokenizer's chat template is applied to every conversation.

CPU (no CUDA, or ``device="cpu"``): ``SGLANG_USE_CPU_ENGINE=1`` is set before SGLang
is imported, plus the settings the CPU path needs (small static memory, no overlap
schedule).  On a GPU SGLang's defaults are used unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from sglang_dspark.capture import ENV_PATH as CAPTURE_ENV
from sglang_dspark.evaluate.prompts import PromptRecord

logger = logging.getLogger(__name__)

# verify-all: SGLang's cap-accept mode with no SPS table and our online planner off, so
# every draft token is verified AND the confidence head runs (SGLang builds none in
# static mode).  The others are SGLang's modes as served.
VERIFY_MODES = ("verify-all", "static", "cap-accept", "compact")


class RolloutError(RuntimeError):
    pass


@dataclass
class EngineConfig:
    target: str
    draft: str
    device: str = "auto"            # auto | cpu | cuda
    dtype: str = "auto"
    block_size: Optional[int] = None  # gamma; default: the draft's config
    verify_mode: str = "verify-all"  # see VERIFY_MODES
    sts_path: Optional[str] = None  # --speculative-dspark-confidence-sts-path
    max_running_requests: int = 16
    max_total_tokens: Optional[int] = None
    seed: int = 0
    chat_template: bool = True
    extra_env: dict = field(default_factory=dict)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        try:
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:
            return "cpu"


@dataclass
class PromptJob:
    label: str                      # unique, used in rids: f"{label}-p{i}-t{turn}"
    prompts: list[PromptRecord]
    temperature: float
    max_new_tokens: int
    ignore_eos: bool = False
    max_turns: Optional[int] = None


@dataclass
class JobResult:
    label: str
    temperature: float
    requests: list[dict]            # {"rid", "prompt", "turn", "meta"}
    rounds: list[dict]              # captured verify rounds of this job's requests


def validate_model_dirs(target: str, draft: str) -> None:
    for name, d in (("--target", target), ("--draft", draft)):
        p = Path(d)
        if not p.is_dir():
            raise RolloutError(f"{name} {d} is not a directory; pass a HuggingFace-format "
                               "model directory (config.json + safetensors)")
        if not (p / "config.json").is_file():
            raise RolloutError(f"{name} {d} has no config.json; is it a model directory?")
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text())
    except ValueError as e:
        raise RolloutError(f"--draft {draft}/config.json is not valid JSON: {e}") from None
    if "Qwen3DSparkModel" not in (cfg.get("architectures") or []):
        raise RolloutError(f"--draft {draft} is not a DSpark draft (config architectures "
                           f"{cfg.get('architectures')}, expected ['Qwen3DSparkModel'])")


def validate_pair(target: str, draft: str) -> None:
    """The checks SGLang's start-up runs on a draft through our plugin
    (:func:`sglang_dspark.checkpoint.validate_draft`: hidden size, vocabulary, tensors,
    ``target_layer_ids``), here before any engine starts; a pair that fails them would
    otherwise end inside the engine with a traceback. Reads configs and safetensors
    headers only (it imports SGLang's config code)."""
    validate_model_dirs(target, draft)
    from sglang_dspark.checkpoint import DraftCheckpointError, validate_draft

    try:
        validate_draft(draft, target)
    except DraftCheckpointError as e:
        raise RolloutError(f"{e} Pass the draft trained for this target (--draft) or its "
                           "target (--target).") from None


def draft_gamma(draft: str, block_size: Optional[int]) -> int:
    if block_size:
        return int(block_size)
    cfg = json.loads((Path(draft) / "config.json").read_text())
    g = cfg.get("block_size") or (cfg.get("dflash_config") or {}).get("block_size")
    if not g:
        raise RolloutError(f"--draft {draft} config has no block_size; pass --block-size")
    return int(g)


def engine_kwargs(cfg: EngineConfig) -> dict:
    kw = dict(model_path=cfg.target, speculative_algorithm="DSPARK",
              speculative_draft_model_path=cfg.draft, random_seed=cfg.seed,
              max_running_requests=cfg.max_running_requests, log_level="warning",
              dtype=cfg.dtype)
    if cfg.block_size:
        kw["speculative_dspark_block_size"] = int(cfg.block_size)
    if cfg.sts_path:
        kw["speculative_dspark_confidence_sts_path"] = str(cfg.sts_path)
    if cfg.resolved_device() == "cpu":
        kw.update(device="cpu", mem_fraction_static=0.3, disable_overlap_schedule=True,
                  max_total_tokens=cfg.max_total_tokens or 8192)
    elif cfg.max_total_tokens:
        kw["max_total_tokens"] = cfg.max_total_tokens
    return kw


def _conversation_text(tokenizer, messages: list[dict], use_template: bool) -> str:
    if use_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages)


def read_capture(path: str | Path) -> list[dict]:
    """Flatten a capture file into one dict per (step, request) verify round."""
    rounds = []
    p = Path(path)
    if not p.is_file():
        return rounds
    with p.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            temps = rec.get("temps") or [None] * len(rec["rids"])
            conf = rec.get("conf") or [None] * len(rec["rids"])
            raw = rec.get("conf_raw") or [None] * len(rec["rids"])
            for i, rid in enumerate(rec["rids"]):
                rounds.append({"step": rec["step"], "rid": rid, "gamma": rec["gamma"],
                               "temp": temps[i], "conf_raw": raw[i],
                               "conf": conf[i], "accepted": rec["accepted"][i],
                               "verified": rec["verified"][i]})
    return rounds


def run_rollouts(cfg: EngineConfig, jobs: list[PromptJob], work_dir: str | Path) -> list[JobResult]:
    """Start one SGLang engine (DSPARK, our worker, capture on), run every job, shut down."""
    validate_pair(cfg.target, cfg.draft)
    labels = [j.label for j in jobs]
    if len(set(labels)) != len(labels):
        raise RolloutError(f"job labels must be unique, got {labels}")
    if cfg.verify_mode not in VERIFY_MODES:
        raise RolloutError(f"verify mode {cfg.verify_mode!r} not in {VERIFY_MODES}")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    capture = work / "capture.jsonl"
    if capture.exists():
        capture.unlink()
    env = {CAPTURE_ENV: str(capture.resolve())}
    if cfg.verify_mode == "verify-all":
        env.update(SGLANG_RAGGED_VERIFY_MODE="cap-accept", SGLANG_DSPARK_ONLINE="0")
    else:
        env["SGLANG_RAGGED_VERIFY_MODE"] = cfg.verify_mode
    env.update({k: str(v) for k, v in cfg.extra_env.items()})
    if cfg.resolved_device() == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.target)
        if cfg.chat_template and not getattr(tokenizer, "chat_template", None):
            raise RolloutError(f"the tokenizer of {cfg.target} has no chat template; pass "
                               "--no-chat-template to join turns as plain text")
        import sglang as sgl

        engine = sgl.Engine(**engine_kwargs(cfg))
        results = []
        try:
            for job in jobs:
                results.append(_run_job(engine, tokenizer, job, cfg.chat_template))
        finally:
            engine.shutdown()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    rounds = read_capture(capture)
    if not rounds:
        raise RolloutError(f"no verify rounds were captured in {capture}: is the sglang-dspark "
                           "plugin installed (pip install -e .) so SGLang runs our worker, and "
                           "does the draft have a confidence head?")
    by_rid: dict[str, list[dict]] = {}
    for r in rounds:
        by_rid.setdefault(r["rid"], []).append(r)
    for res in results:
        res.rounds = [r for q in res.requests for r in by_rid.get(q["rid"], [])]
    return results


def _run_job(engine, tokenizer, job: PromptJob, use_template: bool) -> JobResult:
    sampling = {"temperature": float(job.temperature), "max_new_tokens": int(job.max_new_tokens),
                "ignore_eos": bool(job.ignore_eos)}
    if job.temperature > 0:
        sampling.update(top_p=1.0, top_k=-1, min_p=0.0)
    convs = [[] for _ in job.prompts]
    n_turns = max(len(p.turns) for p in job.prompts)
    if job.max_turns:
        n_turns = min(n_turns, job.max_turns)
    requests = []
    for turn in range(n_turns):
        idx = [i for i, p in enumerate(job.prompts) if turn < len(p.turns)]
        texts, rids = [], []
        for i in idx:
            convs[i].append({"role": "user", "content": job.prompts[i].turns[turn]})
            texts.append(_conversation_text(tokenizer, convs[i], use_template))
            rids.append(f"{job.label}-p{i}-t{turn}")
        outs = engine.generate(texts, [dict(sampling) for _ in texts], rid=rids)
        for i, rid, out in zip(idx, rids, outs):
            convs[i].append({"role": "assistant", "content": out["text"]})
            meta = {k: v for k, v in out["meta_info"].items()
                    if isinstance(v, (int, float, str, type(None), list))}
            requests.append({"rid": rid, "prompt": i, "turn": turn, "meta": meta})
    return JobResult(label=job.label, temperature=float(job.temperature), requests=requests,
                     rounds=[])


def job_to_dict(job: PromptJob) -> dict:
    d = dataclasses.asdict(job)
    d["prompts"] = len(job.prompts)
    return d
