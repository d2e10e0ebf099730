"""Interleaved A/B of verify-budget policies on one live server (off by default).

``SGLANG_DSPARK_AB_ARMS="policy,upstream,fixed@1,fixed@0.5"`` makes the worker run its
decode steps under several budget policies ("arms") in turn: every cycle of ``n`` steps
runs each of the ``n`` arms once, in an order shuffled by a private RNG, and the worker
adds each step's measured time and output tokens to its arm's totals
(``plugin_state()["ab"]``).  Arms:

* ``policy``: what the server does without A/B (exploration, the controller, the local
  online profile: :class:`dspark_controller.core.policy.BudgetPolicy`);
* ``upstream``: SGLang's own planner with its static table
  (``--speculative-dspark-sps-table-path``; none = verify everything), fed SGLang's
  uncalibrated lagged survival, exactly as without our plugin;
* ``fixed@F``: ``floor(F * all draft tokens)`` of the step (``fixed@1`` verifies every
  draft; on CPU it runs SGLang's uniform verify path, see ``SGLANG_DSPARK_FULL_BUDGET_STATIC``);
* ``off``: a no-draft step (no draft forward; the target decodes one token per request,
  :mod:`sglang_dspark.no_draft`): what plain decoding gives on the same server.

Why: on a shared or noisy machine, two servers (or two chunks of one) measured a minute
apart differ by 10-20% for reasons that have nothing to do with the policy.  Neighbouring
steps of one batch see the same machine, the same requests and the same contexts, so the
machine's drift cancels out of per-arm throughput ``sum(tokens) / sum(step seconds)``
(``benchmarks/ab_bench.py``: step-time ratios repeat within 1% between runs).  Caveat:
the arms share the requests, so a step starts where the previous step, another arm's,
stopped; an arm that truncates hard leaves the next step an easy start and hands the
other arms some of its acceptance (docs/benchmarks.md measures it).

Honest accounting: only ``policy`` steps teach the local profile and the controller's
telemetry (the other arms would hand the policy measurements it did not pay for), and
the ``policy`` arm pays for its own exploration.  Lossless: the arm of a step comes from
the step count and a private RNG, never from tokens; every arm admits tokens through
SGLang's top-K rule, so greedy output is the same under any mix of arms.  Costs
throughput (the losing arms run too): a diagnostic for benchmarks and canaries, not a
production setting.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence

ENV_ARMS = "SGLANG_DSPARK_AB_ARMS"
ENV_SEED = "SGLANG_DSPARK_AB_SEED"


class ArmSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Arm:
    name: str                    # as written in the spec, normalised (fixed@0.5)
    kind: str                    # "policy" | "upstream" | "fixed" | "off"
    frac: Optional[float] = None  # fixed arms only


def parse_arms(spec: str) -> tuple[Arm, ...]:
    """Arms from a comma-separated spec; raises :class:`ArmSpecError` with what to write."""
    arms: list[Arm] = []
    for raw in (spec or "").split(","):
        word = raw.strip().lower()
        if not word:
            continue
        if word in ("policy", "upstream", "off"):
            arm = Arm(name=word, kind=word)
        elif word.startswith("fixed@"):
            try:
                f = float(word[len("fixed@"):])
            except ValueError:
                f = float("nan")
            if not 0.0 <= f <= 1.0:
                raise ArmSpecError(f"{ENV_ARMS}: {raw.strip()!r}: a fixed arm is fixed@F with F in [0, 1], "
                                   "e.g. fixed@0.5")
            arm = Arm(name=f"fixed@{f:g}", kind="fixed", frac=f)
        else:
            raise ArmSpecError(f"{ENV_ARMS}: unknown arm {raw.strip()!r}; use policy, upstream, off or "
                               "fixed@F (comma-separated), e.g. policy,upstream,off,fixed@1,fixed@0.5")
        if any(a.name == arm.name for a in arms):
            raise ArmSpecError(f"{ENV_ARMS}: arm {arm.name!r} is listed twice")
        arms.append(arm)
    if len(arms) < 2:
        raise ArmSpecError(f"{ENV_ARMS}: an A/B needs at least two arms, got {spec!r}")
    return tuple(arms)


class ArmRotation:
    """Each cycle of ``len(arms)`` steps runs every arm once, in a shuffled order."""

    def __init__(self, arms: Sequence[Arm], *, seed: int = 0) -> None:
        self.arms = tuple(arms)
        self._rng = random.Random(seed)
        self._cycle: list[Arm] = []

    def next(self) -> Arm:
        if not self._cycle:
            self._cycle = list(self.arms)
            self._rng.shuffle(self._cycle)
        return self._cycle.pop()


class ArmLedger:
    """Per-arm totals of measured steps: the A/B's result, read as cumulative counters
    (a reader diffs two snapshots to get one window, as with Prometheus counters)."""

    FIELDS = ("steps", "step_s", "tokens", "requests", "verified_drafts", "uniform_steps")

    def __init__(self, arms: Sequence[Arm]) -> None:
        self.totals = {a.name: dict.fromkeys(self.FIELDS, 0) for a in arms}
        for t in self.totals.values():
            t["step_s"] = 0.0

    def observe(self, arm: str, *, num_requests: int, step_s: float, accepted_drafts: Sequence[int],
                verified_drafts: Optional[int], uniform: bool) -> None:
        """One step: ``accepted_drafts`` per request (the bonus token is added here)."""
        t = self.totals.get(arm)
        if t is None or not step_s > 0:
            return
        t["steps"] += 1
        t["step_s"] += float(step_s)
        t["tokens"] += int(sum(accepted_drafts)) + len(accepted_drafts)
        t["requests"] += int(num_requests)
        t["verified_drafts"] += int(verified_drafts or 0)
        t["uniform_steps"] += int(bool(uniform))

    def snapshot(self) -> dict:
        out = {}
        for name, t in self.totals.items():
            d = dict(t)
            d["step_s"] = round(d["step_s"], 6)
            d["tok_per_s"] = round(t["tokens"] / t["step_s"], 3) if t["step_s"] > 0 else None
            out[name] = d
        return out


@dataclass(frozen=True)
class AbConfig:
    arms: tuple[Arm, ...]
    seed: int = 0

    @classmethod
    def from_settings(cls, settings) -> Optional["AbConfig"]:
        """``settings.ab_arms`` / ``ab_seed`` (None when no arms are set)."""
        spec = (settings.ab_arms or "").strip()
        if not spec:
            return None
        return cls(arms=parse_arms(spec), seed=int(settings.ab_seed))
