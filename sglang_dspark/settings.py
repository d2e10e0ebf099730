"""Every ``SGLANG_DSPARK_*`` environment variable, declared once.

Each variable is a :class:`Var`: its name, a typed parser, its default and what it
means.  :func:`parse` is the one parser every reader uses, with one vocabulary:

* switches: ``1 | true | on`` and ``0 | false | off`` (case-insensitive; some take
  ``auto`` as well);
* numbers: decimal text, with the bounds each variable states;
* anything else is a :class:`SettingsError` naming the variable, the value and what to
  write instead.

:meth:`Settings.from_env` reads them all at once (every bad value reported in one
message); the plugin calls it when SGLang loads it in the launching process, so a
nonsense value stops start-up with that message and exit status 2 before any
scheduler process exists (:func:`check_environment`).  The worker builds one
:class:`Settings` and passes its fields down; the simulator and tests build
``Settings(...)`` explicitly.  ``python -m sglang_dspark.settings`` prints the table
docs/worker.md carries.

This module is pure Python (no torch, no SGLang): ``dspark_kernels`` reads its two
variables through it too.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

_ON, _OFF = ("1", "true", "on"), ("0", "false", "off")


class SettingsError(ValueError):
    """A bad ``SGLANG_DSPARK_*`` value; the message names the variable and the value."""


# --------------------------------------------------------------------------- parsers
# Each takes the stripped text and returns the value or raises ValueError(hint).

def _switch(raw: str) -> bool:
    v = raw.lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    raise ValueError("write 1/0, true/false or on/off")


def _switch_auto(raw: str) -> Optional[bool]:
    if raw.lower() == "auto":
        return None
    try:
        return _switch(raw)
    except ValueError:
        raise ValueError("write 1/0, true/false, on/off or auto") from None


def _number(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
            integer: bool = False) -> Callable[[str], float]:
    what = "an integer" if integer else "a number"
    lo_txt = "" if lo == -math.inf else (f"> {lo:g}" if lo_open else f">= {lo:g}")
    hi_txt = "" if hi == math.inf else f"<= {hi:g}"
    bounds = " and ".join(t for t in (lo_txt, hi_txt) if t)
    hint = f"write {what}" + (f" {bounds}" if bounds else "")

    def parse(raw: str):
        try:
            v = int(raw) if integer else float(raw)
        except ValueError:
            raise ValueError(hint) from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            raise ValueError(hint)
        return v

    parse.hint = hint
    return parse


def _choice(*values: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        v = raw.lower() or values[0]
        if v not in values:
            raise ValueError("write one of " + ", ".join(values))
        return v

    parse.values = values
    return parse


def _text(raw: str) -> str:
    return raw


_TCP = re.compile(r"^tcp://(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})$")


def zmq_address(raw: str) -> str:
    """A ZeroMQ endpoint a worker can connect to: ``tcp://HOST:PORT`` or ``ipc://PATH``
    (not ``inproc://``: the controller runs in another process); raises ValueError with
    what to write otherwise.  The controller's client checks the same rules in full
    (``dspark_controller`` ``endpoints.check_endpoint``)."""
    hint = "write tcp://HOST:PORT (e.g. tcp://127.0.0.1:7150) or ipc://PATH"
    m = _TCP.match(raw)
    if m:
        if not 0 < int(m.group(2)) < 65536:
            raise ValueError(hint)
        return raw
    if raw.startswith("ipc://") and raw[len("ipc://"):]:
        return raw
    raise ValueError(hint)


# --------------------------------------------------------------------------- declaration
@dataclass(frozen=True)
class Var:
    name: str                       # the environment variable
    attr: str                       # the Settings field
    parse: Callable[[str], Any]
    default: Any
    kind: str                       # how docs describe the accepted text
    meaning: str


VARS: tuple[Var, ...] = (
    Var("SGLANG_DSPARK_ONLINE", "online", _switch, True, "on/off",
        "local online planning of verify budgets (compact / cap-accept modes); off: "
        "SGLang's table (or verify-all) decides and the controller link is off"),
    Var("SGLANG_DSPARK_CPU", "cpu", _switch, True, "on/off",
        "CPU support (sgl_kernel CPU ops, dspark_cpu attention, CPU patches) when "
        "--device cpu; off: none of it"),
    Var("SGLANG_DSPARK_PROFILE", "profile", _text, None, "path or none",
        "profile file seeding the local SPS model; `none` seeds nothing even when "
        "SGLang has a table; unset: SGLang's --speculative-dspark-sps-table-path, if any"),
    Var("SGLANG_DSPARK_CONTROLLER", "controller", zmq_address, None, "ZeroMQ address",
        "the controller's worker endpoint (tcp://HOST:PORT or ipc://PATH); unset: no "
        "controller, the local model decides"),
    Var("SGLANG_DSPARK_CONTROLLER_SERVER_KEY", "controller_server_key", _text, None,
        "Z85 key or file", "CurveZMQ: the controller's public key (required off loopback)"),
    Var("SGLANG_DSPARK_CONTROLLER_CLIENT_KEY", "controller_client_key", _text, None,
        "file", "CurveZMQ: this client's secret key file"),
    Var("SGLANG_DSPARK_ENGINE_ID", "engine_id", _text, None, "text",
        "engine id prefix for the controller (default <host>:<port>); ranks are appended"),
    Var("SGLANG_DSPARK_DECISION_MAX_AGE_S", "decision_max_age_s",
        _number(0.0, lo_open=True), 2.0, "seconds > 0",
        "controller decisions older than this are ignored (the local model decides)"),
    Var("SGLANG_DSPARK_EXPLORE_PROB", "explore_prob", _number(0.0, 1.0), None,
        "number in [0, 1]",
        "fixed share of steps with a random budget, replacing the young/settled "
        "schedule; 0 disables exploration"),
    Var("SGLANG_DSPARK_NO_DRAFT", "no_draft", _switch, True, "on/off",
        "no-draft steps: the policy may decode a whole step without drafting (plain "
        "decoding) when that gives more tokens/s than any verify budget; off: every decode "
        "step drafts"),
    Var("SGLANG_DSPARK_LEARN_FORCED", "learn_forced", _switch, True, "on/off",
        "steps run at an operator-pinned budget teach the profile and the controller"),
    Var("SGLANG_DSPARK_FULL_BUDGET_STATIC", "full_budget_static", _switch_auto, None,
        "on/off/auto",
        "a step that verifies every draft runs SGLang's uniform path instead of a full "
        "ragged layout; auto: on for CPU devices, off elsewhere (on CUDA it runs such "
        "steps eagerly, outside the ragged CUDA graphs)"),
    Var("SGLANG_DSPARK_LOG_INTERVAL_S", "log_interval_s", _number(0.0), 30.0,
        "seconds >= 0", "at most one worker state line per interval; 0: none"),
    Var("SGLANG_DSPARK_AB_ARMS", "ab_arms", _text, None, "arm list",
        "step-interleaved A/B of budget policies, e.g. policy,upstream,fixed@1,fixed@0.5 "
        "(a benchmark/canary setting, sglang_dspark.ab)"),
    Var("SGLANG_DSPARK_AB_SEED", "ab_seed", _number(0, integer=True), 0, "integer >= 0",
        "seed of the A/B arm order"),
    Var("SGLANG_DSPARK_CAPTURE", "capture", _text, None, "path",
        "write per-step confidences and acceptance to this JSONL file (rank 0)"),
    Var("SGLANG_DSPARK_CAPTURE_MAX_ROWS", "capture_max_rows", _number(1, integer=True),
        1_000_000, "integer >= 1", "capture stops after this many request rows"),
    Var("SGLANG_DSPARK_FUSED_SEQ_HEAD", "fused_seq_head",
        _choice("auto", "triton", "torch", "upstream"), "auto",
        "auto/triton/torch/upstream",
        "which sequential-head implementation runs SGLang's Markov draft walk "
        "(dspark_kernels.backend)"),
    Var("SGLANG_DSPARK_SEQ_HEAD_LAUNCH", "seq_head_launch",
        _choice("auto", "persistent", "stepwise"), "auto", "auto/persistent/stepwise",
        "launch strategy of the Triton sequential head"),
)
BY_NAME: dict[str, Var] = {v.name: v for v in VARS}


def sglang_owned() -> frozenset[str]:
    """SGLang's own ``SGLANG_DSPARK_*`` variables (declared in its ``srt/environ.py``
    ``Envs``; SGLang parses them): empty when SGLang is not importable."""
    try:
        from sglang.srt.environ import Envs
    except Exception:
        return frozenset()
    return frozenset(n for n in vars(Envs) if n.startswith("SGLANG_DSPARK_"))


def parse(var: Var | str, raw: Optional[str]):
    """The value of ``var`` for the text ``raw`` (None or empty: its default)."""
    var = BY_NAME[var] if isinstance(var, str) else var
    if raw is None or not raw.strip():
        return var.default
    try:
        return var.parse(raw.strip())
    except ValueError as e:
        raise SettingsError(f"{var.name}={raw!r} is not valid: {e}") from None


def read(name: str, environ: Optional[Mapping[str, str]] = None):
    """One variable, parsed from the environment (for readers outside the worker)."""
    env = os.environ if environ is None else environ
    return parse(BY_NAME[name], env.get(name))


def _settings_fields():
    return [(v.attr, Any, field(default=v.default)) for v in VARS]


@dataclass(frozen=True)
class _Base:
    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Settings":
        """Every variable parsed; all bad values reported in one SettingsError."""
        env = os.environ if environ is None else environ
        values, errors = {}, []
        for v in VARS:
            try:
                values[v.attr] = parse(v, env.get(v.name))
            except SettingsError as e:
                errors.append(str(e))
        if errors:
            raise SettingsError("; ".join(errors))
        return cls(**values)


Settings = dataclasses.make_dataclass("Settings", _settings_fields(), bases=(_Base,), frozen=True,
                                      namespace={"__doc__": "The parsed SGLANG_DSPARK_* "
                                                 "variables, one field per :data:`VARS` entry."})
Settings.__module__ = __name__


def unknown_variables(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """``SGLANG_DSPARK_*`` names set in the environment that nothing reads (typos)."""
    env = os.environ if environ is None else environ
    ours = [k for k in env if k.startswith("SGLANG_DSPARK_") and k not in BY_NAME]
    owned = sglang_owned() if ours else frozenset()
    return sorted(k for k in ours if k not in owned)


def check_environment() -> Settings:
    """Parse the environment; on a bad value print one line and exit with status 2.

    Called by the plugin in every SGLang process it loads into: the launching process
    stops before it starts any scheduler, so the user sees the message, not a crash of
    a child process."""
    try:
        settings = Settings.from_env()
    except SettingsError as e:
        print(f"sglang-dspark: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    unknown = unknown_variables()
    if unknown:
        import logging

        logging.getLogger(__name__).warning(
            "sglang-dspark: %s set but not a variable of ours (typo?); `python -m "
            "sglang_dspark.settings` lists them", ", ".join(unknown))
    return settings


def markdown_table() -> str:
    """The table docs/worker.md carries (kept equal by a test)."""
    rows = ["| variable | accepts | default | meaning |", "| --- | --- | --- | --- |"]
    for v in VARS:
        d = v.default
        d = "unset" if d is None else ("on" if d is True else "off" if d is False else str(d))
        rows.append(f"| `{v.name}` | {v.kind} | {d} | {v.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
