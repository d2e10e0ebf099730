"""The training-side draft drafts what SGLang drafts: run the real SGLang engine
(DSPARK, CPU, greedy, static verify) on a checkpoint written by the trainer and
compare, request by request, with a speculative loop simulated from the
training-side model (HF target + DSparkDraft.draft_greedy).  The number of verify
rounds depends on every drafted token's acceptance, so equal per-request verify
counts (and equal outputs) mean the two drafts agree."""

import pytest

from sglang_dspark.train.engine_eval import run_engine
from sglang_dspark.train.model import load_draft
from sglang_dspark.train.simulate import simulate_greedy
from sglang_dspark.train.tiny_pair import heldout_prompts

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("which", ["dspark", "dflash_served"])
def test_engine_matches_training_side_draft(trained_drafts, small_target, tmp_path, which):
    target = trained_drafts["target"]
    d = trained_drafts[which]
    draft = load_draft(d, target.embed.float(), target.lm_head.float()).eval()
    prompts = heldout_prompts(target.tokenizer, 6, 24)
    max_new = 40
    sims = [simulate_greedy(target, draft, p, max_new) for p in prompts]
    res = run_engine(str(small_target["dir"]), str(d), prompts, max_new, tmp_path)
    eng = res["results"]
    assert [r["output_ids"] for r in eng] == [s.output_ids for s in sims]
    assert [r["meta_info"]["spec_verify_ct"] for r in eng] == [s.verify_ct for s in sims], \
        [s.accept_lens for s in sims]
    # something was actually accepted, or the comparison would be vacuous
    assert sum(sum(s.accept_lens) for s in sims) > 0
    assert res["tau"] > 1.0
