"""``req_to_token`` rows wide enough for DSpark's decode reserve.

Rule: a request's ``req_to_token`` row must hold every KV slot SGLang's DSpark scheduler
reserves for it, which at each decode step is up to ``committed + 2 x
speculative_num_draft_tokens`` (``DFlashDraftInputV2.prepare_for_decode``: the overlap
double buffer), rounded up to a page.  SGLang 0.5.23 sizes the row ``context_len +
get_req_to_token_extra_context_len()`` wide, and that headroom covers the reserve only at
page size > 1 (or for UNO); at page size 1, DSpark's default, it is ``4 +
num_draft_tokens``, so a request whose committed length comes within ``num_draft_tokens -
4`` tokens of the context limit gets a reserve past its row.  SGLang ends a request a few
tokens short of the limit (committed at most ``context_len - 5`` at a decode step on CPU,
measured), so gamma 9 or more (``num_draft_tokens`` 10 or more) reaches it: on a GPU the
reserve's slot numbers are written into the next request's row (that request then reads
another request's KV), the release clamps at the row's end, and the slots past it never
return to the pool; SGLang's idle check then stops the server (``pool memory leak
detected``).  Seen on CPU with a gamma-12 drafter and
``--context-length 96`` (docs/worker.md, "Requests that reach the context limit");
upstream: sgl-project/sglang#33579, open for 0.5.23.

:func:`widen_for_dspark` is an AFTER hook on that function (listed in
:mod:`sglang_dspark.seams`): under ``--speculative-algorithm DSPARK`` the headroom is at
least ``2 x num_draft_tokens + page_size - 1``; any other algorithm's is left as SGLang
computed it.  The rows grow by ``num_draft_tokens - 4`` slot indices each (a few hundred
bytes per running request slot); the KV pool itself does not grow.
"""

from __future__ import annotations

__all__ = ["dspark_row_headroom", "widen_for_dspark"]


def dspark_row_headroom(num_draft_tokens: int, page_size: int) -> int:
    """Slots past the context length a DSpark request's row must hold: its decode reserve
    (twice the verify block) plus a page's rounding."""
    return 2 * int(num_draft_tokens) + int(page_size) - 1


def widen_for_dspark(result: int, *args, **kwargs) -> int:
    """AFTER hook on ``get_req_to_token_extra_context_len``: SGLang's headroom (``result``),
    raised to :func:`dspark_row_headroom` under DSPARK."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size
    from sglang.srt.runtime_context import get_spec

    from sglang_dspark.seams import names_dspark

    spec = get_spec()
    if not names_dspark(spec.speculative_algorithm) or not spec.speculative_num_draft_tokens:
        return result
    return max(int(result), dspark_row_headroom(spec.speculative_num_draft_tokens, get_alloc_page_size()))
