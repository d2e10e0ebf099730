"""Plots and tables of fleet-simulator results (matplotlib imported lazily)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["LABELS", "plot_frontier", "plot_budget", "plot_timeline", "results_markdown", "write_outputs"]

LABELS = {
    "nospec": ("no speculation", "#7f7f7f", "o", "-"),
    "mtp1": ("MTP-1", "#ff7f0e", "s", "-"),
    "verify_all": ("DSpark verify-all (SGLang static mode)", "#8c564b", "v", "-"),
    "upstream": ("upstream: SGLang planner, static table", "#9467bd", "D", "-"),
    "online": ("ours: online profile (worker)", "#1f77b4", "o", "-"),
    "controller": ("ours: controller, throughput", "#17becf", "^", "-"),
    "sla": ("ours: controller, SLA floor", "#2ca02c", "P", "-"),
    "oracle": ("oracle: lagged planner on the true curve", "#000000", "", "--"),
}


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("the PNG plots need matplotlib: pip install matplotlib") from None
    return plt


def _label(p: str, floor: Optional[float] = None) -> tuple[str, str, str, str]:
    lab, col, mk, ls = LABELS.get(p, (p, None, "o", "-"))
    if p == "sla" and floor:
        lab = f"ours: controller, SLA floor {floor:g} tok/s/user"
    return lab, col, mk, ls


def _by_policy(results: Sequence[Any]) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in results:
        out.setdefault(r.policy, []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r.level)
    return out


def plot_frontier(results: Sequence[Any], out: str, *, title: str, anchors: Sequence[float] = (),
                  modelled: bool = True, sla_floor: Optional[float] = None) -> str:
    """Aggregate tokens/s vs tokens/s per user (paper Figure 7 shape), one line per policy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 6.2))
    for pol, rs in _by_policy(results).items():
        lab, col, mk, ls = _label(pol, sla_floor)
        x = [r.per_user for r in rs]
        y = [r.throughput for r in rs]
        ax.plot(x, y, linestyle=ls, marker=mk or None, color=col, label=lab, ms=5, lw=1.6)
        if pol in ("online", "mtp1"):
            for r in rs:
                ax.annotate(f"{r.level:g}", (r.per_user, r.throughput), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=col)
    for s in anchors:
        ax.axvline(s, color="#d62728", lw=0.8, ls=":")
        ax.text(s, ax.get_ylim()[1] * 0.98, f" {s:g} tok/s/user", color="#d62728", fontsize=8, va="top")
    ax.set_xlabel("tokens/s per user (decode rate of a running request)")
    ax.set_ylabel("aggregate output tokens/s")
    ax.set_title(title + ("\nMODELLED (simulated), not measured" if modelled else "\nsimulated from a measured profile"),
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_budget(results: Sequence[Any], out: str, *, title: str, gamma: int, modelled: bool = True,
                sla_floor: Optional[float] = None) -> str:
    """Verify budget per request (draft tokens verified per request per step) vs load (Figure 8)."""
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    for pol, rs in _by_policy(results).items():
        if pol == "nospec":
            continue
        lab, col, mk, ls = _label(pol, sla_floor)
        x = [r.level for r in rs]
        ax.plot(x, [r.budget_per_request for r in rs], linestyle=ls, marker=mk or None, color=col, label=lab, ms=5)
        ax2.plot(x, [r.tau for r in rs], linestyle=ls, marker=mk or None, color=col, label=lab, ms=5)
    arrival = results[0].arrival if results else "closed"
    xl = "concurrency (closed-loop users)" if arrival == "closed" else "arrival rate (requests/s)"
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel(xl)
        a.grid(alpha=0.3)
    ax.set_ylim(-0.2, gamma + 0.5)
    ax.set_ylabel(f"verify budget per request (draft tokens, max gamma = {gamma})")
    ax2.set_ylabel("tokens per request per step (tau, bonus included)")
    ax.set_title("verify budget per request vs load", fontsize=10)
    ax2.set_title("accepted tokens per step", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    fig.suptitle(title + (" | MODELLED (simulated)" if modelled else " | simulated from a measured profile"),
                 fontsize=10)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_timeline(timelines: Sequence[Any], out: str, *, title: str, modelled: bool = True) -> str:
    plt = _plt()
    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    for tl in timelines:
        lab, col, mk, ls = _label(tl.policy)
        axes[0].plot(tl.step, tl.throughput, color=col, ls=ls, label=lab)
        axes[1].plot(tl.step, tl.budget_per_request, color=col, ls=ls, label=lab)
        pts = [(t, q) for t, q in zip(tl.step, tl.quality) if q is not None]
        if pts:
            axes[2].plot([p[0] for p in pts], [100 * p[1] for p in pts], color=col, ls=ls, label=lab)
        half = 0.5 * float(tl.summary.get("window_steps", 0))      # errors are sampled at window ends
        pts = [(t + half, e) for t, e in zip(tl.step, tl.model_error) if e is not None]
        if pts:
            axes[3].plot([p[0] for p in pts], [100 * p[1] for p in pts], color=col, ls=ls, marker=".", label=lab)
    d = timelines[0].drift_step if timelines else None
    for a in axes:
        if d:
            a.axvline(d, color="#d62728", lw=1, ls=":")
        a.grid(alpha=0.3)
    axes[0].set_ylabel("output tokens/s")
    axes[1].set_ylabel("verify budget per request")
    axes[2].set_ylabel("decision quality vs oracle (%)")
    axes[3].set_ylabel("profile error vs true curve (%)\nover B in [R, R(gamma+1)]")
    axes[3].axhline(5, color="#999999", lw=0.8, ls="--")
    axes[3].set_xlabel("decode steps (engine 0); dotted line: the true curve moves")
    axes[0].legend(fontsize=8)
    axes[0].set_title(title + (" | MODELLED (simulated)" if modelled else ""), fontsize=10)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not np.isfinite(x):
        return "-"
    return f"{x:,.{nd}f}"


def results_markdown(results: Sequence[Any], anchors_tab: dict, anchors: Sequence[float], *,
                     baseline: str = "mtp1", timelines: Sequence[Any] = (), header: str = "") -> str:
    lines = [header] if header else []
    if anchors_tab:
        lines.append("Throughput (aggregate tokens/s) at per-user SLA anchors, read off each policy's frontier "
                     f"(interpolated between load levels); gain vs {baseline}:\n")
        hdr = "| policy | " + " | ".join(f"@ {s:g} tok/s/user" for s in anchors) + " |"
        lines += [hdr, "|---|" + "---:|" * len(anchors)]
        base = anchors_tab.get(baseline, {})
        for pol, row in anchors_tab.items():
            cells = []
            for s in anchors:
                v = row.get(f"{s:g}")
                b = base.get(f"{s:g}")
                if v is None:
                    cells.append("unreachable")
                elif b and pol != baseline:
                    cells.append(f"{v:,.0f} ({100 * (v / b - 1):+.0f}%)")
                else:
                    cells.append(f"{v:,.0f}")
            lines.append(f"| {pol} | " + " | ".join(cells) + " |")
        lines.append("")
    if results:
        lines.append("| policy | load | tok/s | tok/s/user | p10 user | budget/req | tau | R | B | step ms | "
                     "prefill % | SLA met | profile err |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        sla = "-" if r.sla_met_frac is None else f"{100 * r.sla_met_frac:.0f}%"
        err = "-" if r.model_error is None else f"{100 * r.model_error:.1f}%"
        lines.append(f"| {r.policy} | {r.level:g} | {_f(r.throughput, 0)} | {_f(r.per_user)} | {_f(r.per_user_p10)} | "
                     f"{r.budget_per_request:.2f} | {r.tau:.2f} | {r.mean_running:.1f} | {r.mean_batch_tokens:.0f} | "
                     f"{r.mean_step_ms:.2f} | {100 * r.prefill_time_frac:.0f} | {sla} | {err} |")
    if timelines:
        lines.append("")
        lines.append("| policy (drift run) | tok/s before drift | tok/s, last quarter | change | "
                     "decision quality before | decision quality, last quarter |")
        lines.append("|---|---:|---:|---:|---:|---:|")
        for tl in timelines:
            ch = (tl.after / tl.before - 1) * 100 if tl.before and np.isfinite(tl.before) else float("nan")
            lines.append(f"| {tl.policy} | {_f(tl.before, 0)} | {_f(tl.after, 0)} | {_f(ch, 1)}% | "
                         f"{_f(100 * tl.quality_before, 1)}% | {_f(100 * tl.quality_after, 1)}% |")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: str, *, scenario: Any, cost_desc: dict, results: Sequence[Any], anchors_tab: dict,
                  timelines: Sequence[Any], meta: dict, modelled: bool, prefix: str = "") -> dict[str, str]:
    """results.json, results.md and the PNGs into ``out_dir``; returns the paths written."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths: dict[str, str] = {}
    title = f"{scenario.name}: {scenario.description}" if scenario.description else scenario.name
    title = title if len(title) < 110 else title[:107] + "..."
    floor = scenario.sla_floor
    if results:
        paths["frontier"] = plot_frontier(results, str(d / f"{prefix}frontier.png"), title=title,
                                          anchors=scenario.anchors, modelled=modelled, sla_floor=floor)
        paths["budget"] = plot_budget(results, str(d / f"{prefix}budget.png"), title=scenario.name,
                                      gamma=scenario.gamma, modelled=modelled, sla_floor=floor)
    if timelines:
        paths["timeline"] = plot_timeline(timelines, str(d / f"{prefix}timeline.png"),
                                          title=f"{scenario.name}: {meta.get('drift_desc', 'drift')}",
                                          modelled=modelled)
    label = "MODELLED (simulated; the step-time model is analytic, not measured)" if modelled else \
        "simulated with a measured step-time profile"
    md = results_markdown(results, anchors_tab, scenario.anchors, timelines=timelines,
                          header=f"**{label}.** Scenario `{scenario.name}`. {scenario.description}\n")
    (d / f"{prefix}results.md").write_text(md)
    paths["table"] = str(d / f"{prefix}results.md")
    blob = {"label": label, "modelled": modelled, "scenario": scenario.to_dict(), "cost": cost_desc, "meta": meta,
            "anchors": anchors_tab, "results": [r.to_dict() for r in results],
            "timelines": [{k: v for k, v in tl.__dict__.items()} for tl in timelines]}
    (d / f"{prefix}results.json").write_text(json.dumps(blob, indent=1, default=_jsonable))
    paths["json"] = str(d / f"{prefix}results.json")
    return paths


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)
