"""The proof charts: errors of the un-scrambled run against the original's, layer by layer and tensor by tensor,
where a check breaks, and the per-cell difference map."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from ui.charts.figures import (
    FLOOR,
    LAYOUT,
    LEGEND_BELOW,
    LEGEND_BESIDE,
    RAW_LAYOUT,
    axis_titled,
    decimate,
    plain_figure,
    rgb_colorscale,
    threshold,
    threshold_parts,
    to_numpy,
)
from ui.charts.figures_heatmap import blocks_note

COLORS = {"hidden state": "#1f77b4", "attention map": "#d62728"}
EXACT_COLOR = "rgb(26, 152, 80)"  # green: exactly equal, apart from the error scale
OUTPUT_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2")


@functools.cache
def _two_panels_base() -> str:
    """make_subplots' layout of the two error panels (shared x, log y), once per process, as JSON."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.62, 0.38],
                        subplot_titles=("relative error: the verdict, judged against the tolerance",
                                        "absolute error: for reference (scale-dependent, no tolerance)"))
    fig.update_annotations(font=dict(size=11))  # the panel titles
    fig.update_yaxes(type="log", exponentformat="e", row=1, col=1, title="relative")
    fig.update_yaxes(type="log", exponentformat="e", row=2, col=1, title="absolute")
    return pio.to_json(fig.layout, validate=False)


# Labelled decades on each error panel's log axis (the panels are about 290 and 170 px high in a 540 px chart):
# plotly's own ticks put 2, 3, ... 9 between decades on a narrow range, and at 1024 px they ran into each other.
PANEL_DECADE_TICKS = {"yaxis": 6, "yaxis2": 4}


def decade_axis(values, max_ticks: int) -> dict:
    """A log axis' range and ticks for these positive values: a label every 1, 2, 3 ... decades so that at most
    max_ticks are drawn, two whole decades in view at least (reaching down for them when the values lie within
    one), and room above the largest value for a threshold's label (drawn above its line, under the panel title)."""
    logs = [math.log10(v) for v in values if v > 0 and math.isfinite(v)]
    if not logs:
        return {}
    span = max(logs) - min(logs)
    low, high = min(logs) - max(0.3, 0.05 * span), max(logs) + max(0.8, 0.22 * span)
    if math.floor(high) - math.ceil(low) < 1:
        low = math.floor(high) - 1.3
    step = max(1, math.ceil((math.floor(high) - math.ceil(low) + 1) / max_ticks))
    return dict(range=[low, high], dtick=step, tick0=0)


def _drawn(traces: list[dict], thresholds: list[tuple[dict, dict]], axis: str) -> list[float]:
    """Every y value drawn against one y axis: its traces' points and its threshold lines."""
    return ([y for trace in traces if trace["yaxis"] == axis for y in trace["y"]]
            + [line["y0"] for line, _ in thresholds if line["yref"] == axis])


def _two_panels(title: str, height: int, traces: list[dict], thresholds: list[tuple[dict, dict]],
                xaxes: tuple[dict, dict], **layout) -> go.Figure:
    """Relative errors on top, absolute below; traces name their panel by "row" (1 or 2)."""
    base = json.loads(_two_panels_base())
    for axis, extra in zip(("xaxis", "xaxis2"), xaxes, strict=True):
        base[axis].update(extra)
    for trace in traces:
        row = trace.pop("row")
        trace.update(xaxis="x" if row == 1 else "x2", yaxis="y" if row == 1 else "y2")
    for axis, values in (("yaxis", _drawn(traces, thresholds, "y")), ("yaxis2", _drawn(traces, thresholds, "y2"))):
        base[axis].update(decade_axis(values, PANEL_DECADE_TICKS[axis]))
    annotations = base.pop("annotations") + [text for _, text in thresholds]
    shapes = [line for line, _ in thresholds]
    return go.Figure(traces, layout={**base, **RAW_LAYOUT, "height": height, "annotations": annotations,
                                     "title": dict(text=title, font=dict(size=13)),
                                     **({"shapes": shapes} if shapes else {}), **layout}, _validate=False)


MEASURES = {"rel": "relative", "abs": "absolute"}
MAX_LAYER_TICKS = 12  # layer numbers on one axis: 34 of them (smollm2's 32 blocks) ran into each other at 1024 px


def layer_ticks(layers) -> dict:
    """Tick settings of a layer axis: every layer up to MAX_LAYER_TICKS of them, else every 2nd, 4th, ... from 0."""
    span = (max(layers) - min(layers) + 1) if layers else 1
    step = 1
    while span / step > MAX_LAYER_TICKS:
        step *= 2
    return dict(dtick=step, tick0=0)


def error_chart(rows: list[dict], title: str, tolerance: float | None = None,
                broken_at: float | None = None) -> go.Figure:
    """rows: {"layer": int, "kind": str, "abs": float, "rel": float, optional "tolerance": the tensor's own}.
    Relative errors (what the verdict judges) against the tolerance on top; absolute errors on their own axis
    below. Exact zeros sit at FLOOR. Tensors held to a raised (float32 round-off) tolerance get a marker."""
    traces = []
    kinds = sorted({r["kind"] for r in rows}, key=lambda k: (k not in COLORS, k))
    outputs = [k for k in kinds if k not in COLORS]  # each output its own colour (logits, pooled, last hidden ...)
    for kind in kinds:
        mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["layer"])
        xs = [r["layer"] for r in mine]
        color = COLORS.get(kind) or OUTPUT_COLORS[outputs.index(kind) % len(OUTPUT_COLORS)]
        for row, measure in ((1, "rel"), (2, "abs")):
            ys = [max(r[measure], FLOOR) for r in mine]
            traces.append(dict(type="scatter", x=xs, y=ys, mode="lines+markers",
                               name=f"{kind.replace('_', ' ')} ({MEASURES[measure]})",
                               legendgroup=kind, showlegend=row == 1, line=dict(color=color), row=row))
    raised = [r for r in rows if tolerance and r.get("tolerance", tolerance) > tolerance]
    if raised:
        traces.append(dict(type="scatter", x=[r["layer"] for r in raised], y=[r["tolerance"] for r in raised],
                           mode="markers", name="raised own tolerance",
                           marker=dict(symbol="line-ew-open", size=12, color="gray"), row=1))
    thresholds = []
    if tolerance:
        thresholds.append(threshold_parts(tolerance, f"tolerance {tolerance:.0e}", "gray", 1, "right", "dash",
                                          "bottom"))
    if broken_at:
        thresholds.append(threshold_parts(broken_at, f"broken above {broken_at:.0e}", "#e45756", 1, "left", "dash",
                                          "bottom"))
    layers = sorted({r["layer"] for r in rows})
    ticks = layer_ticks(layers)
    return _two_panels(title, 540, traces, thresholds,
                       (ticks, dict(ticks, title=dict(text="layer (-1 = embeddings, outputs after the last block)"))),
                       legend=LEGEND_BELOW, margin=dict(l=60, r=20, t=60, b=110))


def tensor_error_chart(names, abs_errors, rel_errors, title: str, tolerance: float | None = None,
                       max_bars: int = 400, tolerances=None) -> go.Figure:
    """Per-tensor max errors (the worst max_bars tensors when there are more): relative errors with each
    tensor's own tolerance on top (float32 tensors may be held to their measured round-off), absolute below."""
    order = sorted(range(len(names)), key=lambda i: -rel_errors[i])[:max_bars]
    order.sort()
    xs = [names[i] for i in order]
    traces = [dict(type="bar", x=xs, y=[max(rel_errors[i], FLOOR) for i in order], name="max rel error",
                   marker=dict(color="#4c78a8"), row=1)]
    if tolerances is not None and any(t != tolerance for t in tolerances):
        traces.append(dict(type="scatter", x=xs, y=[tolerances[i] for i in order], mode="markers",
                           name="own tolerance", marker=dict(symbol="line-ew-open", size=12, color="gray"), row=1))
    traces.append(dict(type="scatter", x=xs, y=[max(abs_errors[i], FLOOR) for i in order], mode="markers",
                       name="max abs error", marker=dict(color="#f58518", size=5), row=2))
    thresholds = [threshold_parts(tolerance, f"tolerance {tolerance:.0e}", "gray", 1, "right", "dash", "bottom")
                  ] if tolerance else []
    return _two_panels(title + (f" (worst {max_bars} of {len(names)})" if len(names) > max_bars else ""), 480,
                       traces, thresholds, (dict(showticklabels=False), dict(showticklabels=len(order) <= 60)),
                       legend=LEGEND_BESIDE)


def stage_chart(stages, title: str) -> go.Figure:
    """Where a check breaks: each place of the run (embeddings, block by block, output; a backward run in its own
    reverse order) with its worst tensor's error over that tensor's tolerance, on a log axis; above 1 fails."""
    labels = [s.where for s in stages]
    values = [s.error_over_tolerance if math.isfinite(s.error_over_tolerance) else 1e30 for s in stages]
    colors = ["#e45756" if v > 1 else "#4c78a8" for v in values]
    fig = plain_figure(dict(type="bar", x=labels, y=[max(v, 1e-12) for v in values], marker=dict(color=colors),
                            hovertext=[f"{s.worst_tensor}: {s.error_over_tolerance:.2g} x tolerance" for s in stages],
                            hoverinfo="text", name="worst error / tolerance"),
                       title, 320, yaxis=axis_titled("worst error / tolerance", type="log"),
                       xaxis=axis_titled("in the order the run computed them", type="category"))
    threshold(fig, 1.0, "tolerance", color="#e45756")
    return fig


def difference_map(original, restored, title: str, x_title: str = "channel", y_title: str = "token") -> go.Figure:
    """|restored - original| per cell on a log colour scale, relative to the original's largest |value|, so round-off
    (around 1e-16 in float64) and a real break (around 1) are decades apart. Exact zeros sit at FLOOR."""
    reference = to_numpy(original).astype(np.float64)
    scale = float(np.abs(reference).max()) or 1.0
    relative = np.abs(to_numpy(restored).astype(np.float64) - reference) / scale
    values, row_step, col_step = decimate(np.log10(np.maximum(relative, FLOOR)))
    note = blocks_note(row_step, col_step, "max")
    if row_step * col_step > 1:  # decimate averages each block; the largest cell is what matters here
        rows, cols = values.shape
        padded = np.full((rows * row_step, cols * col_step), -np.inf)
        padded[:relative.shape[0], :relative.shape[1]] = np.log10(np.maximum(relative, FLOOR))
        values = padded.reshape(rows, row_step, cols, col_step).max(axis=(1, 3))
    ticks = list(range(-18, 1, 3))
    x, y = np.arange(values.shape[1]) * col_step, np.arange(values.shape[0]) * row_step
    # Exact zeros (a whole block of them, when decimated) get their own colour and legend entry above the scale:
    # at the scale's dark end they read as 'the smallest error', when they are no error at all
    exact = np.where(values <= np.log10(FLOOR), 1.0, np.nan).astype(np.float32)
    return plain_figure([dict(type="heatmap", z=values.astype(np.float32), colorscale=rgb_colorscale("Magma"), zmin=-18,
                              zmax=0, x=x, y=y, colorbar=dict(thickness=10, tickvals=ticks,
                                                              ticktext=[f"1e{t}" for t in ticks]),
                              hovertemplate="row %{y}, column %{x}: 10^%{z:.1f}<extra></extra>", showlegend=False),
                         dict(type="heatmap", z=exact, x=x, y=y, colorscale=((0.0, EXACT_COLOR), (1.0, EXACT_COLOR)),
                              showscale=False, name="exactly equal (0)", showlegend=True,
                              hovertemplate="row %{y}, column %{x}: exactly equal<extra></extra>")],
                        title + note, LAYOUT["height"] + 30, yaxis=axis_titled(y_title, autorange="reversed"),
                        xaxis=axis_titled(x_title), legend=dict(orientation="h", yanchor="top", y=-0.3, x=0))
