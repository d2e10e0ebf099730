"""No-draft steps through the real SGLang engine on CPU (sglang_dspark.no_draft).

* greedy output equals the non-speculative engine's, token for token, with drafting
  switched on and off at random steps (the A/B arms ``off`` and a drafted arm), requests
  joining and finishing while off, in compact mode (off steps as plain decoding,
  ``PlainDecodeStep``) and cap-accept mode (off steps inside SGLang's verify), prompts
  prefilled in chunks beside decoding requests and reusing radix-cache prefixes, and with
  SGLang retracting requests under (simulated) KV-pool pressure while it switches;
* a drafted step after no-draft steps drafts exactly what an always-drafting run drafts
  for the same context: draft tokens and confidences compared through SGLang's own
  per-step records (``SGLANG_DSPARK_DEBUG_DUMP=all``).
"""

import pytest

from dspark_testlib import GREEDY_PROMPTS, engine_kwargs, nospec_ids, run_engine_job

PROMPTS = GREEDY_PROMPTS + ["for i in range(10):\n"]
MAX_NEW = [40, 23, 31, 17, 36, 28]

_cache: dict = {}


def _job(tiny_pair, tmp_path_factory, *, spec_env=None, prompts=PROMPTS, max_new=MAX_NEW,
         max_running=3, dump=False, overlap=False, chunk=None):
    key = (tuple(sorted((spec_env or {}).items())), tuple(prompts), tuple(max_new), max_running, dump,
           overlap, chunk)
    if key in _cache:
        return _cache[key]
    kw = engine_kwargs(tiny_pair, dtype="float32", max_running_requests=max_running)
    if chunk is not None:
        kw["chunked_prefill_size"] = chunk
    if overlap:
        kw["disable_overlap_schedule"] = False
    env = {"SGLANG_DSPARK_LOG_INTERVAL_S": "0"}
    if spec_env is not None:
        kw.update(speculative_algorithm="DSPARK", speculative_draft_model_path=tiny_pair["draft"])
        env.update(spec_env)
    if dump:
        env["SGLANG_DSPARK_DEBUG_DUMP"] = "all"
    job = {"engine": kw, "env": env, "server_info": spec_env is not None,
           "batches": [{"prompts": prompts,
                        "sampling": [{"temperature": 0.0, "max_new_tokens": n} for n in max_new]}]}
    _cache[key] = run_engine_job(job, tmp_path_factory.mktemp("nodraft"))
    return _cache[key]


def _ids(res):
    return [o["output_ids"] for o in res["results"][0]]


def _state(res):
    return res["server_info"]["internal_states"][0]["dspark_info_record"]


# compact: the policy arm (its budgets, exploration included, and its own gate) between off
# steps; cap-accept: every draft verified between off steps. Prompts are prefilled in
# chunks of CHUNK tokens beside the requests decoding, and later prompts reuse the radix
# cache's prefixes of earlier ones (their draft-context rows possibly still queued)
CHUNK = 8


@pytest.mark.parametrize("mode,arms", [("compact", "off,policy"), ("cap-accept", "off,fixed@1")])
def test_random_no_draft_steps_keep_greedy_output(mode, arms, tiny_pair, tmp_path_factory):
    prompts, max_new = PROMPTS + ["import os\nimport sys\n" * 4], MAX_NEW + [20]   # PROMPTS[2]'s prefix
    base = nospec_ids(tiny_pair, prompts, max_new, tmp_path_factory)
    spec = _job(tiny_pair, tmp_path_factory, prompts=prompts, max_new=max_new, chunk=CHUNK, spec_env={
        "SGLANG_RAGGED_VERIFY_MODE": mode, "SGLANG_DSPARK_AB_ARMS": arms, "SGLANG_DSPARK_AB_SEED": "3"})
    assert _ids(spec) == base
    meta = [o["meta_info"] for o in spec["results"][0]]
    assert max(m["prompt_tokens"] for m in meta) > 2 * CHUNK, meta     # chunked prefills
    assert sum(m["cached_tokens"] for m in meta) >= CHUNK, meta         # radix-cache hits
    st = _state(spec)["sglang_dspark"]
    tot = st["ab"]["totals"]
    # both kinds of step ran, and often enough to switch back and forth many times
    assert tot["off"]["steps"] >= 10 and min(t["steps"] for t in tot.values()) >= 10, tot
    assert st["no_draft"]["steps"] >= tot["off"]["steps"]
    # compact on CPU (no target graphs): every no-draft step was plain decoding (a decode
    # forward and SGLang's sampler, no verify); cap-accept verifies its fixed window
    nd = st["no_draft"]
    assert nd["decode_forward_dropped"] is None, nd
    assert nd["decode_forwards"] == (nd["steps"] if mode == "compact" else None), nd
    assert nd["plain_decode_steps"] == (nd["steps"] if mode == "compact" else None), nd
    assert st["budget_sources"].get("ab:off", 0) == tot["off"]["steps"]
    # an off step verifies no draft token: one output token per request
    assert tot["off"]["verified_drafts"] == 0
    assert tot["off"]["tokens"] == tot["off"]["requests"]
    # the drafted arm still accepted drafts (speculation really ran between off steps)
    drafted = [a for a in tot if a != "off"][0]
    assert tot[drafted]["tokens"] > tot[drafted]["requests"]


# SGLang's own retraction switch: every second decode step takes the batch's
# least-advanced request back to the waiting queue (its KV freed), as when the KV pool runs
# out; it re-enters through prefill with its output so far, often while drafting is off
@pytest.mark.parametrize("mode,arms", [("compact", "off,policy"), ("cap-accept", "off,fixed@1")])
def test_retracted_requests_keep_greedy_output_while_drafting_switches(mode, arms, tiny_pair,
                                                                       tmp_path_factory):
    base = nospec_ids(tiny_pair, PROMPTS, MAX_NEW, tmp_path_factory)
    spec = _job(tiny_pair, tmp_path_factory, spec_env={
        "SGLANG_RAGGED_VERIFY_MODE": mode, "SGLANG_DSPARK_AB_ARMS": arms, "SGLANG_DSPARK_AB_SEED": "3",
        "SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "2"})
    assert _ids(spec) == base
    retractions = [o["meta_info"]["num_retractions"] for o in spec["results"][0]]
    assert sum(retractions) >= 3, retractions
    tot = _state(spec)["sglang_dspark"]["ab"]["totals"]
    assert min(t["steps"] for t in tot.values()) >= 5, tot


def test_overlap_scheduling_keeps_greedy_output_and_plans_unknown_relayed_rows_as_unknown(
        tiny_pair, tmp_path_factory):
    # SGLang's default for servers: the budget is planned a step ahead from confidences
    # relayed by request slot; on CPU a request that has not drafted yet reads its slot's
    # previous contents (budget.RelayedRows), which the policy must plan as unknown
    base = nospec_ids(tiny_pair, PROMPTS, MAX_NEW, tmp_path_factory)
    spec = _job(tiny_pair, tmp_path_factory, overlap=True, spec_env={
        "SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_AB_ARMS": "off,policy",
        "SGLANG_DSPARK_AB_SEED": "4"})
    assert _ids(spec) == base
    st = _state(spec)["sglang_dspark"]
    tot = st["ab"]["totals"]
    assert tot["off"]["steps"] >= 5 and tot["policy"]["steps"] >= 5, tot
    # every request's first drafted step planned without confidences of its own, and only then
    assert len(PROMPTS) <= st["survival_unknown_rows"] <= 2 * len(PROMPTS), st["survival_unknown_rows"]
    nd = st["no_draft"]     # the off arm's steps, and the policy arm's own off steps
    assert nd["plain_decode_steps"] == nd["steps"] >= tot["off"]["steps"], nd


def test_a_step_drafts_after_no_draft_steps_what_an_always_drafting_run_drafts(tiny_pair, tmp_path_factory):
    # one request at a time (same shapes: bit-identical forwards), budget 0 on every drafted
    # step, so the always-drafting run drafts at every prefix length; the drafted blocks and
    # their confidences come from SGLang's own per-step observer call (SGLANG_DSPARK_CAPTURE)
    import json

    prompts, max_new = PROMPTS[:3], [30, 30, 30]
    cap_dir = tmp_path_factory.mktemp("cap")
    runs = {}
    # fixed@0.0001 of at most gamma drafts is 0 too: the A/B needs two arms
    # "sglang": no-draft steps off, so every draft-context write is SGLang's own, at once
    # (no AnchorCommit: prompts and commits are not batched)
    for name, arms, nd in (("always", "fixed@0,fixed@0.0001", "1"), ("mixed", "fixed@0,off", "1"),
                           ("sglang", "fixed@0,fixed@0.0001", "0")):
        path = cap_dir / f"{name}.jsonl"
        res = _job(tiny_pair, tmp_path_factory, prompts=prompts, max_new=max_new, max_running=1,
                   spec_env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_AB_ARMS": arms,
                             "SGLANG_DSPARK_AB_SEED": "5", "SGLANG_DSPARK_CAPTURE": str(path),
                             "SGLANG_DSPARK_NO_DRAFT": nd})
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        runs[name] = (res, lines)
    assert _ids(runs["mixed"][0]) == _ids(runs["always"][0])

    def drafts(lines):
        """(request order, prefix length) -> (drafted block, confidences)"""
        order, out = [], {}
        for ln in lines:
            assert len(ln["rids"]) == 1
            rid = ln["rids"][0]
            if rid not in order:
                order.append(rid)
            out[(order.index(rid), ln["prefix"][0])] = (ln["drafts"][0], ln["conf"][0], ln["ctx"][0])
        return out

    a, m = drafts(runs["always"][1]), drafts(runs["mixed"][1])
    # the prompts' rows batched with the off steps' (AnchorCommit.prefill) draft exactly what
    # SGLang's own writes draft
    nd_sglang = runs["sglang"][0]["server_info"]["internal_states"][0]["dspark_info_record"][
        "sglang_dspark"]["no_draft"]
    assert nd_sglang["prefill_commits_batched"] in (None, 0), nd_sglang
    assert drafts(runs["sglang"][1]) == a
    off_steps = runs["mixed"][0]["server_info"]["internal_states"][0]["dspark_info_record"][
        "sglang_dspark"]["ab"]["totals"]["off"]["steps"]
    assert off_steps >= 10
    # the off steps' anchor rows were written in batches (a run of off steps, one write)
    nd = runs["mixed"][0]["server_info"]["internal_states"][0]["dspark_info_record"]["sglang_dspark"]["no_draft"]
    assert nd["anchor_only_commits"] == off_steps and 1 <= nd["anchor_commit_flushes"] < off_steps, nd
    assert nd["plain_decode_steps"] == off_steps, nd     # without SGLang's verify
    assert nd["prefill_commits_batched"] == len(prompts), nd   # every prompt's rows waited
    assert len(m) + off_steps - 3 <= len(a)      # every off step skipped a prefix's draft
    # drafted steps right after off steps: their prefix was reached by a no-draft step
    after_off = [k for k in m if (k[0], k[1] - 1) not in m and k[1] - 1 >= min(p for (r, p) in m if r == k[0])]
    assert len(after_off) >= 5, len(after_off)
    assert set(m) <= set(a)
    for k in m:
        assert m[k][:2] == a[k][:2], k       # drafts and confidences, bit for bit
        # the context KV the draft read: the same rows (a row missing, late or twice moves
        # the sum by O(1)); projected in batches of another shape, so equal to float32
        # rounding, not bit for bit (docs/worker.md)
        assert m[k][2] == pytest.approx(a[k][2], rel=1e-5), k
