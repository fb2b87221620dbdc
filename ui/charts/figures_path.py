"""Where the key sends things: outlines of a followed token, channel or neuron (the same highlight in Original,
Scrambled and Un-scrambled), and a permutation drawn as its matrix."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ui.charts.figures import axis_titled, plain_figure, to_numpy

# The followed items' outlines: a token in black, a channel, an MLP neuron or an attention head in magenta (neither is
# a colour of the RdBu or Viridis scales), each over a wider white halo so it shows on dark and on light cells alike.
PATH_COLORS = {"token": "#111111", "channel": "#e6007e", "neuron": "#e6007e", "head": "#e6007e"}
PATH_NAME = "path"  # a shape named "path <item> <position>" outlines where a followed item is (tests read it)


def outline(item: str, position: int, box: dict) -> list[dict]:
    halo = dict(type="rect", **box, line=dict(color="white", width=5), fillcolor="rgba(0,0,0,0)",
                name=f"halo {item} {position}", layer="above")
    core = dict(type="rect", **box, line=dict(color=PATH_COLORS.get(item, "#111111"), width=2.5),
                fillcolor="rgba(0,0,0,0)", name=f"{PATH_NAME} {item} {position}", layer="above")
    return [halo, core]


def path_shapes(row_paths=(), col_paths=(), row_step: int = 1, col_step: int = 1) -> list[dict]:
    """Outlines of followed rows and columns of a heatmap: (item, position) pairs, position in the map's own rows or
    columns. A decimated map (a cell per step x step block) outlines the cell that holds the position."""
    shapes = []
    for item, position in row_paths:
        centre = (position // row_step) * row_step
        shapes += outline(item, position, dict(xref="x domain", x0=0, x1=1, yref="y", y0=centre - row_step / 2,
                                               y1=centre + row_step / 2))
    for item, position in col_paths:
        centre = (position // col_step) * col_step
        shapes += outline(item, position, dict(yref="y domain", y0=0, y1=1, xref="x", x0=centre - col_step / 2,
                                               x1=centre + col_step / 2))
    return shapes


def permutation_figure(index, title: str, max_points: int = 4096) -> go.Figure:
    """A permutation as its matrix drawn sparsely: a dot at (old position, new position)."""
    index = to_numpy(index).astype(np.int64)
    n = len(index)
    step = max(1, math.ceil(n / max_points))
    new_positions = np.arange(0, n, step)
    note = f" (every {step}th row)" if step > 1 else ""
    return plain_figure(dict(type="scattergl", x=index[new_positions].astype(np.float32),
                             y=new_positions.astype(np.float32), mode="markers",
                             marker=dict(size=max(2, min(12, 360 // max(n, 1))), symbol="square", color="#4c78a8")),
                        title + note, 300, xaxis=axis_titled("original index", range=[-0.5, n - 0.5]),
                        yaxis=axis_titled("new position", range=[n - 0.5, -0.5]))
