"""Settings and CPU defaults through the real launch command (sglang.launch_server)."""

import os
import subprocess
import sys

from sglang_dspark.cpu.pool import default_cpu_pool_tokens
from sglang_dspark.server_process import SGLangServer, http_json


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.pop("TRITON_INTERPRET", None)
    return dict(env, **extra)


def test_a_nonsense_value_stops_start_up_with_one_line_and_exit_2(tiny_pair):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", tiny_pair["target"],
           "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", tiny_pair["draft"],
           "--device", "cpu", "--port", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=_env(SGLANG_DSPARK_ONLINE="maybe", SGLANG_DSPARK_CONTROLLER="garbage"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    line = [ln for ln in out.splitlines() if ln.startswith("sglang-dspark: ")]
    assert line and "SGLANG_DSPARK_ONLINE='maybe' is not valid: write 1/0, true/false or on/off" in line[0]
    assert "SGLANG_DSPARK_CONTROLLER='garbage' is not valid: write tcp://HOST:PORT" in line[0]


def test_online_false_turns_planning_off_and_cpu_pool_has_a_bounded_default(tiny_pair):
    srv = SGLangServer(model_path=tiny_pair["target"], draft_path=tiny_pair["draft"], cpu_kv_tokens=None,
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ONLINE": "false",
                            "SGLANG_DSPARK_LOG_INTERVAL_S": "0"})
    assert "--max-total-tokens" not in srv.command()
    with srv:
        http_json(srv.url + "/generate", {"text": "def f(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": 24}})
        info = srv.server_info()
        log = srv.log_path.read_text()
    plugin = info["internal_states"][0]["dspark_info_record"]["sglang_dspark"]
    assert plugin["online"] is False
    # no table and online off: SGLang verifies everything, and the counters say so
    assert set(plugin["budget_sources"]) == {"verify_all"}, plugin["budget_sources"]
    assert "SGLANG_DSPARK_ONLINE is off" in log
    tokens, how = default_cpu_pool_tokens(tiny_pair["target"])
    assert info["max_total_num_tokens"] == tokens, (info["max_total_num_tokens"], how)
    assert f"KV pool of {tokens} tokens" in log
