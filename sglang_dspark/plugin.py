"""SGLang general-plugin entry point (group ``sglang.srt.plugins``)."""

from __future__ import annotations


def load() -> None:
    """Called by SGLang's ``load_plugins()`` in every SGLang process."""
    from sglang_dspark import seams, settings

    settings.check_environment()   # a bad SGLANG_DSPARK_* value: one line, exit 2
    seams.install()
