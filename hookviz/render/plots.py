"""Matplotlib figures as RGB arrays: the gradient-flow plot of ``hookviz training`` and the parameter and MAC
bars of ``hookviz summary --plot``. Matplotlib loads only when a plot is drawn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hookviz.summary.data import SummaryData as ModelSummary

__all__ = ["figure_to_rgb", "grad_flow_plot", "summary_plot"]


def figure_to_rgb(fig: object) -> np.ndarray:
    """Render a matplotlib figure (Agg) to an RGB array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # type: ignore[arg-type]
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return np.ascontiguousarray(rgba[:, :, :3])


def grad_flow_plot(
    layers: Sequence[str], output_norms: Sequence[float], param_norms: Sequence[float], *, title: str
) -> np.ndarray:
    """Gradient norms per layer in network order, log scale: d(loss)/d(output) and d(loss)/d(parameters)."""
    from matplotlib.figure import Figure

    n = len(layers)
    fig = Figure(figsize=(max(8.0, 0.28 * n + 3), 5.5), dpi=100, constrained_layout=True)
    ax = fig.add_subplot()
    xs = np.arange(n)
    for values, label, marker in (
        (output_norms, "|dL/d output|", "o"),
        (param_norms, "|dL/d parameters|", "s"),
    ):
        v = np.asarray(values, dtype=float)
        ok = np.isfinite(v) & (v > 0)
        ax.plot(xs[ok], v[ok], marker=marker, markersize=4, linewidth=1.2, label=label)
    ax.set_yscale("log")
    ax.set_xticks(xs, list(layers), rotation=90, fontsize=7)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylabel("L2 norm (log scale)")
    ax.set_xlabel("layer (input → output)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(title, fontsize=10)
    return figure_to_rgb(fig)


def summary_plot(summary: ModelSummary) -> np.ndarray:
    """A horizontal bar chart of parameters and MACs per top-level block (RGB)."""
    from matplotlib.figure import Figure

    rows = {r.name: r for r in summary.rows}

    def params_of(name: str) -> int:
        return sum(r.params for r in summary.rows if r.name == name or r.name.startswith(name + "."))

    def children(name: str) -> list[str]:
        return [
            r.name for r in summary.rows if r.depth == rows[name].depth + 1 and r.name.startswith(name + ".")
        ]

    # Top-level blocks; one that dwarfs the rest (a ViT's `encoder`) is opened up until the bars say more.
    shown = [r.name for r in summary.rows if r.depth == 1]
    for _ in range(4):
        big = [
            n
            for n in shown
            if children(n)
            and (
                rows[n].macs > 0.6 * max(summary.macs, 1) or params_of(n) > 0.6 * max(summary.total_params, 1)
            )
        ]
        if not big or len(shown) - 1 + len(children(big[0])) > 40:
            break
        at = shown.index(big[0])
        shown[at : at + 1] = children(big[0])
    top = [rows[n] for n in shown]
    names = shown
    params = [params_of(n) for n in shown]
    macs = [r.macs for r in top]
    height = max(3.0, 0.35 * len(top) + 1.5)
    fig = Figure(figsize=(12, height), dpi=110, constrained_layout=True)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, values, label, color in (
        (axes[0], [p / 1e6 for p in params], "parameters (millions)", "#4C72B0"),
        (axes[1], [m / 1e9 for m in macs], "MACs (billions; 1 MAC = 2 FLOPs)", "#DD8452"),
    ):
        bars = ax.barh(range(len(top)), values, color=color)
        ax.set_xlabel(label)
        total = sum(values) or 1.0
        for bar, v in zip(bars, values, strict=True):
            if v / total >= 0.005:
                ax.text(
                    bar.get_width(),
                    bar.get_y() + bar.get_height() / 2,
                    f" {v:.3g} ({v / total:.0%})",
                    va="center",
                    fontsize=8,
                )
        ax.margins(x=0.25)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(top)), names)
    axes[0].invert_yaxis()
    shape = "x".join(map(str, [summary.batch_size, *summary.input_size]))
    fig.suptitle(
        f"{summary.model}: {summary.total_params / 1e6:.2f} M parameters, {summary.macs / 1e9:.2f} G MACs "
        f"({summary.flops / 1e9:.2f} GFLOPs) for input {shape}"
    )
    return figure_to_rgb(fig)
