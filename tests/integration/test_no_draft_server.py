"""The operator's runtime switch for no-draft steps and their observability, on a real
SGLang HTTP server (CPU): ``/set_internal_state {"server_args": {"dspark_draft": 0 | 1 | -1}}``
pins drafting off / on and lifts the pin; ``/server_info`` and ``/metrics`` show the steps."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_dspark.server_process import SGLangServer, http_json


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_dspark.tiny_models import TinySpec, build_pair

    out = tmp_path_factory.mktemp("nodraft-srv")
    build_pair(out, TinySpec(seed=0))
    return {"target": str(out / "target"), "draft": str(out / "draft")}


def _texts(srv, n=6, max_new=20):
    def one(i):
        r = http_json(srv.url + "/generate", {"text": f"def g{i}(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=600)
        return r["text"]
    with ThreadPoolExecutor(3) as ex:
        return list(ex.map(one, range(n)))


def _nd(srv):
    return srv.server_info()["internal_states"][0]["dspark_info_record"]["sglang_dspark"]["no_draft"]


def test_operator_pins_drafting_off_and_on_and_lifts_it(pair, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    srv = SGLangServer(model_path=pair["target"], draft_path=pair["draft"],
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_LOG_INTERVAL_S": "0"},
                       extra_args=["--max-running-requests", "4", "--enable-metrics"])
    with srv:
        free = _texts(srv)
        assert _nd(srv)["operator_pin"] is None
        # off: every decode step is a no-draft step, output unchanged
        assert srv.set_internal_state({"dspark_draft": 0})
        before = _nd(srv)["steps"]
        off = _texts(srv)
        st = _nd(srv)
        assert off == free
        assert st["operator_pin"] is False and st["last_reason"] == "operator"
        assert st["steps"] - before >= 19          # 20 tokens a request: every decode step
        assert st["anchor_only_commits"] >= st["steps"] - before
        # on: every step drafts (no no-draft step, not even a probe)
        assert srv.set_internal_state({"dspark_draft": 1})
        before = _nd(srv)["steps"]
        assert _texts(srv) == free
        assert _nd(srv)["steps"] == before and _nd(srv)["operator_pin"] is True
        # lifted: the policy decides again
        assert srv.set_internal_state({"dspark_draft": -1})
        assert _nd(srv)["operator_pin"] is None
        # a bad value is refused like SGLang's own keys
        assert not srv.set_internal_state({"dspark_draft": 5})
        metrics = requests.get(srv.url + "/metrics", timeout=30).text
    assert 'sglang_dspark:no_draft_steps_total{reason="operator"}' in metrics, metrics[-3000:]
    assert "sglang_dspark:drafting" in metrics


# The refusal where no-draft steps cannot run (online planning off) is checked on the
# server of tests/integration/test_settings_server.py, which runs that configuration anyway.
