"""Refuse inputs SGLang 0.5.23 would accept and then die on.

Three kinds of generate request pass SGLang's tokenizer-manager checks and take the
scheduler down, with every request in flight (SGLang's own bugs, plain decoding included):

* an input of no tokens (``{"text": ""}`` with a tokenizer that adds no BOS,
  ``{"input_ids": [[]]}``): the prefill's logits processor indexes an empty hidden-state
  tensor;
* a token id outside ``[0, vocab_size)`` in ``input_ids``: the target's embedding lookup
  indexes out of range (on a GPU, a device-side assert);
* ``top_logprobs_num`` above the vocabulary size with ``return_logprob``: the top-k over
  the logits asks for more entries than there are.

Under DSPARK the plugin turns each into the caller's error: the tokenizer manager raises
``ValueError``, which SGLang's HTTP server answers with status 400 (the offline ``Engine``
runs the same check and raises it to its caller); nothing reaches the scheduler. The valid
range is the one SGLang itself enforces for ``token_ids_logprob``.
"""

from __future__ import annotations

from typing import Any

from sglang_dspark.seams import names_dspark


def refuse_fatal_request(manager: Any, obj: Any, input_ids: Any, *args, **kwargs) -> None:
    """BEFORE hook on ``TokenizerManager._validate_one_request(self, obj, input_ids)``
    (every single and batched request): on a DSPARK server a request whose ``input_ids``
    is empty or holds an id outside ``[0, model_config.vocab_size)`` is refused with
    ``ValueError``, and so is ``top_logprobs_num`` above ``vocab_size`` with
    ``return_logprob``. Requests without token ids (``input_embeds``) pass the id checks;
    so do a multimodal request's ids (its placeholders are SGLang's to resolve)."""
    if not names_dspark(getattr(manager.server_args, "speculative_algorithm", None)):
        return None
    vocab = manager.model_config.vocab_size
    top = getattr(obj, "top_logprobs_num", None)
    if getattr(obj, "return_logprob", False) and isinstance(top, int) and top > vocab:
        raise ValueError(
            f"top_logprobs_num {top} is more than the model's vocabulary ({vocab} tokens): "
            "SGLang 0.5.23's scheduler would fail on it, so sglang-dspark refuses it. Ask "
            f"for at most {vocab}.")
    if input_ids is None:
        return None
    if len(input_ids) == 0:
        raise ValueError(
            "The input has no tokens (empty text or input_ids): SGLang 0.5.23's scheduler "
            "cannot prefill an empty input, so sglang-dspark refuses it. Send at least one "
            "token (for example the tokenizer's BOS token).")
    if any(getattr(obj, k, None) is not None for k in ("image_data", "video_data", "audio_data")):
        return None     # multimodal ids are SGLang's to place (it clamps them for the lookup)
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ValueError(
            f"input_ids contains the token id {bad}, outside the model's vocabulary "
            f"[0, {vocab}): SGLang 0.5.23's scheduler would fail on it, so sglang-dspark "
            "refuses it. Send ids from the model's own tokenizer.")
    return None
