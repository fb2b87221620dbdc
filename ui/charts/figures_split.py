"""Plotly figures for the split-learning page: arrays and results in, go.Figure out; no model code."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.charts.figures import LEGEND_BELOW, titled, wrap_title

PLAIN_COLOR, SCRAMBLED_COLOR = "#1f77b4", "#d62728"


def training_curves(training, title: str = "") -> go.Figure:
    """Held-out accuracy and training loss per epoch, plain vs scrambled (a SplitTraining); title: what the chart
    shows in one sentence (the page says why the curves part)."""
    epochs = list(range(1, len(training.plain_accuracy) + 1))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out accuracy", "training loss"))
    for name, color, dash in (("plain", PLAIN_COLOR, "solid"), ("scrambled", SCRAMBLED_COLOR, "dot")):
        fig.add_trace(go.Scatter(x=epochs, y=getattr(training, f"{name}_accuracy"), name=f"{name} split",
                                 mode="lines+markers", line={"color": color, "dash": dash}), row=1, col=1)
        fig.add_trace(go.Scatter(x=epochs, y=getattr(training, f"{name}_loss"), name=f"{name} split",
                                 mode="lines+markers", line={"color": color, "dash": dash}, showlegend=False),
                      row=1, col=2)
    fig.update_xaxes(title_text="epoch")
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=1)
    # The legend at the container's foot, below the axis titles (at y=-0.25 of the plot it could land on "epoch")
    fig.update_layout(height=340, margin={"t": 40, "b": 90, "l": 50, "r": 20}, legend=LEGEND_BELOW)
    if title:
        titled(fig, wrap_title(title, 70), 340)
        fig.update_layout(margin_t=fig.layout.margin.t + 22, margin_b=90)  # the panel titles under the chart's own
    return fig


def image_grid(rows: list[tuple[str, np.ndarray]], gap: int = 1) -> go.Figure:
    """One gray heat map of labelled rows of 8x8 images in 0..1 (light strokes on dark, as digits are)."""
    n_cols = max(len(images) for _, images in rows)
    size = 8 + gap
    canvas = np.full((len(rows) * size - gap, n_cols * size - gap), np.nan)
    for r, (_, images) in enumerate(rows):
        for c, image in enumerate(images):
            canvas[r * size : r * size + 8, c * size : c * size + 8] = image
    fig = go.Figure(go.Heatmap(z=canvas, colorscale="gray", zmin=0, zmax=1, showscale=False,
                               hovertemplate="%{z:.2f}<extra></extra>"))
    # Row names on two lines: on one they took half of a 1024-pixel page and left the digits a narrow strip, drawn
    # small in a tall, mostly blank chart (the images keep their square pixels, so the width sets the height)
    fig.update_yaxes(autorange="reversed", tickvals=[r * size + 3.5 for r in range(len(rows))],
                     ticktext=[wrap_title(label, 22) for label, _ in rows], showgrid=False,
                     zeroline=False)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, scaleanchor="y", constrain="domain")
    fig.update_layout(height=60 * len(rows) + 20, margin={"t": 10, "b": 10, "l": 10, "r": 10},
                      plot_bgcolor="white")
    return fig


def ssim_bars(labels: list[str], ssim: list[float], baselines: list[dict]) -> go.Figure:
    """SSIM per protection/attacker, with the baselines as dashed lines (higher = more leaked)."""
    # Each value printed whole beside its bar: the axis leaves room on both sides and the text is not clipped
    # (at 1024 px '0.989' was cut to '0.98' and '-0.016' to '016')
    fig = go.Figure(go.Bar(x=ssim, y=labels, orientation="h", marker_color="#7f7f7f",
                           text=[f"{v:.3f}" for v in ssim], textposition="outside", cliponaxis=False))
    for baseline, dash in zip(baselines, ("dot", "dash"), strict=False):
        fig.add_vline(x=baseline["ssim"], line_dash=dash, line_color="#2ca02c",
                      annotation_text=f"{baseline['name']} {baseline['ssim']:.2f}", annotation_position="top")
    fig.update_yaxes(autorange="reversed")
    low = min(-0.1, min(ssim) - 0.25) if min(ssim) < 0 else -0.05
    fig.update_xaxes(title_text="SSIM of the reconstruction (1 = perfect)", range=[low, 1.25])
    fig.update_layout(height=60 + 40 * len(labels), margin={"t": 40, "b": 40, "l": 10, "r": 20})
    return fig
