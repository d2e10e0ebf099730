"""sglang_dspark.settings: every SGLANG_DSPARK_* variable declared once, one parser."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dspark import settings as st
from sglang_dspark.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_declared_ones():
    s = Settings.from_env({})
    for v in st.VARS:
        assert getattr(s, v.attr) == v.default, v.name
    assert s.online is True and s.decision_max_age_s == 2.0 and s.controller is None


@pytest.mark.parametrize("raw,expected", [("1", True), ("true", True), ("ON", True), (" on ", True),
                                          ("0", False), ("false", False), ("Off", False)])
def test_one_switch_vocabulary(raw, expected):
    for name in ("SGLANG_DSPARK_ONLINE", "SGLANG_DSPARK_CPU", "SGLANG_DSPARK_LEARN_FORCED"):
        assert st.read(name, {name: raw}) is expected


@pytest.mark.parametrize("name,raw,says", [
    ("SGLANG_DSPARK_ONLINE", "maybe", "write 1/0, true/false or on/off"),
    ("SGLANG_DSPARK_CPU", "yes", "write 1/0, true/false or on/off"),
    ("SGLANG_DSPARK_FULL_BUDGET_STATIC", "sometimes", "on/off or auto"),
    ("SGLANG_DSPARK_DECISION_MAX_AGE_S", "-5", "a number > 0"),
    ("SGLANG_DSPARK_DECISION_MAX_AGE_S", "0", "a number > 0"),
    ("SGLANG_DSPARK_DECISION_MAX_AGE_S", "nan", "a number > 0"),
    ("SGLANG_DSPARK_EXPLORE_PROB", "1.5", "a number >= 0 and <= 1"),
    ("SGLANG_DSPARK_LOG_INTERVAL_S", "soon", "a number >= 0"),
    ("SGLANG_DSPARK_AB_SEED", "1.5", "an integer >= 0"),
    ("SGLANG_DSPARK_CAPTURE_MAX_ROWS", "0", "an integer >= 1"),
    ("SGLANG_DSPARK_CONTROLLER", "garbage", "tcp://HOST:PORT"),
    ("SGLANG_DSPARK_CONTROLLER", "tcp://127.0.0.1", "tcp://HOST:PORT"),
    ("SGLANG_DSPARK_CONTROLLER", "tcp://127.0.0.1:99999", "tcp://HOST:PORT"),
    ("SGLANG_DSPARK_CONTROLLER", "inproc://x", "tcp://HOST:PORT"),
    ("SGLANG_DSPARK_FUSED_SEQ_HEAD", "cuda", "one of auto, triton, torch, upstream"),
    ("SGLANG_DSPARK_SEQ_HEAD_LAUNCH", "fast", "one of auto, persistent, stepwise"),
])
def test_bad_values_name_the_variable_the_value_and_what_to_write(name, raw, says):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({name: raw})
    msg = str(e.value)
    assert msg.startswith(f"{name}={raw!r} is not valid: ") and says in msg and "\n" not in msg


def test_every_bad_value_is_reported_at_once():
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"SGLANG_DSPARK_ONLINE": "maybe", "SGLANG_DSPARK_CONTROLLER": "x"})
    assert "SGLANG_DSPARK_ONLINE" in str(e.value) and "SGLANG_DSPARK_CONTROLLER" in str(e.value)


@pytest.mark.parametrize("addr", ["tcp://127.0.0.1:7150", "tcp://ctrl.example.org:1", "tcp://[::1]:7150",
                                  "ipc:///run/dspark/c"])
def test_good_controller_addresses(addr):
    assert Settings.from_env({"SGLANG_DSPARK_CONTROLLER": addr}).controller == addr


def test_empty_value_means_unset():
    assert Settings.from_env({"SGLANG_DSPARK_ONLINE": "", "SGLANG_DSPARK_CONTROLLER": " "}) == Settings.from_env({})


def test_unknown_prefixed_variables_are_listed_not_fatal():
    env = {"SGLANG_DSPARK_ONLNE": "0", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1", "SGLANG_DSPARK_ONLINE": "0"}
    assert st.unknown_variables(env) == ["SGLANG_DSPARK_ONLNE"]
    assert Settings.from_env(env).online is False


def test_declared_once_and_no_other_reader_parses_our_variables():
    """grep: outside settings.py no module reads an SGLANG_DSPARK_* variable itself."""
    names = {v.name for v in st.VARS}
    assert len(names) == len(st.VARS) and len({v.attr for v in st.VARS}) == len(st.VARS)
    reader = re.compile(r"(os\.environ(\.get)?\s*[\[(]|os\.getenv\()\s*[\"'](SGLANG_DSPARK_[A-Z_]+)")
    offenders = []
    for pkg in ("sglang_dspark", "controller/dspark_controller", "kernels/dspark_kernels"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name == "settings.py":
                continue
            for m in reader.finditer(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}: {m.group(3)}")
    assert not offenders, offenders


def test_docs_carry_the_generated_table():
    doc = (ROOT / "docs" / "worker.md").read_text()
    assert st.markdown_table() in doc, "regenerate with: python -m sglang_dspark.settings"


def test_settings_module_is_pure_python():
    code = ("import sys, sglang_dspark.settings as s; s.Settings.from_env({}); "
            "bad = [m for m in ('torch', 'sglang', 'numpy', 'zmq') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_environment_exits_2_with_one_line():
    code = "import sglang_dspark.settings as s; s.check_environment()"
    env = {"SGLANG_DSPARK_ONLINE": "maybe", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 2
    assert r.stderr.strip() == ("sglang-dspark: SGLANG_DSPARK_ONLINE='maybe' is not valid: "
                                "write 1/0, true/false or on/off")
