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


def test_entry_points_are_registered_by_two_distributions():
    from importlib.metadata import entry_points

    plugins = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    platforms = {ep.name: ep for ep in entry_points(group="sglang.srt.platforms")}
    assert plugins["dspark"].value == "sglang_dspark.plugin:load"
    assert plugins["dspark"].dist.name == "sglang-dspark"
    assert platforms["dspark_cpu_boot"].value == "sglang_dspark.cpu.boot:activate"
    assert platforms["dspark_cpu_boot"].dist.name == "sglang-dspark-cpu-boot"
    # SGLANG_PLATFORM skips every plugin of a distribution that ships a platform entry point
    # (srt/plugins _get_excluded_dists): ours must ship none
    assert not [ep.name for ep in platforms.values() if ep.dist and ep.dist.name == "sglang-dspark"]


def test_skip_reason_follows_sglangs_plugin_filters():
    from sglang.srt import plugins as sgl_plugins
    from sglang_dspark.plugin import skip_reason

    assert skip_reason({}) is None
    assert skip_reason({"SGLANG_PLUGINS": " dspark , other"}) is None
    msg = skip_reason({"SGLANG_PLUGINS": "other"})
    assert "SGLANG_PLUGINS='other' does not list 'dspark'" in msg and "add 'dspark'" in msg
    # any platform selected: our distribution is not among SGLang's excluded ones
    assert skip_reason({"SGLANG_PLATFORM": "some_vendor"}) is None
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"SGLANG_PLATFORM": "some_vendor"}):
        excluded = sgl_plugins._get_excluded_dists()
    assert "sglang-dspark-cpu-boot" in excluded and "sglang-dspark" not in excluded


def test_cpu_intent_detection(monkeypatch):
    from sglang_dspark.cpu import boot

    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    assert boot.cpu_intended(["x", "--device", "cpu"])
    assert boot.cpu_intended(["x", "--device=cpu"])
    assert not boot.cpu_intended(["x", "--device", "cuda"])
    monkeypatch.setenv("SGLANG_DSPARK_CPU", "0")
    assert not boot.cpu_intended(["x", "--device", "cpu"])


def test_cpu_boot_returns_sglangs_cpu_platform_only_when_selected_by_name(monkeypatch, caplog):
    from sglang_dspark.cpu import boot

    installed = []
    monkeypatch.setattr(boot, "install_sgl_kernel_cpu_ops", lambda: installed.append(1))
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    assert boot.activate() is None          # auto-discovery: SGLang's own CPU fallback
    monkeypatch.setenv("SGLANG_PLATFORM", "dspark_cpu_boot")
    assert boot.activate() == boot.CPU_PLATFORM
    assert len(installed) == 2
    import pkgutil

    from sglang.srt.platforms.interface import SRTPlatform

    assert issubclass(pkgutil.resolve_name(boot.CPU_PLATFORM), SRTPlatform)
    monkeypatch.setenv("SGLANG_PLUGINS", "dspark_cpu_boot")     # our general plugin left out
    with caplog.at_level("WARNING", logger=boot.logger.name):
        boot.activate()
    assert "does not list 'dspark'" in caplog.text


def test_plugin_state_is_json_safe():
    import json

    from sglang_dspark.worker import _json_safe

    state = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}}
    out = _json_safe(state)
    json.dumps(out, allow_nan=False)
    assert out == {"a": None, "b": [1.0, None], "c": {"d": 2}}
