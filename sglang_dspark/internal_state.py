"""``/set_internal_state`` keys sglang-dspark adds to SGLang's scheduler.

SGLang 0.5.23 pins a DSpark budget with ``{"server_args": {"dspark_force_budget_frac": f}}``
and its scheduler would take ``null`` to un-pin, but the HTTP request type only carries
numbers, so a pin cannot be lifted without a restart.  We add one key:

``{"server_args": {"dspark_unpin_budget": 1}}``
    lift the operator's pinned fraction: the worker's own policy (online profile,
    controller, or SGLang's table) decides again from the next step.

``{"server_args": {"dspark_draft": 1 | 0 | -1}}``
    pin drafting on (1: every decode step drafts) or off (0: no-draft steps only, plain
    decoding; :mod:`sglang_dspark.no_draft`), or lift the pin (-1: the policy's gate
    decides again).  Refused where no-draft steps cannot run (the reason is logged).

Installed as an AFTER hook on ``SchedulerInternalStateController._update_handlers``
(listed in :mod:`sglang_dspark.seams`); validation and the apply step reuse SGLang's own
handler type, so a rejected value answers ``{"updated": false}`` with a logged reason,
like SGLang's keys.
"""

from __future__ import annotations

from typing import Any

UNPIN_KEY = "dspark_unpin_budget"
DRAFT_KEY = "dspark_draft"
_DRAFT_PINS = {1: True, 0: False, -1: None}


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

    def validate_draft(key: str, value: Any) -> None:
        controller._require_dspark_worker(key, "set_dspark_draft_pin")
        if isinstance(value, bool) or value not in _DRAFT_PINS:
            raise UpdateRejected(f"{key} takes 1 (draft every step), 0 (no-draft steps only) or -1 "
                                 f"(lift the pin: the policy decides), got {value!r}.")
        why = controller.scheduler.draft_worker.draft_pin_refusal()
        if why:      # SGLang calls apply unguarded: every refusal is decided here
            raise UpdateRejected(f"{key}: {why}")

    def apply_draft(key: str, value: Any) -> None:
        controller.scheduler.draft_worker.set_dspark_draft_pin(_DRAFT_PINS[int(value)])

    return {**handlers, UNPIN_KEY: _UpdateHandler(validate, apply),
            DRAFT_KEY: _UpdateHandler(validate_draft, apply_draft)}
