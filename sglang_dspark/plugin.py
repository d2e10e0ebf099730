"""SGLang general-plugin entry point (group ``sglang.srt.plugins``).

SGLang's ``load_plugins()`` runs :func:`load` in every SGLang process unless the
environment tells it to skip us; :func:`skip_reason` states those rules, so code that
runs earlier (the CPU bootstrap) can say so instead of DSPARK silently being SGLang's
own worker.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Mapping

ENTRY_POINT = "dspark"            # our name in sglang.srt.plugins
DISTRIBUTION = "sglang-dspark"    # the distribution that ships it


def load() -> None:
    """Called by SGLang's ``load_plugins()`` in every SGLang process."""
    from sglang_dspark import seams, settings

    settings.check_environment()   # a bad SGLANG_DSPARK_* value: one line, exit 2
    seams.install()


def skip_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why SGLang's ``load_plugins()`` would not run :func:`load` here, or None.

    Rules (SGLang 0.5.23 ``srt/plugins/__init__.py``): ``SGLANG_PLUGINS``, when set, is a
    whitelist of entry-point names; ``SGLANG_PLATFORM``, when set, excludes every
    distribution that ships a platform entry point other than the selected one.
    """
    env = os.environ if environ is None else environ
    allowed = env.get("SGLANG_PLUGINS", "")
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    if names and ENTRY_POINT not in names:
        return (f"SGLANG_PLUGINS={allowed!r} does not list {ENTRY_POINT!r}, so SGLang skips "
                f"sglang-dspark and DSPARK runs SGLang's own worker: add {ENTRY_POINT!r} to it")
    selected = env.get("SGLANG_PLATFORM", "")
    if selected:
        ours = sorted(ep.name for ep in entry_points(group="sglang.srt.platforms")
                      if ep.dist is not None and ep.dist.name == DISTRIBUTION and ep.name != selected)
        if ours:
            return (f"SGLANG_PLATFORM={selected!r} excludes the {DISTRIBUTION!r} distribution, "
                    f"which ships the platform entry point {ours[0]!r} (an old install): "
                    f"reinstall it (make install) so that entry point lives in "
                    f"sglang-dspark-cpu-boot")
    return None
