"""Sequential Temperature Scaling (STS) of DSpark confidences, and its metrics.

Data: per verify round, the confidence head's raw logits ``z_1..z_gamma`` and the
realised *prefix acceptance* ``y_k`` = 1 iff draft positions 1..k were all accepted;
``observed_k`` = position k was verified (always, in static mode).

Fit (DSpark paper, section on calibration): for k = 1..gamma in order, choose
``T_k`` minimising ECE( prod_{i<=k} sigmoid(z_i / T_i) , y_k ) with T_1..T_{k-1}
already fixed.  A log-spaced grid, then a finer grid around the best point; ties
(within 1e-9) go to the temperature closest to 1.
ECE: equal-width bins (20 by default, like DeepSpec), weighted by bin counts.
AUC: rank statistic (Mann-Whitney), ties averaged; NaN with a single class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_BINS = 20


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def ece(probs, labels, bins: int = DEFAULT_BINS) -> float:
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if p.size == 0:
        return float("nan")
    idx = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    cnt = np.bincount(idx, minlength=bins)
    sp = np.bincount(idx, weights=p, minlength=bins)
    sy = np.bincount(idx, weights=y, minlength=bins)
    return float(np.abs(sp - sy).sum() / p.size)


def reliability_bins(probs, labels, bins: int = DEFAULT_BINS) -> list[dict]:
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    idx = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    out = []
    for b in range(bins):
        m = idx == b
        if m.any():
            out.append({"lo": b / bins, "hi": (b + 1) / bins, "count": int(m.sum()),
                        "mean_pred": float(p[m].mean()), "frac_pos": float(y[m].mean())})
    return out


def auc(scores, labels) -> float:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size, dtype=np.float64)
    sorted_s = s[order]
    # average ranks over ties
    i = 0
    while i < s.size:
        j = i
        while j + 1 < s.size and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def default_grid(lo: float = 0.02, hi: float = 50.0, size: int = 161) -> np.ndarray:
    return np.logspace(np.log10(lo), np.log10(hi), size)


@dataclass
class StsData:
    logits: np.ndarray    # (N, gamma) raw confidence logits
    prefix: np.ndarray    # (N, gamma) 1.0 iff positions 1..k accepted
    observed: np.ndarray  # (N, gamma) bool: position k was verified

    @property
    def gamma(self) -> int:
        return int(self.logits.shape[1])

    @property
    def n(self) -> int:
        return int(self.logits.shape[0])

    @classmethod
    def from_rounds(cls, rounds: list[dict]) -> "StsData":
        if not rounds:
            raise ValueError("no verify rounds to calibrate on")
        rounds = [r for r in rounds if r.get("conf_raw") is not None]
        if not rounds:
            raise ValueError("the captured rounds carry no confidences: SGLang builds no "
                             "confidence head in static verify mode; use --verify-mode "
                             "verify-all (the default)")
        gamma = int(rounds[0]["gamma"])
        z = np.array([r["conf_raw"] for r in rounds], dtype=np.float64).reshape(-1, gamma)
        acc = np.array([int(r["accepted"]) for r in rounds])[:, None]
        ver = np.array([int(r["verified"]) for r in rounds])[:, None]
        k = np.arange(1, gamma + 1)[None, :]
        return cls(logits=z, prefix=(acc >= k).astype(np.float64), observed=ver >= k)

    def subset(self, mask: np.ndarray) -> "StsData":
        return StsData(self.logits[mask], self.prefix[mask], self.observed[mask])


def survival(logits: np.ndarray, temperatures) -> np.ndarray:
    """Cumulative products prod_{i<=k} sigmoid(z_i / T_i), shape (N, gamma)."""
    t = np.asarray(temperatures, dtype=np.float64).reshape(1, -1)
    return np.cumprod(sigmoid(logits / t), axis=1)


def _argmin_nearest_one(temps: np.ndarray, errs: np.ndarray, tol: float = 1e-9) -> int:
    """Index of the minimal ECE; among ties (e.g. a perfectly separable position where
    every small T gives ECE 0) the temperature closest to 1, i.e. the mildest change."""
    cand = np.flatnonzero(errs <= errs.min() + tol)
    return int(cand[np.argmin(np.abs(np.log(temps[cand])))])


def fit_sts(data: StsData, *, grid: np.ndarray | None = None, bins: int = DEFAULT_BINS,
            refine: int = 41) -> list[float]:
    """Fit one temperature per position, left to right (see module docstring)."""
    grid = default_grid() if grid is None else np.asarray(grid, dtype=np.float64)
    if (grid <= 0).any():
        raise ValueError("temperature grid must be positive")
    n, gamma = data.logits.shape
    if n == 0:
        raise ValueError("no rounds to fit")
    temps: list[float] = []
    prev = np.ones(n)
    for k in range(gamma):
        m = data.observed[:, k]
        if not m.any():
            temps.append(1.0)  # never verified: nothing to fit, keep raw
            prev = prev * sigmoid(data.logits[:, k])
            continue
        z, y, base = data.logits[m, k], data.prefix[m, k], prev[m]

        def err(t):
            return ece(base * sigmoid(z / t), y, bins)

        errs = np.array([err(t) for t in grid])
        i = _argmin_nearest_one(grid, errs)
        lo = grid[max(i - 1, 0)]
        hi = grid[min(i + 1, len(grid) - 1)]
        fine = np.exp(np.linspace(np.log(lo), np.log(hi), refine))
        fine_errs = np.array([err(t) for t in fine])
        j = _argmin_nearest_one(fine, fine_errs)
        best = float(fine[j]) if fine_errs[j] < errs[i] - 1e-12 else float(grid[i])
        temps.append(best)
        prev = prev * sigmoid(data.logits[:, k] / best)
    return temps


def position_metrics(data: StsData, temperatures, bins: int = DEFAULT_BINS) -> list[dict]:
    """Per position: ECE and AUC of the cumulative survival vs prefix acceptance, raw
    (all T = 1) and calibrated, plus reliability bins for plotting."""
    raw = survival(data.logits, np.ones(data.gamma))
    cal = survival(data.logits, temperatures)
    out = []
    for k in range(data.gamma):
        m = data.observed[:, k]
        y = data.prefix[m, k]
        out.append({
            "position": k + 1, "rounds": int(m.sum()),
            "prefix_acceptance": float(y.mean()) if y.size else float("nan"),
            "temperature": float(temperatures[k]),
            "ece_before": ece(raw[m, k], y, bins), "ece_after": ece(cal[m, k], y, bins),
            # STS is monotone per position, but the product mixes positions, so AUC can move
            "auc_before": auc(raw[m, k], y), "auc_after": auc(cal[m, k], y),
            "mean_pred_before": float(raw[m, k].mean()) if y.size else float("nan"),
            "mean_pred_after": float(cal[m, k].mean()) if y.size else float("nan"),
            "reliability_before": reliability_bins(raw[m, k], y, bins),
            "reliability_after": reliability_bins(cal[m, k], y, bins),
        })
    return out
