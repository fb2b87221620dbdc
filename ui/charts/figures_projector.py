"""Projector mode: the same figure readable from the back of a lecture hall."""

from __future__ import annotations

import plotly.graph_objects as go

from ui.charts.figures import LABEL_FONT, LAYOUT, wrap_title

PROJECTOR_TITLE_LINES = 2  # every title in projector mode: one or two lines, so charts side by side line up


def for_projector(fig: go.Figure, size: int = 18) -> go.Figure:
    """The same figure readable from the back of a lecture hall: every text of the chart (title, axis titles, ticks,
    legend, colour bar, bar labels) at `size` pixels or more, instead of plotly's 10-13. The title is wrapped again
    for the larger letters (as wide as before) in at most PROJECTOR_TITLE_LINES lines, its letters smaller (down to
    14 px) where that takes it, and every title holds that many lines, so the plots of charts side by side start at
    the same height. The export menu's modebar is hidden (chart's own menu stays)."""
    title = fig.layout.title.text
    if title:
        title_size, lines = projector_title(title, size)
        n_lines = lines.count("<br>") + 1
        height = (fig.layout.height or LAYOUT["height"]) - 18 * title.count("<br>")
        fig.update_layout(title=dict(text=lines, font=dict(size=title_size), y=1.0, yref="container",
                                     yanchor="top", pad=dict(t=16)),
                          # room for `size` letters even where the title's are smaller: a plot beside charts
                          # whose titles kept `size` starts at the same height
                          margin_t=30 + (size + 8) * n_lines,
                          height=height + (size + 8) * n_lines - 13)
    fig.update_layout(font=dict(size=size), legend_font_size=size)
    # an axis of one label per row or column (tokens, drawn small to fit) keeps its size, and labels of several lines
    # (Split learning's rows of digits) plotly's 12 px: enlarged, they collided with their neighbours
    def enlarge(axis) -> None:
        stacked = any("<br>" in str(text) for text in (axis.ticktext or ()))
        tick = LABEL_FONT if axis.tickfont.size == LABEL_FONT else 12 if stacked else size - 2
        axis.update(tickfont_size=tick, title_font_size=size)

    fig.for_each_xaxis(enlarge)
    fig.for_each_yaxis(enlarge)
    if any(trace.type == "bar" and trace.orientation == "h" for trace in fig.data):  # a row per label, grown
        fig.update_layout(height=int((fig.layout.height or LAYOUT["height"]) * (size / 13) ** 2))
    if fig.layout.legend.yref == "container" and fig.layout.legend.y == 0:  # a legend at the foot, below the axis
        fig.update_layout(margin_b=int((fig.layout.margin.b or 0) * size / 12))  # ticks and title: more room
    fig.update_annotations(font_size=size)
    fig.update_traces(textfont_size=size - 2, selector=dict(type="bar"))
    fig.update_traces(colorbar_tickfont_size=size - 2, selector=dict(type="heatmap"))
    return fig


PROJECTOR_TITLE_PX = 280  # a title at least this wide: about a third of a 1024-pixel page, the narrowest column
MIN_PROJECTOR_TITLE_SIZE = 14


def projector_title(title: str, size: int) -> tuple[int, str]:
    """(font size, the title in lines) for projector mode: wrapped as wide as it was at plotly's 13 px (at least
    PROJECTOR_TITLE_PX), in at most PROJECTOR_TITLE_LINES lines, the letters made smaller (down to
    MIN_PROJECTOR_TITLE_SIZE) where that takes it, padded with empty lines to exactly that many. A title that needs
    more lines even then keeps them (nothing is cut); tests/e2e/test_layout_widths.py finds it."""
    words = title.replace("<br>", " ")
    longest = max(len(line) for line in title.split("<br>"))
    width_px = max(longest * 13 * 0.6, PROJECTOR_TITLE_PX)  # what the title's longest line took at 13 px
    for title_size in range(size, MIN_PROJECTOR_TITLE_SIZE - 1, -1):
        lines = wrap_title(words, max(12, int(width_px / (0.52 * title_size)))).split("<br>")  # bold letters: ~0.5 em
        if len(lines) <= PROJECTOR_TITLE_LINES:
            break
    lines += [" "] * (PROJECTOR_TITLE_LINES - len(lines))
    return title_size, "<br>".join(lines)
