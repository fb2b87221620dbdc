"""Plotly builders for the Fusion page's experiment over seed pairs: intervals in, go.Figure out; no model code.
Methods are rows of horizontal bars (their names are long: on a slanted x axis they ran under the legend)."""

from __future__ import annotations

import plotly.graph_objects as go

from ui.charts.figures import LAYOUT, LEGEND_BELOW, titled, wrap_title
from ui.charts.figures_fusion import PATH_AXIS

COLORS = {"average": "#7f7f7f", "weights: permutation": "#aec7e8", "weights: permutation+rotation": "#1f77b4",
          "activations: permutation": "#98df8a", "activations: permutation+rotation": "#2ca02c"}
BOTTOM_MARGIN = 120


def _height(n_rows: int) -> int:
    return 140 + BOTTOM_MARGIN + 44 * n_rows


def _interval_bar(summaries, figure: str, scale: float, name: str, colors=None) -> go.Bar:
    intervals = [getattr(s, figure) for s in summaries]
    return go.Bar(y=[s.method for s in summaries], x=[scale * i.mean for i in intervals], orientation="h", name=name,
                  marker_color=colors or [COLORS.get(s.method, "#444444") for s in summaries],
                  error_x=dict(type="data", symmetric=False, array=[scale * (i.high - i.mean) for i in intervals],
                               arrayminus=[scale * (i.mean - i.low) for i in intervals], color="#222222"),
                  hovertemplate="%{y}: %{x:.3g}<extra>" + name + "</extra>")


def _pair_points(result, figure: str, scale: float) -> go.Scatter:
    xs, ys = [], []
    for pair in result.pairs:
        for run in pair.methods:
            xs.append(scale * getattr(run, figure))
            ys.append(run.method)
    return go.Scatter(x=xs, y=ys, mode="markers", name="each seed pair",
                      marker=dict(color="white", size=7, line=dict(color="#222222", width=1)))


def _finish(fig: go.Figure, title: str, x_title: str, n_rows: int) -> go.Figure:
    fig.update_layout(**LAYOUT, legend=LEGEND_BELOW, barmode="group")
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_xaxes(title=x_title)
    return titled(fig, wrap_title(title, 80), _height(n_rows)).update_layout(margin_b=BOTTOM_MARGIN)


def merged_accuracy(result) -> go.Figure:
    """Merged accuracy per method: mean over pairs, its 95 % interval, each pair, and the end points' mean."""
    fig = go.Figure([_interval_bar(result.summaries, "accuracy", 100, "mean over pairs, 95 % interval"),
                     _pair_points(result, "accuracy", 100)])
    e = result.endpoints
    methods = [s.method for s in result.summaries]
    fig.add_trace(go.Scatter(x=[100 * e.mean] * 2, y=[methods[0], methods[-1]], mode="lines",
                             name=f"A and B themselves: {100 * e.mean:.1f}%", hoverinfo="name",
                             line=dict(color="#d62728", dash="dash", width=2)))
    fig.update_xaxes(range=[0, 102])
    return _finish(fig, f"Test accuracy of (A + aligned B) / 2 over {e.n // 2} seed pairs", "merged accuracy (%)",
                   len(methods))


def barriers(result) -> go.Figure:
    """Loss barrier along (1 - alpha) A + alpha aligned-B per method, with its 95 % interval and each pair."""
    fig = go.Figure([_interval_bar(result.summaries, "barrier", 1, "mean over pairs, 95 % interval"),
                     _pair_points(result, "barrier", 1)])
    return _finish(fig, "Loss barrier: the path's highest test loss above the straight line between A and aligned B",
                   "loss barrier (cross-entropy)", len(result.summaries))


def distances(result) -> go.Figure:
    """||A - B|| before and after matching (A the anchor), means over pairs with 95 % intervals."""
    aligned = [s for s in result.summaries if s.method != "average"]
    fig = go.Figure([_interval_bar(aligned, "distance_before", 1, "before matching", ["#bbbbbb"] * len(aligned)),
                     _interval_bar(aligned, "distance_after", 1, "after matching")])
    return _finish(fig, "Distance to the anchor model A, ||A - B||, before and after matching",
                   "||A - B|| (all parameters)", 2 * len(aligned))


def mean_paths(result) -> go.Figure:
    """Test loss along the path, mean over pairs, one line per method."""
    fig = go.Figure()
    for summary in result.summaries:
        runs = [next(r for r in p.methods if r.method == summary.method) for p in result.pairs]
        mean = [sum(r.path_loss[i] for r in runs) / len(runs) for i in range(len(result.path_alpha))]
        fig.add_trace(go.Scatter(x=result.path_alpha, y=mean, mode="lines+markers", name=summary.method,
                                 line=dict(color=COLORS.get(summary.method))))
    fig.update_layout(**LAYOUT, legend=LEGEND_BELOW)
    fig.update_xaxes(title=PATH_AXIS)
    fig.update_yaxes(title="test loss, mean over pairs")
    return titled(fig, "Test loss along the path from A (0) to aligned B (1)", 380 + BOTTOM_MARGIN).update_layout(
        margin_b=BOTTOM_MARGIN)
