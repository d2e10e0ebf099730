"""Acceptance metrics from captured verify rounds.

A *verify round* is one request in one decode step: the draft proposed ``gamma``
tokens, the target verified the first ``verified`` of them (all ``gamma`` in static
mode) and accepted the first ``accepted``; the round then commits ``accepted + 1``
tokens (the bonus / correction token from the target).

* ``tau`` = accepted + 1 per round (mean and distribution over 1..gamma+1).
* per-position conditional acceptance ``p_k = P(position k accepted | positions < k
  accepted)`` = #rounds with accepted >= k / #rounds with accepted >= k-1 (only rounds
  that verified position k count: compact/cap-accept rounds that stopped short are
  censored there, not rejections).
* ``tau_from_positions`` = 1 + sum_k prod_{i<=k} p_i, which equals mean tau exactly when
  every round verified all gamma positions (static mode): a consistency check.
* verify efficiency = sum accepted / sum verified draft tokens.
"""

from __future__ import annotations

import math

import numpy as np


def rounds_arrays(rounds: list[dict]) -> tuple[np.ndarray, np.ndarray, int]:
    if not rounds:
        return np.zeros(0, int), np.zeros(0, int), 0
    gamma = int(rounds[0]["gamma"])
    acc = np.array([int(r["accepted"]) for r in rounds])
    ver = np.array([int(r["verified"]) for r in rounds])
    return acc, ver, gamma


def acceptance_summary(accepted: np.ndarray, verified: np.ndarray, gamma: int) -> dict:
    accepted = np.asarray(accepted, dtype=np.int64)
    verified = np.asarray(verified, dtype=np.int64)
    n = int(accepted.size)
    if n == 0:
        return {"rounds": 0}
    if (accepted > verified).any() or (verified > gamma).any() or (accepted < 0).any():
        raise ValueError("inconsistent rounds: need 0 <= accepted <= verified <= gamma")
    tau = accepted + 1
    hist = np.bincount(tau, minlength=gamma + 2)[1:gamma + 2]
    per_pos = []
    prod = 1.0
    tau_from = 1.0
    for k in range(1, gamma + 1):
        at_risk = (verified >= k) & (accepted >= k - 1)
        ok = at_risk & (accepted >= k)
        n_risk, n_ok = int(at_risk.sum()), int(ok.sum())
        p = n_ok / n_risk if n_risk else float("nan")
        prod = prod * p if n_risk else prod
        tau_from += prod if n_risk else 0.0
        per_pos.append({"position": k, "rounds_reaching": n_risk, "accepted": n_ok,
                        "p_conditional": p, "p_prefix": prod})
    return {
        "rounds": n,
        "gamma": gamma,
        "tau_mean": float(tau.mean()),
        "tau_std": float(tau.std()),
        "tau_distribution": {str(t): float(c) / n for t, c in zip(range(1, gamma + 2), hist)},
        "tau_counts": {str(t): int(c) for t, c in zip(range(1, gamma + 2), hist)},
        "per_position": per_pos,
        "tau_from_positions": tau_from,
        "verified_draft_tokens": int(verified.sum()),
        "accepted_draft_tokens": int(accepted.sum()),
        "verify_efficiency": float(accepted.sum()) / float(verified.sum()) if verified.sum() else float("nan"),
        "all_positions_verified": bool((verified == gamma).all()),
    }


def served_summary(requests: list[dict], gamma: int) -> dict:
    """SGLang's own per-request accounting (meta_info), as a cross-check.

    ``completion_tokens / spec_verify_ct`` counts the prefill's first token and the
    tokens cut at ``max_new_tokens`` / EOS, so it differs from the captured tau
    slightly; ``spec_correct_drafts_histogram`` should match the captured rounds."""
    comp = sum(int(q["meta"].get("completion_tokens", 0)) for q in requests)
    ver = sum(int(q["meta"].get("spec_verify_ct", 0) or 0) for q in requests)
    correct = sum(int(q["meta"].get("spec_num_correct_drafts", 0) or 0) for q in requests)
    hist = np.zeros(gamma + 1, dtype=np.int64)
    for q in requests:
        h = q["meta"].get("spec_correct_drafts_histogram") or []
        for i, c in enumerate(h[:gamma + 1]):
            hist[i] += int(c)
    return {"requests": len(requests), "completion_tokens": comp, "spec_verify_ct": ver,
            "tau_served": comp / ver if ver else float("nan"),
            "spec_num_correct_drafts": correct,
            "correct_drafts_histogram": hist.tolist()}


def finite_or_none(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x
