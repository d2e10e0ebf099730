"""PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_evaluation(summaries: dict, out: str | Path, title: str = "") -> None:
    """summaries: label -> acceptance_summary dict.  Three panels: tau distribution,
    per-position conditional acceptance, verify efficiency."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    labels = [k for k, v in summaries.items() if v.get("rounds")]
    width = 0.8 / max(len(labels), 1)
    for j, lab in enumerate(labels):
        s = summaries[lab]
        g = s["gamma"]
        xs = list(range(1, g + 2))
        axes[0].bar([x + (j - (len(labels) - 1) / 2) * width for x in xs],
                    [s["tau_distribution"][str(x)] for x in xs], width=width,
                    label=f"{lab}: mean tau {s['tau_mean']:.2f}")
        pos = [p["position"] for p in s["per_position"]]
        axes[1].plot(pos, [p["p_conditional"] for p in s["per_position"]], "o-", label=lab)
        axes[1].plot(pos, [p["p_prefix"] for p in s["per_position"]], "x--", alpha=0.6,
                     label=f"{lab} (prefix)")
        axes[2].bar([j], [s["verify_efficiency"]], label=lab)
    axes[0].set(xlabel="tau (tokens committed per verify round)", ylabel="fraction of rounds",
                title="accepted length per round")
    axes[1].set(xlabel="draft position k", ylabel="acceptance",
                title="P(k accepted | <k accepted)", ylim=(0, 1.02))
    axes[2].set(xticks=range(len(labels)), xticklabels=labels, ylim=(0, 1.02),
                ylabel="accepted / verified draft tokens", title="verify efficiency")
    for ax in axes[:2]:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(out), dpi=100)
    plt.close(fig)


def plot_reliability(curves: list[dict], out: str | Path, title: str = "") -> None:
    """curves: per position {"position", "before": bins, "after": bins, "ece_before",
    "ece_after"}; bins = list of {"mean_pred", "frac_pos", "count"} (non-empty bins)."""
    plt = _plt()
    n = len(curves)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.8), squeeze=False)
    for ax, c in zip(axes[0], curves):
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls=":")
        for key, style, name in (("before", "o-", "raw"), ("after", "s-", "STS")):
            b = c[key]
            ax.plot([x["mean_pred"] for x in b], [x["frac_pos"] for x in b], style, ms=4,
                    label=f"{name}: ECE {100 * c['ece_' + key]:.1f}%")
        ax.set(title=f"position {c['position']}", xlabel="predicted prefix survival",
               xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("observed prefix acceptance")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(str(out), dpi=100)
    plt.close(fig)
