"""request_guard's rule on its own (the real server's answer: tests/integration/test_http_server.py)."""

from types import SimpleNamespace as NS

import pytest

from sglang_dspark.request_guard import refuse_fatal_request


def _manager(algorithm="DSPARK", vocab=10):
    return NS(server_args=NS(speculative_algorithm=algorithm), model_config=NS(vocab_size=vocab))


TEXT = NS(image_data=None, video_data=None, audio_data=None, return_logprob=False, top_logprobs_num=None)


@pytest.mark.parametrize("ids,message", [([], "no tokens"), ([3, 10], "token id 10, outside"),
                                         ([-1, 3], "token id -1, outside")])
def test_dspark_refuses_what_sglang_dies_on(ids, message):
    with pytest.raises(ValueError, match=message):
        refuse_fatal_request(_manager(), TEXT, ids)


def test_what_passes():
    assert refuse_fatal_request(_manager(), TEXT, [0, 9]) is None          # the whole range
    assert refuse_fatal_request(_manager(), TEXT, None) is None            # input_embeds
    assert refuse_fatal_request(_manager("dspark"), TEXT, [0]) is None     # SGLang upper-cases
    # other algorithms keep SGLang's behaviour; multimodal placeholders are SGLang's
    assert refuse_fatal_request(_manager("EAGLE"), TEXT, []) is None
    assert refuse_fatal_request(_manager(None), TEXT, [99]) is None
    image = NS(image_data=["img"], video_data=None, audio_data=None)
    assert refuse_fatal_request(_manager(), image, [99]) is None
    # top_logprobs_num: up to the vocabulary, and only with return_logprob
    lp = NS(**{**vars(TEXT), "return_logprob": True, "top_logprobs_num": 10})
    assert refuse_fatal_request(_manager(), lp, [0]) is None
    assert refuse_fatal_request(_manager(), NS(**{**vars(TEXT), "top_logprobs_num": 11}), [0]) is None
    with pytest.raises(ValueError, match="top_logprobs_num 11 is more than the model's vocabulary"):
        refuse_fatal_request(_manager(), NS(**{**vars(lp), "top_logprobs_num": 11}), None)
