"""Plotly builders for the Rotation and Fusion pages: numbers and arrays in, go.Figure out; no model code."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.charts.figures import LEGEND_BELOW, LEGEND_BESIDE, threshold, titled, wrap_title

# The path between the two models in words ("alpha" alone meant nothing to a student)
PATH_AXIS = "t in (1 − t)·A + t·aligned B"
COLORS = {"average": "#7f7f7f", "permutation": "#1f77b4", "rotation": "#ff7f0e", "permutation+rotation": "#2ca02c"}


def _array(t):
    return t.detach().cpu().double().numpy()


def side_by_side(original, rotated, title: str, x_title: str = "channel", y_title: str = "token") -> go.Figure:
    """Two heatmaps on one colour scale: the original tensor and the rotated model's. Values of one sign (attention
    probabilities) on a sequential scale from 0, never a diverging one: white would mean a middle that is not there.
    A single row (the logits) has no y axis: its ticks (-0.4 .. 0.4) numbered nothing."""
    a, b = _array(original), _array(rotated)
    if a.ndim == 1:
        a, b = a[None], b[None]
    bound = float(max(abs(a).max(), abs(b).max())) or 1.0
    one_sign = float(min(a.min(), b.min())) >= 0.0
    scale = dict(zmin=0.0, zmax=bound, colorscale="Viridis") if one_sign else dict(
        zmin=-bound, zmax=bound, colorscale="RdBu", reversescale=True)
    # One y axis for both (the second panel's token ticks sat on the first one's cells in a half column at 1024 px)
    # and short panel titles ("original" and "rotated model" ran into each other there). Each x axis gets at most
    # three ticks and the panels a wider gap: at 1024 px "0 5 10 15" of both panels ran together ("150 5").
    fig = make_subplots(1, 2, subplot_titles=("original", "rotated"), horizontal_spacing=0.12, shared_yaxes=True)
    for col, z in ((1, a), (2, b)):
        fig.add_trace(go.Heatmap(z=z, **scale, showscale=col == 2, colorbar=dict(exponentformat="e")), 1, col)
        fig.update_yaxes(autorange="reversed", title_text=y_title if col == 1 else None, row=1, col=col,
                         showticklabels=a.shape[0] > 1 and col == 1)
        fig.update_xaxes(title_text=x_title if col == 1 else None, row=1, col=col, nticks=3)  # one title: two collided
    fig.update_layout(margin=dict(t=60, b=40, l=40, r=20))
    fig = titled(fig, wrap_title(title, 36), 300)  # two charts side by side
    fig.update_layout(margin_t=fig.layout.margin.t + 22)  # the panel titles sit under the chart's own, not on it
    return fig


def change_bars(quantities) -> go.Figure:
    """Relative change per quantity and layer, on a log axis: ~1 (changed completely) vs ~1e-7 (round-off)."""
    fig = go.Figure()
    names = list(dict.fromkeys(q.name for q in quantities))
    for layer in sorted({q.layer for q in quantities}):
        rows = [q for q in quantities if q.layer == layer]
        fig.add_trace(go.Bar(name=f"layer {layer}", x=[q.name for q in rows],
                             y=[max(q.changed, 1e-17) for q in rows]))
    fig.update_layout(barmode="group", title="How much each tensor moves under the rotation (max relative change)",
                      yaxis=dict(type="log", title="relative change"), xaxis=dict(categoryorder="array",
                                                                                   categoryarray=names),
                      height=380, margin=dict(t=60, b=40))
    return fig


def error_comparison(comparison, tolerance: float) -> go.Figure:
    """Per-tensor relative error of a symmetry vs a near miss, log scale, with the tolerance line."""
    fig = go.Figure()
    pairs = ((comparison.symmetry_label, comparison.symmetry), (comparison.broken_label, comparison.broken))
    for label, errors in pairs:
        fig.add_trace(go.Bar(name=label, x=[e.name for e in errors], y=[max(e.max_rel_error, 1e-17) for e in errors]))
    threshold(fig, tolerance, f"tolerance {tolerance:g}")
    fig.update_layout(barmode="group", title=comparison.title, yaxis=dict(type="log", title="max relative error"),
                      height=380, margin=dict(t=60, b=40))
    return fig


def barrier_curves(result, metric: str = "loss") -> go.Figure:
    """Test loss (or accuracy) along (1 - alpha) A + alpha aligned-B, one curve per method."""
    fig = go.Figure()
    for m in result.methods:
        y = m.path_loss if metric == "loss" else [100 * a for a in m.path_accuracy]
        fig.add_trace(go.Scatter(x=m.path_alpha, y=y, mode="lines+markers", name=m.method,
                                 line=dict(color=COLORS.get(m.method))))
    label = "test loss (cross-entropy)" if metric == "loss" else "test accuracy (%)"
    # The legend goes under the plot: beside it, it took half of a half-width column at 1024 px
    fig.update_layout(xaxis_title=PATH_AXIS, yaxis_title=label, legend=LEGEND_BELOW)
    titled(fig, wrap_title(f"{label}: path A (0) to aligned B (1)", 34), 480)  # two charts side by side
    return fig.update_layout(margin=dict(b=130))  # the x axis' ticks and title, and the legend's rows


def distance_bars(result) -> go.Figure:
    """||A - B|| before and after matching, per parameter group and in total."""
    # Drawn across the page (two panels with their own legend need more than half of a 1024-pixel window)
    fig = make_subplots(1, 2, subplot_titles=("total ||A - B||", "by parameter group (after matching)"),
                        horizontal_spacing=0.12)
    methods = [m.method for m in result.methods]
    fig.add_trace(go.Bar(name="before matching", x=methods, y=[m.distance_before for m in result.methods],
                         marker_color="#bbbbbb"), 1, 1)
    fig.add_trace(go.Bar(name="after matching", x=methods, y=[m.distance_after for m in result.methods],
                         marker_color=[COLORS.get(m) for m in methods]), 1, 1)
    for group in result.methods[0].group_distance_after:
        fig.add_trace(go.Bar(name=group, x=methods, y=[m.group_distance_after[group] for m in result.methods]), 1, 2)
    fig.update_layout(barmode="group", height=440, margin=dict(t=60, b=40),  # the legend beside: under the slanted
                      legend=LEGEND_BESIDE)  # ticks it covered them once the fonts grew (projector mode)
    return fig


def fused_bars(result) -> go.Figure:
    """Test accuracy of A, B and each fused model."""
    names = ["A", "B"] + [f"fused: {m.method}" for m in result.methods]
    values = [result.accuracy_a, result.accuracy_b] + [m.accuracy for m in result.methods]
    colors = ["#444444", "#444444"] + [COLORS.get(m.method) for m in result.methods]
    fig = go.Figure(go.Bar(x=names, y=[100 * v for v in values], marker_color=colors,
                           text=[f"{100 * v:.1f}%" for v in values], textposition="outside"))
    fig.update_layout(title="test accuracy (360 held-out digits)", yaxis=dict(title="%", range=[0, 110]),
                      height=360, margin=dict(t=60, b=40))
    return fig
