"""``/set_internal_state`` keys sglang-dspark adds to SGLang's scheduler.

SGLang 0.5.23 pins a DSpark budget with ``{"server_args": {"dspark_force_budget_frac": f}}``
and its scheduler would take ``null`` to un-pin, but the HTTP request type only carries
numbers, so a pin cannot be lifted without a restart.  We add one key:

``{"server_args": {"dspark_unpin_budget": 1}}``
    lift the operator's pinned fraction: the worker's own policy (online profile,
    controller, or SGLang's table) decides again from the next step.

Installed as an AFTER hook on ``SchedulerInternalStateController._update_handlers``
(listed in :mod:`sglang_dspark.seams`); validation and the apply step reuse SGLang's own
handler type, so a rejected value answers ``{"updated": false}`` with a logged reason,
like SGLang's keys.
"""

from __future__ import annotations

from typing import Any

UNPIN_KEY = "dspark_unpin_budget"


def update_handlers_hook(handlers: dict, controller, *args, **kwargs) -> dict:
    """AFTER hook on ``SchedulerInternalStateController._update_handlers``: SGLang's handler
    table (``handlers``) plus ours."""
    from sglang.srt.managers.scheduler_components.internal_state import UpdateRejected, _UpdateHandler

    def validate(key: str, value: Any) -> None:
        controller._require_dspark_worker(key, "set_dspark_forced_budget_frac")
        if value != 1:
            raise UpdateRejected(f"{key} takes 1 (lift the pinned DSpark budget fraction), got {value!r}.")

    def apply(key: str, value: Any) -> None:
        controller.scheduler.draft_worker.set_dspark_forced_budget_frac(None)

    return {**handlers, UNPIN_KEY: _UpdateHandler(validate, apply)}
