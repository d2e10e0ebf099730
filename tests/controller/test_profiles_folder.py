"""Where ``dspark-controller serve`` keeps profiles, and what it says about the files it finds there.

Real ``serve`` subprocesses: the default folder is a per-user state folder (never the working
directory, which in a clone is the repository with its committed ``profiles/``); files that are
not profiles (SGLang tables, provenance notes, READMEs) are ignored without a word; a file that
claims to be a profile and does not load gets one warning naming it and what is wrong, and
nothing is deleted or rewritten.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

from dsc_helpers import ControllerProc, fingerprint, replay, subprocess_env, wait_for
from dspark_controller.core.profile_file import default_profiles_dir, load_profile
from dspark_controller.sim.synthetic import CURVES

REPO = Path(__file__).resolve().parents[2]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _warnings(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]


def _serve(short_tmp: Path, cwd: Path, env: dict[str, str], *extra: str, name: str = "ctl") -> ControllerProc:
    return ControllerProc(workdir=cwd, bind=f"ipc://{short_tmp}/c", name=name, env=env,
                          extra=["--persist-interval-s", "600", *extra]).start()


def test_default_folder_is_per_user_state_not_the_working_directory(short_tmp, clients):
    clone = short_tmp / "clone"                      # a clone: its working directory holds profiles/
    shutil.copytree(REPO / "profiles", clone / "profiles")
    shipped = _snapshot(clone / "profiles")
    assert any(n.endswith(".profile.json") for n in shipped) and any("sglang-sps-table" in n for n in shipped)
    home, state = short_tmp / "home", short_tmp / "state"
    home.mkdir()
    env = subprocess_env() | {"HOME": str(home), "XDG_STATE_HOME": str(state)}
    ctl = _serve(short_tmp, clone, env)
    try:
        st = ctl.status()
        assert st.profiles == [], "the controller loaded a profile from the working directory's profiles/"
        c = clients(address=ctl.bind, fingerprint=fingerprint(), engine_id="w1")
        wait_for(lambda: c.link_state == "connected", 15)
        replay(c, CURVES["smooth"], steps=120, seed=2)
        wait_for(lambda: ctl.status().counters.get("telemetry_steps", 0) >= 120, 15, what="telemetry")
        where = ctl.status().profiles[0].path
        assert where == str(state / "sglang-dspark" / "profiles" / f"{fingerprint().profile_key()}.json")
    finally:
        c.close()                    # else it re-registers with ctl2, which binds the same address
        assert ctl.stop(signal.SIGTERM) == 0
    log = ctl.log()
    assert load_profile(where).samples_seen == 120                       # persisted there on SIGTERM
    assert _snapshot(clone / "profiles") == shipped                      # the clone is untouched
    assert not _warnings(log), log
    assert f"profiles: none yet in {state}/sglang-dspark/profiles" in log

    # no (or a relative, hence invalid) XDG_STATE_HOME: ~/.local/state/sglang-dspark/profiles
    env2 = subprocess_env() | {"HOME": str(home), "XDG_STATE_HOME": "relative/state"}
    ctl2 = _serve(short_tmp, clone, env2, name="ctl2")
    try:
        assert ctl2.status().profiles == []
    finally:
        ctl2.stop(signal.SIGTERM)
    assert f"profiles: none yet in {home}/.local/state/sglang-dspark/profiles" in ctl2.log()
    assert not (clone / "relative").exists()


def test_default_profiles_dir_rule(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    assert default_profiles_dir() == "/srv/state/sglang-dspark/profiles"
    for value in ("", "rel/ative"):
        monkeypatch.setenv("XDG_STATE_HOME", value)
        assert default_profiles_dir() == str(tmp_path / ".local" / "state" / "sglang-dspark" / "profiles")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_profiles_dir() == str(tmp_path / ".local" / "state" / "sglang-dspark" / "profiles")


def test_other_files_are_ignored_and_a_broken_profile_is_named_not_deleted(short_tmp):
    d = short_tmp / "shared"                           # e.g. --profiles-dir pointed at a repository's profiles/
    shutil.copytree(REPO / "profiles", d)
    (d / "README.md").write_text("# measured profiles\n")
    (d / "notes.json").write_text(json.dumps({"made_by": "a person", "numbers": [1, 2, 3]}))
    (d / "list.json").write_text("[1, 2]")
    (d / "null.json").write_text("null")
    good = json.loads((REPO / "profiles" / "tiny-cpu-2core.profile.json").read_text())
    broken = dict(good)
    broken["fingerprint"] = {k: v for k, v in good["fingerprint"].items() if k != "gamma"}
    (d / "broken.json").write_text(json.dumps(broken))
    (d / "0123456789abcdef.json").write_text("{truncated")   # the name the controller saves under
    before = _snapshot(d)
    env = subprocess_env() | {"HOME": str(short_tmp / "home"), "XDG_STATE_HOME": str(short_tmp / "state")}
    ctl = _serve(short_tmp, short_tmp, env, "--profiles-dir", str(d))
    try:
        st = ctl.status()
        assert [p.profile_key for p in st.profiles] == [good["profile_key"]]     # the valid one loads
    finally:
        assert ctl.stop(signal.SIGTERM) == 0
    log = ctl.log()
    warns = _warnings(log)
    assert len(warns) == 2, log
    w_broken = next(w for w in warns if "broken.json" in w)
    assert "fingerprint.gamma" in w_broken and "Field required" in w_broken and "validate" in w_broken
    w_trunc = next(w for w in warns if "0123456789abcdef.json" in w)
    assert "JSON" in w_trunc
    for quiet in ("sglang-sps-table", "provenance", "README", "notes.json", "list.json", "null.json"):
        assert not any(quiet in w for w in warns), (quiet, warns)
    assert "delete" not in log.lower()
    assert "profiles: 1 loaded from" in log
    assert _snapshot(d) == before                      # nothing deleted, rewritten or added
