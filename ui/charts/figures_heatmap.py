"""Heatmaps of hidden states, attention and weights: decimated to MAX_CELLS cells, probability maps on a log
colour scale, followed rows and columns outlined (figures_path)."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ui.charts.figures import (
    LABEL_FONT,
    LAYOUT,
    MAX_LABELS,
    axis_titled,
    decimate,
    plain_figure,
    rgb_colorscale,
    to_numpy,
    wrap_title,
)
from ui.charts.figures_path import path_shapes

# A probability map this many cells or more (a 257-token attention map) is drawn on a log colour scale: on a linear
# one its mass near 1/n looks uniformly dark beside a few cells near 1, and the structure is invisible.
LOG_PROBABILITY_CELLS = 64 * 64
LOG_DECADES = 3  # the log scale's range below its largest value; smaller cells take the scale's darkest colour


def distinct_labels(labels) -> list[str]:
    """The labels as distinct category names that read the same: a repeated token gets zero-width spaces after it
    (a category axis merges equal names into one column)."""
    seen: dict[str, int] = {}
    named = []
    for label in map(str, labels):
        named.append(label + "\u200b" * seen.get(label, 0))
        seen[label] = seen.get(label, 0) + 1
    return named


def blocks_note(row_step: int, col_step: int, how: str = "mean") -> str:
    """What one cell of a decimated map is (the mean, or the largest, of a block of values), in words short enough
    for a third of a 1024-pixel page, and for two title lines on a projector."""
    if row_step * col_step == 1:
        return ""
    if col_step == 1:
        return f"<br>({how} of {row_step} rows per cell)"
    if row_step == 1:
        return f"<br>({how} of {col_step} columns per cell)"
    return f"<br>({how} of {row_step}x{col_step} per cell)"


def heatmap(matrix, title: str, x_title: str = "", y_title: str = "", colorscale: str = "RdBu",
            symmetric: bool = True, zmax: float | None = None, y_labels=None, wrap: int | None = None,
            x_labels=None, height: int = LAYOUT["height"], y_ticks: bool = True,
            log_scale: bool | None = None, row_paths=(), col_paths=()) -> go.Figure:
    """wrap: the title's line length, for a chart in a narrow column (see wrap_title). y_labels / x_labels:
    a name per row / column (tokens), drawn when every row / column is shown and there are at most
    MAX_LABELS (more do not fit a third of a 1024-pixel window; positions are numbered then). y_ticks: False
    for a single row (an embedding drawn as one strip). log_scale: the colours on log10 of the values, over
    LOG_DECADES decades below zmax (said on the colour bar); None: on for a probability map (not symmetric, every
    row non-negative and summing to 1: an attention map) of LOG_PROBABILITY_CELLS cells or more. row_paths /
    col_paths: (item, position) pairs, each row / column outlined in its item's colour (path_shapes): where a followed
    token, channel or neuron is in this map."""
    values = to_numpy(matrix)
    shape = values.shape
    if log_scale is None:  # a probability map: every row a distribution (an attention map), not any map in [0, 1]
        log_scale = (not symmetric and values.size >= LOG_PROBABILITY_CELLS and float(np.nanmin(values)) >= 0.0
                     and bool(np.allclose(np.nansum(values, axis=1), 1.0, atol=1e-3)))
    values, row_step, col_step = decimate(values)
    if zmax is None:
        zmax = float(np.nanmax(np.abs(values))) if values.size else 1.0
    zmin = -zmax if symmetric else 0.0
    note = blocks_note(row_step, col_step)
    x = np.arange(values.shape[1]) * col_step
    y = np.arange(values.shape[0]) * row_step
    colorbar = dict(thickness=10, exponentformat="e")
    hover = None
    if log_scale:
        top = math.log10(zmax) if zmax > 0 else 0.0
        zmax, zmin = top, top - LOG_DECADES
        values = np.log10(np.maximum(values, 10.0 ** zmin))
        ticks = list(range(math.ceil(zmin), math.floor(zmax) + 1))
        colorbar.update(tickvals=ticks, ticktext=[f"1e{t}" for t in ticks],
                        title=dict(text="log scale", side="right"))
        hover = "row %{y}, column %{x}: 10^%{z:.2f}<extra></extra>"
    trace = dict(type="heatmap", z=values.astype(np.float32), x=x, y=y, colorscale=rgb_colorscale(colorscale),
                 zmin=zmin, zmax=zmax, colorbar=colorbar)
    if hover:
        trace["hovertemplate"] = hover
    yaxis, xaxis = axis_titled(y_title, autorange="reversed"), axis_titled(x_title)
    if not y_ticks or shape[0] == 1:
        yaxis.update(showticklabels=False)
    if y_labels is not None and row_step == 1 and len(y_labels) <= MAX_LABELS:
        yaxis.update(tickmode="array", tickvals=list(y), ticktext=list(y_labels), tickfont=dict(size=LABEL_FONT))
    if x_labels is not None and col_step == 1 and len(x_labels) <= MAX_LABELS:
        # Categories: plotly shows as many of them as fit the drawn width (all at 1440 px, every second or third in
        # a third of a 1024-pixel page), where a fixed list of ticks collided; the rows name every token anyway.
        trace["x"] = distinct_labels(x_labels)
        xaxis.update(type="category", tickfont=dict(size=LABEL_FONT))
    shapes = path_shapes(row_paths, col_paths, row_step, col_step)
    return plain_figure(trace, (wrap_title(title, wrap) if wrap else title) + note, height, xaxis=xaxis, yaxis=yaxis,
                        **({"shapes": shapes} if shapes else {}))
