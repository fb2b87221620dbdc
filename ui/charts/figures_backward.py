"""Plotly builders for the Backward and Model authorization pages: numbers in, go.Figure out."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from perm_core.run import trace_names
from ui.charts.figures import FLOOR, LAYOUT, LEGEND_BELOW, LEGEND_BESIDE, threshold, to_numpy
from ui.charts.figures_heatmap import heatmap

NON_FINITE = 1e6  # where a non-finite SGD error is drawn on the log axis


def as_matrix(tensor) -> np.ndarray:
    """A gradient as a 2-D picture: an image [1, C, H, W] -> H x (C*W), [1, T, d] -> T x d, 1-D -> 1 x n."""
    values = to_numpy(tensor)
    if values.ndim == 4:
        values = np.concatenate(list(values[0]), axis=1)
    while values.ndim > 2:
        values = values[0]
    return values[None, :] if values.ndim == 1 else values


def gradient_triptych(original, scrambled, unscrambled, what: str) -> list[go.Figure]:
    """Original | scrambled world | un-scrambled, one colour scale, plus |un-scrambled - original|."""
    a, b, c = (as_matrix(t) for t in (original, scrambled, unscrambled))
    zmax = float(np.nanmax(np.abs(a))) or 1.0
    narrow = 32  # two charts side by side (pages/backward.py): a title line fits about 32 characters at 1024 px
    figures = [heatmap(a, f"{what}: original", zmax=zmax, wrap=narrow),
               heatmap(b, f"{what}: scrambled world", zmax=zmax, wrap=narrow),
               heatmap(c, f"{what}: un-scrambled", zmax=zmax, wrap=narrow)]
    error = np.abs(c - a)
    figures.append(heatmap(error, f"|error|, max {error.max():.1e}", colorscale="Greys",
                           symmetric=False, zmax=max(float(error.max()), FLOOR), wrap=narrow))
    return figures


def gradient_errors(errors, tolerance: float) -> go.Figure:
    """Max relative error of every gradient tensor, log scale, with the tolerance."""
    names = [trace_names.differentiated(e.name) for e in errors]
    values = [max(e.max_rel_error, FLOOR) for e in errors]
    # Tensors zero in exact arithmetic (key-bias gradients) are judged by their absolute size, not by the relative
    # error the headline reports: grey, so the tallest blue bar is the headline's
    floored = [bool(e.floor_reason and e.finite) for e in errors]
    fig = go.Figure(go.Bar(x=names, y=values, name="max rel error",
                           marker_color=["#bab0ac" if f else "#4c78a8" for f in floored],
                           customdata=["zero in exact arithmetic: judged by |x|" if f else "" for f in floored],
                           hovertemplate="%{x}: %{y:.2e} %{customdata}<extra></extra>"))
    title = "Gradient error after un-scrambling" + ("<br><sup>grey: zero in exact arithmetic, judged by |x| "
                                                    "(not in the headline)</sup>" if any(floored) else "")
    threshold(fig, tolerance, f"tolerance {tolerance:.0e}")
    fig.update_layout(**{**LAYOUT, "height": 320}, title=dict(text=title, font=dict(size=13)))
    fig.update_yaxes(type="log", title="max relative error", exponentformat="e")
    fig.update_xaxes(title="gradient", showticklabels=len(names) <= 40)
    return fig


def sgd_errors(results: dict, tolerance: float, broken_at: float) -> go.Figure:
    """results: label -> SGDResult. Per step from 1 on: the scrambled world's accumulated update
    theta'_t - theta'_0 against the transformed original update g(theta_t - theta_0), worst tensor,
    relative to that update's own size. Step 0 is left out: nothing has been trained there."""
    fig = go.Figure()
    colors = ["#2ca02c", "#d62728", "#ff7f0e", "#9467bd"]
    for color, (label, result) in zip(colors, results.items(), strict=False):
        trained = result.steps[1:]
        # A non-finite error (a NaN anywhere counts as +inf) is drawn at NON_FINITE, never dropped.
        values = [max(s.update_rel_error, FLOOR) if math.isfinite(s.update_rel_error) else NON_FINITE
                  for s in trained]
        fig.add_trace(go.Scatter(x=[s.step for s in trained], y=values, mode="lines+markers", name=label,
                                 line=dict(color=color)))
    for value, text, color, dash, anchor in ((tolerance, "tolerance (symmetry)", "gray", "dash", "top"),
                                             (broken_at, "control broken above", "#d62728", "dot", "bottom")):
        threshold(fig, value, text, color, dash=dash, yanchor=anchor)
    fig.update_layout(**{**LAYOUT, "height": 400, "margin": {**LAYOUT["margin"], "b": 100}}, legend=LEGEND_BELOW,
                      title=dict(text="Update error per SGD step", font=dict(size=13)))
    fig.update_yaxes(type="log", title="max relative update error", exponentformat="e")
    fig.update_xaxes(title="SGD step", dtick=1)
    return fig


def sgd_losses(result) -> go.Figure:
    fig = go.Figure()
    steps = [s.step for s in result.steps]
    fig.add_trace(go.Scatter(x=steps, y=[s.loss_original for s in result.steps], mode="lines+markers",
                             name="original world"))
    fig.add_trace(go.Scatter(x=steps, y=[s.loss_scrambled for s in result.steps], mode="markers",
                             name="scrambled world", marker=dict(symbol="x", size=10)))
    fig.update_layout(**{**LAYOUT, "height": 360, "margin": {**LAYOUT["margin"], "b": 100}}, legend=LEGEND_BELOW,
                      title=dict(text="Loss per step in both worlds", font=dict(size=13)))
    fig.update_xaxes(title="SGD step", dtick=1)
    fig.update_yaxes(title="loss")
    return fig


def _bin_counts(values, bins: int = 20) -> list[int]:
    """Counts of a 20-bin histogram of `values` (the tallest bar sets the height of the lines beside it)."""
    import numpy as np

    return np.histogram(np.asarray(values, dtype=float), bins=bins)[0].tolist() if len(values) else [0]


def authorization_histogram(result, metric_label: str) -> go.Figure:
    """Wrong keys as a histogram; right key, no key and chance as vertical lines."""
    fig = go.Figure(go.Histogram(x=result.wrong_keys, nbinsx=20, name=f"{len(result.wrong_keys)} wrong keys",
                                 marker_color="#d62728", opacity=0.75))
    # Each line is named in the legend, not by a label on the plot: no key and chance sit on the wrong keys' bars,
    # where a label covered the tallest bar or hid behind them.
    top = max(1, *_bin_counts(result.wrong_keys))
    lines = (("right key", result.right_key, "#2ca02c", "dash"), ("no key", result.no_key, "#ff7f0e", "dash"),
             ("chance", result.chance, "gray", "dot"))
    for label, value, color, dash in lines:
        fig.add_trace(go.Scatter(x=[value, value], y=[0, top * 1.05], mode="lines", name=f"{label} {value:.3g}",
                                 line=dict(color=color, dash=dash, width=2), hoverinfo="name"))
    if result.metric != "perplexity":
        fig.update_xaxes(range=[0, 1.02])
    fig.update_layout(**{**LAYOUT, "height": 380}, title=dict(text=f"{metric_label}: what a key is worth",
                                                               font=dict(size=13)),
                      legend=LEGEND_BESIDE)  # under the plot it covered the x tick labels at 1440 px
    fig.update_xaxes(title=metric_label, type="log" if result.metric == "perplexity" else "linear")
    fig.update_yaxes(title="number of wrong keys")
    return fig
