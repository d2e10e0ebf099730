"""Requests that decode to the context limit (sglang_dspark/kv_headroom.py).

SGLang 0.5.23 sizes a request's req_to_token row at page size 1 for less than DSpark's
decode reserve (committed + 2 x num_draft_tokens) once gamma is 9 or more, so a request
decoding to within a few tokens of --context-length reserves past its row: the slots past
it never return to the pool and SGLang's idle check stops the server ("pool memory leak
detected"). The user's command on a real server, a gamma-12 drafter whose drafts are all
wrong (one token per step, so every length up to the limit is some step's committed length).
"""

import concurrent.futures as cf
import time

import pytest

from dspark_testlib import hf_greedy
from sglang_dspark.server_process import SGLangServer, http_json

CONTEXT = 96
GAMMA = 12


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_dspark.tiny_models import TinySpec, build_pair

    out = tmp_path_factory.mktemp("gamma12")
    build_pair(out, TinySpec(seed=0, block_size=GAMMA, draft_error_rate=1.0))
    return {"target": str(out / "target"), "draft": str(out / "draft")}


@pytest.fixture(scope="module")
def server(pair, users_environment):
    srv = SGLangServer(model_path=pair["target"], draft_path=pair["draft"],
                       extra_args=["--context-length", str(CONTEXT)])
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def _generate(url, prompt, n):
    return http_json(url + "/generate", {"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": n, "ignore_eos": True}})


def test_requests_decode_to_the_context_limit_and_the_server_keeps_serving(server, pair):
    long_prompt, short_prompt = "import heapq\n\ndef top_k(items, k):", "class Stack:"
    plen = _generate(server.url, long_prompt, 1)["meta_info"]["prompt_tokens"]
    with cf.ThreadPoolExecutor(6) as ex:        # three to the limit beside three short ones
        jobs = [ex.submit(_generate, server.url, p, n) for _ in range(3)
                for p, n in ((long_prompt, CONTEXT - plen), (short_prompt, 24))]
        res = [j.result() for j in jobs]
    to_limit = res[0::2]
    n_out = to_limit[0]["meta_info"]["completion_tokens"]
    assert plen + n_out >= CONTEXT - 4, "the requests did not reach the context limit"
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in res)
    # one token per step: every committed length up to the limit was a decode step's
    assert to_limit[0]["meta_info"]["spec_verify_ct"] >= n_out - 4
    ref = hf_greedy(pair["target"], long_prompt, n_out, ignore_eos=True)
    assert all(r["output_ids"] == ref for r in to_limit)
    short_ref = hf_greedy(pair["target"], short_prompt, 24, ignore_eos=True)
    assert all(r["output_ids"] == short_ref for r in res[1::2])
    time.sleep(2.0)     # SGLang checks its pools for leaked slots while idle
    again = _generate(server.url, short_prompt, 24)
    assert again["output_ids"] == short_ref
    assert server.proc.poll() is None
    assert "leak detected" not in server.log_tail(400)
