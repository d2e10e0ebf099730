"""Refuse inputs SGLang 0.5.23 would accept and then die on.

Two kinds of generate input pass SGLang's tokenizer-manager checks and take the scheduler
down, with every request in flight (SGLang's own bugs, plain decoding included):

* an input of no tokens (``{"text": ""}`` with a tokenizer that adds no BOS,
  ``{"input_ids": [[]]}``): the prefill's logits processor indexes an empty hidden-state
  tensor;
* a token id outside ``[0, vocab_size)`` in ``input_ids``: the target's embedding lookup
  indexes out of range (on a GPU, a device-side assert).

Under DSPARK the plugin turns both into the caller's error: the tokenizer manager raises
``ValueError``, which SGLang's HTTP server answers with status 400 (the offline ``Engine``
runs the same check and raises it to its caller); nothing reaches the scheduler. The valid
range is the one SGLang itself enforces for ``token_ids_logprob``.
"""

from __future__ import annotations

from typing import Any

from sglang_dspark.seams import names_dspark


def refuse_bad_input_ids(manager: Any, obj: Any, input_ids: Any, *args, **kwargs) -> None:
    """BEFORE hook on ``TokenizerManager._validate_one_request(self, obj, input_ids)``
    (every single and batched request): on a DSPARK server a request whose ``input_ids``
    is empty or holds an id outside ``[0, model_config.vocab_size)`` is refused with
    ``ValueError``. Requests without token ids (``input_embeds``) pass unchanged; so do a
    multimodal request's ids (its placeholders are SGLang's to resolve)."""
    if input_ids is None or not names_dspark(getattr(manager.server_args, "speculative_algorithm", None)):
        return None
    if len(input_ids) == 0:
        raise ValueError(
            "The input has no tokens (empty text or input_ids): SGLang 0.5.23's scheduler "
            "cannot prefill an empty input, so sglang-dspark refuses it. Send at least one "
            "token (for example the tokenizer's BOS token).")
    if any(getattr(obj, k, None) is not None for k in ("image_data", "video_data", "audio_data")):
        return None     # multimodal ids are SGLang's to place (it clamps them for the lookup)
    vocab = manager.model_config.vocab_size
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(
            f"input_ids contains the token id {bad}, outside the model's vocabulary "
            f"[0, {vocab}): SGLang 0.5.23's scheduler would fail on it, so sglang-dspark "
            "refuses it. Send ids from the model's own tokenizer.")
    return None
