"""PNG pictures of profiles (matplotlib, imported lazily; the controller never needs it).

:func:`plot_profile` draws four panels:

1. step time vs batch tokens B, one colour per running-request count R: the measured
   samples (dots, medians per B as rings) and the fitted curve over B in [R, R(gamma+1)];
2. verified tokens per second (B / t) vs B: the same data as a throughput;
3. the draft-token budget K the scheduler would pick per load (``compute_lagged_budget``
   over this profile), one line per representative per-position confidence;
4. expected generated tokens per second at that budget, against verifying every draft
   token.  No "no speculation" line: a speculative profile's t(R, B = R) still pays the
   draft forward, so R / t(R, R) is not what plain decoding costs; the profile holds no
   measured plain-decode or no-draft step times to draw it from.

:func:`plot_diff` draws two profiles' fits over each other and their relative difference.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from dspark_controller.profiling.tools import LoadedProfile, ProfileToolError, budget_rows, load_levels, sample_cells

__all__ = ["plot_profile", "plot_diff"]


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ProfileToolError("the PNG needs matplotlib: pip install matplotlib") from None
    return plt


def _title(lp: LoadedProfile) -> str:
    if lp.profile is None:
        return lp.describe()
    fp = lp.profile.fingerprint
    err = lp.profile.heldout_error
    e = "n/a" if err.mape is None else f"{100 * err.mape:.1f}% (n={err.n})"
    return (f"{fp.target_model.rstrip('/').split('/')[-1]} + {fp.draft_model.rstrip('/').split('/')[-1] or '-'} "
            f"on {fp.device_name}, gamma={fp.gamma} | {lp.profile.samples_seen} samples, held-out error {e}")


def plot_profile(lp: LoadedProfile, out: str, *, confidences: Sequence[float] = (0.6, 0.8, 0.9),
                 levels: Optional[Sequence[int]] = None) -> str:
    plt = _plt()
    g = lp.gamma or 7
    levels = list(levels or load_levels(lp))
    cmap = plt.get_cmap("viridis")
    colors = {r: cmap(i / max(1, len(levels) - 1)) for i, r in enumerate(levels)}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax_t, ax_thr, ax_k, ax_gain = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
    s = lp.samples
    cells = sample_cells(s)
    for r in levels:
        col = colors[r]
        bgrid = np.arange(r, r * (g + 1) + 1)
        fit = np.asarray(lp.model.predict_step_time(np.full(bgrid.shape, r), bgrid), dtype=np.float64)
        ax_t.plot(bgrid, 1e3 * fit, "-", color=col, lw=1.6, label=f"R={r} fit")
        ax_thr.plot(bgrid, bgrid / fit, "-", color=col, lw=1.6, label=f"R={r} fit")
        if s.size:
            m = s[:, 0].astype(int) == r
            if m.any():
                ax_t.scatter(s[m, 1], 1e3 * s[m, 2], s=6, color=col, alpha=0.25, lw=0)
                ax_thr.scatter(s[m, 1], s[m, 1] / s[m, 2], s=6, color=col, alpha=0.25, lw=0)
            cr = [c for c in cells if c["R"] == r]
            if cr:
                bb = np.array([c["B"] for c in cr])
                med = np.array([c["median_s"] for c in cr])
                ax_t.scatter(bb, 1e3 * med, s=28, facecolors="none", edgecolors=[col], lw=1.2)
                ax_thr.scatter(bb, bb / med, s=28, facecolors="none", edgecolors=[col], lw=1.2)
    if s.size:
        top = float(np.quantile(s[:, 2], 0.99)) * 1e3
        fit_top = max(float(lp.model.predict_step_time(r, r * (g + 1))) for r in levels) * 1e3
        ax_t.set_ylim(0, 1.15 * max(top, fit_top))
        ax_thr.set_ylim(0, 1.15 * float(np.quantile(s[:, 1] / s[:, 2], 0.995)))
    ax_t.set_xlabel("B = tokens verified per step (R anchors + K draft tokens)")
    ax_t.set_ylabel("step time (ms)")
    ax_t.set_title("step time: samples (dots), medians (rings), fit (lines)")
    ax_t.legend(fontsize=7, ncol=2)
    ax_t.grid(alpha=0.3)
    ax_thr.set_xlabel("B")
    ax_thr.set_ylabel("verified tokens per second (B / t)")
    ax_thr.set_title("verify throughput")
    ax_thr.grid(alpha=0.3)

    rows = budget_rows(lp, confidences, levels=levels, gamma=g)
    for j, c in enumerate(confidences):
        rr = [d for d in rows if d["confidence"] == float(c)]
        x = [d["R"] for d in rr]
        ax_k.plot(x, [d["frac"] for d in rr], "o-", label=f"c={c:g}", color=plt.get_cmap("tab10")(j))
        ax_gain.plot(x, [d["throughput_tok_s"] for d in rr], "o-", color=plt.get_cmap("tab10")(j),
                     label=f"c={c:g} chosen K")
        ax_gain.plot(x, [d["verify_all_tok_s"] for d in rr], ":", color=plt.get_cmap("tab10")(j),
                     label=f"c={c:g} verify all")
    for ax in (ax_k, ax_gain):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.set_xticklabels([str(r) for r in levels])
        ax.minorticks_off()
        ax.set_xlabel("R = running requests (load)")
        ax.grid(alpha=0.3)
    ax_k.set_ylim(-0.03, 1.03)
    ax_k.set_ylabel(f"K / (R * gamma): share of the {g} draft tokens verified")
    ax_k.set_title("budget the scheduler would pick (lagged, per-position confidence c)")
    ax_k.legend(fontsize=8)
    ax_gain.set_ylabel("expected generated tokens / s")
    ax_gain.set_title("predicted throughput at that budget")
    ax_gain.legend(fontsize=7, ncol=2)
    fig.suptitle(_title(lp), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_diff(a: LoadedProfile, b: LoadedProfile, rows: list[dict], out: str) -> str:
    plt = _plt()
    levels = sorted({d["R"] for d in rows})
    cmap = plt.get_cmap("viridis")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    g = max(a.gamma or 0, b.gamma or 0) or 7
    for i, r in enumerate(levels):
        col = cmap(i / max(1, len(levels) - 1))
        bg = np.arange(r, r * (g + 1) + 1)
        ta = np.asarray(a.model.predict_step_time(np.full(bg.shape, r), bg))
        tb = np.asarray(b.model.predict_step_time(np.full(bg.shape, r), bg))
        ax1.plot(bg, 1e3 * ta, "-", color=col, label=f"R={r} A")
        ax1.plot(bg, 1e3 * tb, "--", color=col, label=f"R={r} B")
        ax2.plot(bg, 100 * (tb - ta) / ta, "-", color=col, label=f"R={r}")
    ax1.set_xlabel("B")
    ax1.set_ylabel("step time (ms)")
    ax1.set_title("A (solid) vs B (dashed)")
    ax1.legend(fontsize=7, ncol=2)
    ax1.grid(alpha=0.3)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set_xlabel("B")
    ax2.set_ylabel("(B - A) / A  (%)")
    ax2.set_title("relative difference of predicted step time")
    ax2.legend(fontsize=7, ncol=2)
    ax2.grid(alpha=0.3)
    fig.suptitle(f"A: {a.path}\nB: {b.path}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
