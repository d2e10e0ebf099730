"""Refuse a request SGLang 0.5.23 would accept and then die on.

A generate request whose input has no tokens (``{"text": ""}`` with a tokenizer that adds
no BOS, or ``{"input_ids": [[]]}`` in a batch) passes SGLang's tokenizer-manager checks and
reaches the scheduler as an extend of zero tokens; the prefill's logits processor then
indexes an empty hidden-state tensor, the scheduler exits and the server goes down with
every request in flight (SGLang's own bug, plain decoding included). Under DSPARK the
plugin turns it into the caller's error: the tokenizer manager raises ``ValueError``,
which SGLang's HTTP server answers with status 400 (the offline ``Engine`` runs the same
check and raises it to its caller); nothing reaches the scheduler.
"""

from __future__ import annotations

from typing import Any

from sglang_dspark.seams import names_dspark


def refuse_empty_input(manager: Any, obj: Any, input_ids: Any, *args, **kwargs) -> None:
    """BEFORE hook on ``TokenizerManager._validate_one_request(self, obj, input_ids)``
    (every single and batched request): on a DSPARK server a request whose ``input_ids``
    is an empty list is refused with ``ValueError``. Requests without token ids
    (``input_embeds``) pass unchanged."""
    if input_ids is not None and len(input_ids) == 0 and names_dspark(
            getattr(manager.server_args, "speculative_algorithm", None)):
        raise ValueError(
            "The input has no tokens (empty text or input_ids): SGLang 0.5.23's scheduler "
            "cannot prefill an empty input, so sglang-dspark refuses it. Send at least one "
            "token (for example the tokenizer's BOS token).")
    return None
