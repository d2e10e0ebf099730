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


VENDOR_PLATFORM = """
import os
import sys


def activate():
    # another distribution's platform plugin that runs on CPU: SGLang's CpuSRTPlatform,
    # with the sgl_kernel CPU ops this machine needs (SGLang loads only the selected plugin)
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    from sglang_dspark.cpu.boot import install_sgl_kernel_cpu_ops

    install_sgl_kernel_cpu_ops()
    print("dspark-test-vendor: platform activated", file=sys.stderr, flush=True)
    return "sglang.srt.platforms.cpu.CpuSRTPlatform"
"""


def _vendor_platform(root):
    """A platform plugin distribution ``dspark-test-vendor``, found through PYTHONPATH."""
    (root / "dspark_test_vendor.py").write_text(VENDOR_PLATFORM)
    info = root / "dspark_test_vendor-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dspark-test-vendor\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[sglang.srt.platforms]\ndspark_test_vendor = dspark_test_vendor:activate\n")
    return os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)


def test_online_false_turns_planning_off_and_cpu_pool_has_a_bounded_default(tiny_pair, tmp_path):
    # SGLANG_PLATFORM selects another distribution's platform: SGLang then skips the plugins
    # of every other distribution that ships a platform entry point; ours must still run
    srv = SGLangServer(model_path=tiny_pair["target"], draft_path=tiny_pair["draft"], cpu_kv_tokens=None,
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ONLINE": "false",
                            "SGLANG_DSPARK_LOG_INTERVAL_S": "0",
                            "SGLANG_PLATFORM": "dspark_test_vendor",
                            "PYTHONPATH": _vendor_platform(tmp_path)})
    assert "--max-total-tokens" not in srv.command()
    with srv:
        http_json(srv.url + "/generate", {"text": "def f(x):", "sampling_params": {
            "temperature": 0, "max_new_tokens": 24}})
        info = srv.server_info()
        # no online planning, no no-draft steps: the operator's pin is refused, with the reason
        assert not srv.set_internal_state({"dspark_draft": 0})
        log = srv.log_path.read_text()
    assert "dspark-test-vendor: platform activated" in log      # SGLang ran the vendor's platform
    plugin = info["internal_states"][0]["dspark_info_record"]["sglang_dspark"]   # our worker ran
    assert plugin["online"] is False
    assert plugin["no_draft"]["steps"] == 0 and plugin["no_draft"]["operator_pin"] is None
    assert "no-draft steps are unavailable on this server: they need online planning" in log
    # no table and online off: SGLang verifies everything, and the counters say so
    assert set(plugin["budget_sources"]) == {"verify_all"}, plugin["budget_sources"]
    assert "SGLANG_DSPARK_ONLINE is off" in log
    tokens, how = default_cpu_pool_tokens(tiny_pair["target"])
    assert info["max_total_num_tokens"] == tokens, (info["max_total_num_tokens"], how)
    assert f"KV pool of {tokens} tokens" in log
