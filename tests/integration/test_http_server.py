"""The exact user command on CPU: python -m sglang.launch_server --model-path T
--speculative-algorithm DSPARK --speculative-draft-model-path D --device cpu --port P
(no environment variables), served over HTTP."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dspark_testlib import hf_greedy, user_env
from sglang_dspark.server_process import SGLangServer, http_json


@pytest.fixture(scope="module")
def server(tiny_pair, users_environment):
    srv = SGLangServer(model_path=tiny_pair["target"], draft_path=tiny_pair["draft"],
                       extra_args=["--enable-metrics"], cpu_kv_tokens=None)
    srv.start()
    yield srv
    assert srv.stop() is not None


def test_generate_equals_hf_transformers_greedy(server, tiny_pair):
    for prompt, n in [("def parse(line):", 40), ("The quick brown fox", 25)]:
        r = http_json(server.url + "/generate", {
            "text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n}})
        hf = hf_greedy(tiny_pair["target"], prompt, n)
        assert r["output_ids"] == hf[: len(r["output_ids"])]
        assert r["meta_info"]["spec_verify_ct"] < r["meta_info"]["completion_tokens"]


def test_chat_completions_and_sampling(server):
    r = http_json(server.url + "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16, "temperature": 1.0})
    assert r["choices"][0]["message"]["content"]
    assert r["usage"]["completion_tokens"] > 0
    # temperature 1.0 through DSpark's rejection sampler, several requests at once
    r = http_json(server.url + "/generate", {
        "text": ["a", "b = 1", "import re"],
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 20}})
    assert len(r) == 3 and all(x["meta_info"]["completion_tokens"] > 0 for x in r)


def test_our_worker_serves(server):
    info = server.server_info()
    rec = info["internal_states"][0]["dspark_info_record"]
    assert rec["sglang_dspark"]["worker"] == "sglang_dspark.worker.DSparkControlledWorker"
    assert info["attention_backend"] == "dspark_cpu"


def test_metrics_endpoint_has_dspark_metrics(server):
    http_json(server.url + "/generate", {"text": "x = 1", "sampling_params": {
        "temperature": 0, "max_new_tokens": 16}})
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "sglang_dspark:verify_tokens" in text
    assert 'sglang_dspark:budget_decisions_total{source=' in text or \
        "sglang_dspark:running_requests" in text
    assert "sglang:" in text  # SGLang's own metrics on the same endpoint


def test_inputs_sglang_dies_on_are_refused_and_the_server_lives(server, tiny_pair):
    """SGLang 0.5.23's /generate accepts an input of no tokens, an out-of-vocabulary id or
    more top logprobs than the vocabulary has, and its scheduler dies on it (its OpenAI
    routes refuse an empty prompt themselves); the plugin answers 400 and the server keeps
    serving."""
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tiny_pair["target"])("")["input_ids"] == []
    vocab = json.loads((Path(tiny_pair["target"]) / "config.json").read_text())["vocab_size"]
    params = {"temperature": 0, "max_new_tokens": 8}
    for payload, message in [({"text": ""}, "no tokens"), ({"input_ids": [[]]}, "no tokens"),
                             ({"text": ["a", ""]}, "no tokens"),
                             ({"input_ids": [5, vocab, 7]}, f"token id {vocab}, outside"),
                             ({"input_ids": [[5, 6], [5, -1]]}, "token id -1, outside"),
                             ({"text": "x", "return_logprob": True, "top_logprobs_num": vocab + 1},
                              f"top_logprobs_num {vocab + 1} is more than")]:
        with pytest.raises(urllib.error.HTTPError) as e:
            http_json(server.url + "/generate", {**payload, "sampling_params": params})
        assert e.value.code == 400, payload
        assert message in e.value.read().decode(), payload
    r = http_json(server.url + "/generate", {"input_ids": [5, vocab - 1, 7], "sampling_params": params})
    assert r["meta_info"]["completion_tokens"] == 8
    r = http_json(server.url + "/generate", {"text": "x = 1", "sampling_params": params})
    assert r["meta_info"]["completion_tokens"] == 8


def _broken(tmp_path, tiny_pair, edit):
    import shutil

    d = tmp_path / "draft"
    shutil.copytree(tiny_pair["draft"], d)
    edit(d)
    return d


def _drop_tensor(d):
    from safetensors.torch import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    del w["fc.weight"]
    save_file(w, str(d / "model.safetensors"))


# one broken draft through the real launch command; the validator's other refusals
# (vocabulary mismatch, bad target_layer_ids, ...) are unit-tested on SGLang's own config
# parsers (tests/unit/test_tiny_models_and_checkpoint.py, test_checkpoint_layouts.py):
# each launch here costs an SGLang start-up
@pytest.mark.parametrize("edit,message", [(_drop_tensor, "missing tensors")])
def test_broken_draft_exits_nonzero_with_message(edit, message, tmp_path, tiny_pair):
    d = _broken(tmp_path, tiny_pair, edit)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", tiny_pair["target"],
           "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(d),
           "--device", "cpu", "--port", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=user_env())
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
