"""The committed trained pair ``models/tiny-stdlib`` (what ``make demo`` serves) is a
valid SGLang DSPARK target/draft pair and still drafts what its report says."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_dspark.checkpoint import validate_draft

PAIR = Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib"


def test_committed_pair_loads_and_drafts_like_its_report():
    validate_draft(PAIR / "draft", PAIR / "target")
    rep = json.loads((PAIR / "report.json").read_text())
    assert rep["eval"]["engine_tau_ratio"] >= 1.15          # the target, as measured
    from sglang_dspark.train.model import load_draft
    from sglang_dspark.train.simulate import simulate_greedy
    from sglang_dspark.train.target import Target
    from sglang_dspark.train.tiny_pair import heldout_prompts

    torch.manual_seed(0)
    target = Target(PAIR / "target")
    draft = load_draft(PAIR / "draft", target.embed.float(), target.lm_head.float()).eval()
    prompt = heldout_prompts(target.tokenizer, 1, rep["eval"]["prompt_len"])[0]
    res = simulate_greedy(target, draft, prompt, rep["eval"]["max_new_tokens"])
    # the first held-out prompt's verify rounds as recorded when the pair was made (18), up to
    # float ties between argmaxes on another machine/thread count; an untrained or mismatched
    # draft needs ~60 rounds for these 64 tokens
    assert abs(res.verify_ct - rep["eval"]["sim_verify_ct_dspark"][0]) <= 2
    assert len(res.output_ids) / res.verify_ct >= 3.0
