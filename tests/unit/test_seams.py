import pytest

from sglang_dspark import seams


def test_every_seam_resolves_in_installed_sglang():
    all_seams = seams.all_seams()
    assert any(s.cpu_only for s in all_seams) and any(not s.cpu_only for s in all_seams)
    seams.verify_targets(all_seams)  # raises if any SGLang symbol moved


def test_moved_symbol_fails_loudly_naming_versions():
    bad = seams.Seam("sglang.srt.speculative.no_such_module.Thing", "around", "x", False)
    with pytest.raises(seams.SeamError, match=r"supports SGLang 0\.5\.23.*no_such_module"):
        seams.verify_targets([bad])


def test_entry_points_are_registered():
    from importlib.metadata import entry_points

    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    platforms = {ep.name: ep.value for ep in entry_points(group="sglang.srt.platforms")}
    assert plugins.get("dspark") == "sglang_dspark.plugin:load"
    assert platforms.get("dspark_cpu_boot") == "sglang_dspark.cpu.boot:activate"


def test_cpu_intent_detection(monkeypatch):
    from sglang_dspark.cpu import boot

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    assert boot.cpu_intended(["x", "--device", "cpu"])
    assert boot.cpu_intended(["x", "--device=cpu"])
    assert not boot.cpu_intended(["x", "--device", "cuda"])
    monkeypatch.setenv("SGLANG_DSPARK_CPU", "0")
    assert not boot.cpu_intended(["x", "--device", "cpu"])


def test_plugin_state_is_json_safe():
    import json

    from sglang_dspark.worker import _json_safe

    state = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}}
    out = _json_safe(state)
    json.dumps(out, allow_nan=False)
    assert out == {"a": None, "b": [1.0, None], "c": {"d": 2}}
