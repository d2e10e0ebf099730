"""Plots and tables of fleet-simulator results (matplotlib imported lazily)."""

from __future__ import annotations

import json
import math
import textwrap
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


# labels of a scenario's named variants (Scenario.variants), set by write_outputs
_VARIANT_LABELS: dict[str, tuple[str, Optional[str], str, str]] = {}


def set_variant_labels(variants: Optional[dict]) -> None:
    """Labels for a scenario's variants: the base policy's colour, dotted, marker x."""
    _VARIANT_LABELS.clear()
    for name, v in (variants or {}).items():
        base = LABELS.get(str(v.get("policy")), (name, None, "o", "-"))
        _VARIANT_LABELS[name] = (str(v.get("label") or name), base[1], "x", ":")


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("the PNG plots need matplotlib: pip install matplotlib") from None
    return plt


def _label(p: str, floor: Optional[float] = None) -> tuple[str, str, str, str]:
    lab, col, mk, ls = LABELS.get(p) or _VARIANT_LABELS.get(p) or (p, None, "o", "-")
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


def _wrap(title: str, width: int = 95) -> str:
    """``title`` broken into lines of at most ``width`` characters (nothing cut off)."""
    return "\n".join(textwrap.wrap(title, width=width, break_long_words=False)) or title


# offsets (points) tried in turn for a point label: above right first, then around the point,
# then a little further out
_LABEL_OFFSETS = ((4, 4), (4, -11), (-13, 4), (-13, -11), (7, -3), (-17, -3), (-3, 8), (-3, -15),
                  (9, 9), (9, -16), (-19, 9), (-19, -16), (12, -3), (-23, -3))


def _place_labels(ax: Any, fig: Any, points: Sequence[tuple[float, float, str, Any]],
                  avoid: list) -> int:
    """Label each point ``(x, y, text, colour)`` at the first offset of ``_LABEL_OFFSETS`` whose
    text box stays inside the axes and overlaps neither an earlier label nor ``avoid``
    (display-space boxes: the legend, other texts, the plotted points and curves); a point
    with no free offset stays unlabelled. Call once the layout is final (the boxes are in
    display space). Returns the number of labels placed."""
    renderer = fig.canvas.get_renderer()
    taken = np.asarray([b.extents for b in avoid], dtype=np.float64).reshape(-1, 4)   # x0 y0 x1 y1
    axbox = ax.get_window_extent(renderer)
    placed = 0
    for x, y, text, col in points:
        for dx, dy in _LABEL_OFFSETS:
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color=col)
            x0, y0, x1, y1 = ann.get_window_extent(renderer).expanded(1.08, 1.15).extents
            inside = axbox.x0 <= x0 and x1 <= axbox.x1 and axbox.y0 <= y0 and y1 <= axbox.y1
            hit = (taken[:, 0] < x1) & (x0 < taken[:, 2]) & (taken[:, 1] < y1) & (y0 < taken[:, 3])
            if inside and not hit.any():
                taken = np.vstack([taken, [x0, y0, x1, y1]])
                placed += 1
                break
            ann.remove()
    return placed


def _point_boxes(ax: Any, xy: Sequence[tuple[float, float]], half_px: float = 4.0) -> list:
    """Display-space boxes around plotted points (markers of size 5 are ~8 px at 120 dpi)."""
    from matplotlib.transforms import Bbox

    if not len(xy):
        return []
    return [Bbox.from_bounds(px - half_px, py - half_px, 2 * half_px, 2 * half_px)
            for px, py in ax.transData.transform(list(xy))]


def _line_boxes(ax: Any, xy: Sequence[tuple[float, float]], step_px: float = 3.0) -> list:
    """Small display-space boxes every ``step_px`` along a polyline (a label must not sit on
    a curve either)."""
    from matplotlib.transforms import Bbox

    pts = ax.transData.transform(list(xy)) if len(xy) else np.zeros((0, 2))
    out = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        n = max(1, int(math.hypot(x1 - x0, y1 - y0) / step_px))
        for t in np.linspace(0.0, 1.0, n + 1):
            out.append(Bbox.from_bounds(x0 + t * (x1 - x0) - 1, y0 + t * (y1 - y0) - 1, 2, 2))
    return out


def plot_frontier(results: Sequence[Any], out: str, *, title: str, anchors: Sequence[float] = (),
                  modelled: bool = True, sla_floor: Optional[float] = None) -> str:
    """Aggregate tokens/s vs tokens/s per user (paper Figure 7 shape), one line per policy.

    The title is wrapped, never cut; the load levels of ``online`` and ``mtp1`` label their
    points where a label fits without covering another label, a point or the legend."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9.5, 6.6))
    labelled: list[tuple[float, float, str, Any]] = []
    for pol, rs in _by_policy(results).items():
        lab, col, mk, ls = _label(pol, sla_floor)
        x = [r.per_user for r in rs]
        y = [r.throughput for r in rs]
        ax.plot(x, y, linestyle=ls, marker=mk or None, color=col, label=lab, ms=5, lw=1.6)
        if pol in ("online", "mtp1"):
            labelled += [(r.per_user, r.throughput, f"{r.level:g}", col) for r in rs]
    ax.margins(x=0.04, y=0.06)
    for s in anchors:
        ax.axvline(s, color="#d62728", lw=0.8, ls=":")
    ax.set_xlabel("tokens/s per user (decode rate of a running request)")
    ax.set_ylabel("aggregate output tokens/s")
    ax.set_title(_wrap(title) + ("\nMODELLED (simulated), not measured" if modelled
                                 else "\nsimulated from a measured profile"), fontsize=10)
    ax.grid(alpha=0.3)
    leg = ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    ymax = ax.get_ylim()[1]
    for s in anchors:   # after the layout: the limits are final
        ax.text(s, ymax, f" {s:g} tok/s/user", color="#d62728", fontsize=8, va="top")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    avoid = [leg.get_window_extent(renderer)] + [t.get_window_extent(renderer) for t in ax.texts]
    avoid += _point_boxes(ax, [(r.per_user, r.throughput) for r in results])   # every policy's points
    for rs in _by_policy(results).values():                                       # ... and curves
        avoid += _line_boxes(ax, [(r.per_user, r.throughput) for r in rs])
    _place_labels(ax, fig, labelled, avoid)
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
    ax.legend(fontsize=7, loc="center left")   # the lower left holds the MTP-1 line
    fig.suptitle(_wrap(title + (" | MODELLED (simulated)" if modelled else " | simulated from a measured profile"),
                       130), fontsize=10)
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
    axes[0].set_title(_wrap(title + (" | MODELLED (simulated)" if modelled else ""), 110), fontsize=10)
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
                     "prefill % | SLA met | profile err | no-draft % | gate switches |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        sla = "-" if r.sla_met_frac is None else f"{100 * r.sla_met_frac:.0f}%"
        err = "-" if r.model_error is None else f"{100 * r.model_error:.1f}%"
        lines.append(f"| {r.policy} | {r.level:g} | {_f(r.throughput, 0)} | {_f(r.per_user)} | {_f(r.per_user_p10)} | "
                     f"{r.budget_per_request:.2f} | {r.tau:.2f} | {r.mean_running:.1f} | {r.mean_batch_tokens:.0f} | "
                     f"{r.mean_step_ms:.2f} | {100 * r.prefill_time_frac:.0f} | {sla} | {err} | "
                     f"{100 * getattr(r, 'no_draft_frac', 0.0):.0f} | "
                     f"{'-' if getattr(r, 'gate_switches', None) is None else r.gate_switches} |")
    ratio = _vs_nospec(results)
    if ratio:
        lines += [""] + ratio
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


def _vs_nospec(results: Sequence[Any]) -> list[str]:
    """Throughput of each policy over no speculation's, per load level (empty: no nospec run)."""
    by = _by_policy(results)
    base = {r.level: r.throughput for r in by.get("nospec", [])}
    if not base or len(by) < 2:
        return []
    levels = sorted(base)
    out = ["Throughput over no speculation's at each load level (1.00 = plain decoding):\n",
           "| policy | " + " | ".join(f"{lv:g}" for lv in levels) + " |",
           "|---|" + "---:|" * len(levels)]
    for pol, rs in by.items():
        if pol == "nospec":
            continue
        got = {r.level: r.throughput for r in rs}
        out.append(f"| {pol} | " + " | ".join(f"{got[lv] / base[lv]:.3f}" if lv in got and base[lv] > 0 else "-"
                                              for lv in levels) + " |")
    return out


def write_outputs(out_dir: str, *, scenario: Any, cost_desc: dict, results: Sequence[Any], anchors_tab: dict,
                  timelines: Sequence[Any], meta: dict, modelled: bool, prefix: str = "") -> dict[str, str]:
    """results.json, results.md and the PNGs into ``out_dir``; returns the paths written."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    set_variant_labels(getattr(scenario, "variants", None))
    paths: dict[str, str] = {}
    title = f"{scenario.name}: {scenario.description}" if scenario.description else scenario.name
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
