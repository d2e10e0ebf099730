"""``dspark-controller profile`` against a real SGLang DSPARK server on CPU (the tiny pair).

Starts the server in compact ragged-verify mode with SGLang's step records, profiles it
briefly through the real CLI (two passes over 3 request counts x 4 budget fractions),
and checks that the result is a valid profile of *this* engine whose exports SGLang's own
loader reads and evaluates to the profile's predictions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from sglang_dspark.server_process import SGLangServer


def cli(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_controller.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_profile_a_live_cpu_server_and_load_the_export_in_sglang(tiny_pair, tmp_path):
    from dspark_controller.core.profile_file import load_profile
    from dspark_controller.profiling.tools import load_any
    from sglang.srt.speculative.dspark_components.dspark_sps import (SpsAdditiveCostTable, SpsCostTable,
                                                                      load_sps_table_from_path)

    srv = SGLangServer(model_path=tiny_pair["target"], draft_path=tiny_pair["draft"],
                       env={"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"},
                       extra_args=["--max-running-requests", "4"])
    out = tmp_path / "live.profile.json"
    with srv:
        r = cli("profile", "--url", srv.url, "-o", str(out), "--concurrency", "1,2,4", "--fractions", "1,0.5,0.25,0",
                "--steps-per-round", "8", "--min-passes", "2", "--max-passes", "2", "--max-time", "150")
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr[-4000:]}\n--- server log ---\n{srv.log_tail()}"
        assert "Traceback" not in r.stderr
        assert "ETA" in r.stderr and "wrote" in r.stdout
        info = srv.server_info()                      # the server is still healthy after being driven
        assert info["internal_states"][0]["dspark_info_record"]["mode"] == "compact"
        gamma = int(info["speculative_num_draft_tokens"]) - 1

    v = cli("validate", str(out), timeout=60)
    assert v.returncode == 0, v.stdout
    pf = load_profile(out)
    fp = pf.fingerprint
    assert fp.target_model == tiny_pair["target"] and fp.draft_model == tiny_pair["draft"]
    assert fp.gamma == gamma and fp.device_name.startswith("cpu:") and fp.sglang_version == "0.5.23"
    assert pf.provenance.command.startswith("dspark-controller profile --url http://127.0.0.1:")
    raw = np.asarray(pf.model.raw_samples)
    assert pf.samples_seen >= 100 and set(np.unique(raw[:, 0]).astype(int)) == {1, 2, 4}
    # every sample is a pinned budget: B = R + int(f * R * gamma) for one of the swept fractions
    allowed = {(rr, rr + int(f * rr * gamma)) for rr in (1, 2, 4) for f in (1.0, 0.5, 0.25, 1e-6)}
    assert {(int(a), int(b)) for a, b in raw[:, :2]} <= allowed
    # (accuracy is not asserted here: a busy shared CPU makes step times noisy; see docs/profiles.md)
    assert pf.heldout_error.n > 0 and pf.heldout_error.mape is not None and np.isfinite(pf.heldout_error.mape)
    model = load_any(str(out)).model
    med_1 = float(np.median(raw[raw[:, 0] == 1, 2]))
    assert 1 / 3 < float(model.predict_step_time(1, 1)) / med_1 < 3.0    # the fit is in the measured range

    add, cost = tmp_path / "add.json", tmp_path / "cost.json"
    assert cli("export", str(out), "--format", "additive", "-o", str(add), timeout=60).returncode == 0
    assert cli("export", str(out), "--format", "cost", "-o", str(cost), timeout=60).returncode == 0
    ta, tc = load_sps_table_from_path(str(add)), load_sps_table_from_path(str(cost))
    assert isinstance(ta, SpsAdditiveCostTable) and isinstance(tc, SpsCostTable)
    for rr in (1, 2, 4):
        for k in range(rr * gamma + 1):
            # the additive format holds the additive part of the fit (no per-row corrections)
            assert ta.step_time(num_reqs=rr, budget=k) == pytest.approx(model.additive_step_time(rr, rr + k), rel=1e-9)
    for b in range(4, 4 * (gamma + 1) + 1):                   # the cost table is for the largest R measured
        assert tc.lookup(b) == pytest.approx(1.0 / float(model.predict_step_time(4, b)), rel=1e-9)
    assert json.loads(add.read_text())["bias_seconds"] > 0
