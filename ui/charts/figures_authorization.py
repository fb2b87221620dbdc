"""Plotly builders for the Authorization page's attacker: numbers in, go.Figure out; no model code."""

from __future__ import annotations

import plotly.graph_objects as go

from ui.charts.figures import LAYOUT, LEGEND_BELOW, titled, wrap_title

# (field, name, colour, dash, width): the attacker's line is wide and the owner's dashed over it, so where the two
# coincide (the whole key recovered) both stay visible
SERIES = (("share_recovered", "key recovered (share of its channel positions)", "#9467bd", "solid", 2),
          ("attacker", "attacker's unlocked accuracy", "#d62728", "solid", 6),
          ("owner", "owner's accuracy (the fine-tuned model, with the key)", "#2ca02c", "dash", 2))


def fine_tune_attack(sweep, chance: float) -> go.Figure:
    """Against the owner's fine-tuning steps after locking: how much of the key the attacker recovers, the
    accuracy the attacker unlocks, and the owner's own accuracy. Steps are categories (0 has no place on a log
    axis, and the steps are spaced about evenly in log)."""
    steps = [str(k) for k in sweep.steps]
    fig = go.Figure()
    for field, name, color, dash, width in SERIES:
        values = [100 * v for v in getattr(sweep, field)]
        fig.add_trace(go.Scatter(x=steps, y=values, mode="lines+markers", name=name,
                                 line=dict(color=color, dash=dash, width=width),
                                 hovertemplate="%{y:.1f}%<extra>" + name + "</extra>"))
    fig.add_trace(go.Scatter(x=[steps[0], steps[-1]], y=[100 * chance] * 2, mode="lines",
                             name=f"chance {100 * chance:.0f}%", line=dict(color="gray", dash="dot", width=1.5),
                             hoverinfo="name"))
    # the legend at the figure's foot, under the axis title (at y=-0.22 of the plot it covered the ticks at 1440 px)
    fig.update_layout(**LAYOUT, legend=LEGEND_BELOW)
    fig.update_xaxes(title="owner's fine-tuning steps after locking", type="category")
    fig.update_yaxes(title="%", range=[0, 105])
    # short enough for two lines on a projector
    title = (f"The key recovered from the base checkpoint and the owner's fine-tuned release (learning rate "
             f"{sweep.learning_rate:g})")
    return titled(fig, wrap_title(title, 70), 420).update_layout(margin_b=110)  # ticks, axis title, legend
