"""The req_to_token row headroom under DSPARK (sglang_dspark/kv_headroom.py) against
SGLang's own decode reservation (allocation_sizing.page_aligned_decode_alloc_lens, called
by DFlashDraftInputV2.prepare_for_decode with reserve = 2 x num_draft_tokens)."""

from types import SimpleNamespace as NS

import pytest

from sglang_dspark.kv_headroom import dspark_row_headroom


@pytest.mark.parametrize("num_draft_tokens", [2, 6, 9, 13, 17])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_a_row_holds_the_decode_reserve_up_to_the_context_limit(num_draft_tokens, page_size):
    from sglang.srt.mem_cache.allocation_sizing import page_aligned_decode_alloc_lens

    ctx = 4099
    reserve = 2 * num_draft_tokens
    widest = 0
    for committed in range(ctx - reserve - 2 * page_size, ctx + 1):
        req = NS(kv=NS(kv_allocated_len=0, kv_committed_len=committed))
        _, nxt, _ = page_aligned_decode_alloc_lens([req], reserve=reserve, page_size=page_size)
        widest = max(widest, nxt[0])
    assert widest <= ctx + dspark_row_headroom(num_draft_tokens, page_size)
    if page_size == 1:      # and no wider than it must be: the last length fills the row
        assert widest == ctx + dspark_row_headroom(num_draft_tokens, page_size)
