"""What every chart shares: plotly builders take arrays and return go.Figure, with no model code.

The template, layout and legends; arrays to numpy and decimated to at most MAX_CELLS cells (so one page render stays
far below 2 MB of chart data); titles wrapped; bars, paired bars and a threshold on a log axis. The charts themselves:
figures_heatmap, figures_path (followed items and permutations), figures_attention, figures_input, figures_proof,
figures_projector."""

from __future__ import annotations

import functools
import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import torch

MAX_CELLS = 24_000
FLOOR = 1e-18  # exact zeros drawn on a log axis
LABEL_FONT = 9  # token labels on a map's axes, one per row or column


def _white_template() -> go.layout.Template:
    """plotly_white cut down to what these charts use. Named as a string, the whole template (defaults for
    every 2-D, 3-D, polar and map trace) is copied and validated into each figure: 10 ms a figure, and an
    Explore rerun draws two dozen figures under the server's one GIL. Named as one object, it costs 2-3 ms and
    still wins over whatever default template the process has (Streamlit sets its own when imported)."""
    white = pio.templates["plotly_white"].to_plotly_json()
    layout_keys = ("autotypenumbers", "colorway", "font", "hovermode", "hoverlabel", "paper_bgcolor",
                   "plot_bgcolor", "coloraxis", "colorscale", "xaxis", "yaxis", "shapedefaults",
                   "annotationdefaults", "title")
    trace_types = ("bar", "heatmap", "histogram", "scatter", "scattergl")
    layout = {k: v for k, v in white["layout"].items() if k in layout_keys}
    for axis in ("xaxis", "yaxis"):  # powers of ten as 1e-9 on every axis, never SI suffixes (1µ, 1f)
        layout[axis] = {**layout.get(axis, {}), "exponentformat": "e"}
    return go.layout.Template(layout=layout, data={k: v for k, v in white["data"].items() if k in trace_types})


TEMPLATE = _white_template()
LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=300, template=TEMPLATE)
# A legend under the plot sits at the figure's bottom edge, inside a bottom margin that holds the x axis' ticks and
# title and the legend apart. Placed at a fraction of the plot area's height instead (y < 0 on "paper"), it moves
# with the plot area: after a window is resized plotly keeps the margins it pushed at the old width, and the
# legend lands on the axis title.
LEGEND_BELOW = dict(orientation="h", yref="container", yanchor="bottom", y=0.0, x=0)
# A legend above the plot's top right corner, on one line: under the plot it covered the x labels (the walk's step 5)
LEGEND_ABOVE = dict(orientation="h", x=1.0, xanchor="right", y=1.0, yanchor="bottom")
# A legend beside the plot (at its right, top aligned), for charts whose x labels (tensor names) take any height below:
# a legend under the plot at a fraction of its height landed on them (Check, the walk's step 5). It pushes the right
# margin, so it never covers the plot either.
LEGEND_BESIDE = dict(orientation="v", x=1.01, xanchor="left", y=1.0, yanchor="top")
RAW_LAYOUT = {**LAYOUT, "template": TEMPLATE.to_plotly_json()}


@functools.cache
def rgb_colorscale(name: str) -> tuple:
    """plotly.py's scale for a name (plotly.js has other colours under some of the same names, so a name must not
    reach the browser as it is), each colour written as rgb(r, g, b): plotly.js 3 draws Magma's first stop,
    '#000004', purple instead of black, so the exact zeros of a difference map looked like errors near 1e-7."""
    return tuple((position, _rgb(colour)) for position, colour in
                 go.Heatmap(colorscale=name).to_plotly_json()["colorscale"])


def _rgb(colour: str) -> str:
    if not (colour.startswith("#") and len(colour) == 7):
        return colour
    red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({red}, {green}, {blue})"


def axis_titled(title: str = "", **options) -> dict:
    return dict(title=dict(text=title), **options)


def to_numpy(array) -> np.ndarray:
    if hasattr(array, "detach"):
        if array.device.type == "cpu" and not array.requires_grad and array.dtype != torch.bfloat16:
            # numpy() keeps the GIL; detach/to/double are three torch calls, each a wait for the GIL under a
            # classroom's load, and an Explore rerun converts a dozen tensors. The same float64 values.
            return np.asarray(array.numpy(), dtype=np.float64)
        array = array.detach().to("cpu").double().numpy()
    return np.asarray(array, dtype=np.float64)


def decimate(matrix: np.ndarray, max_cells: int = MAX_CELLS) -> tuple[np.ndarray, int, int]:
    """Average-pool a 2-D array in blocks until it has at most max_cells cells -> (array, row step, col step)."""
    rows, cols = matrix.shape
    if rows * cols <= max_cells:
        return matrix, 1, 1
    side = int(max_cells ** 0.5)
    row_step = 1 if rows <= side else math.ceil(rows / side)
    col_step = max(1, math.ceil(cols / max(1, max_cells // math.ceil(rows / row_step))))
    r, c = math.ceil(rows / row_step), math.ceil(cols / col_step)
    padded = np.full((r * row_step, c * col_step), np.nan)
    padded[:rows, :cols] = matrix
    pooled = np.nanmean(padded.reshape(r, row_step, c, col_step), axis=(1, 3))
    return pooled, row_step, col_step


CLIP_PERCENTILE = 99.0
MAX_LABELS = 16


def robust_zmax(values, percentile: float = CLIP_PERCENTILE) -> tuple[float, float]:
    """(colour bound, largest |value|): the bound is the given percentile of |values|, so a few outlier
    channels (hidden states of BERT, Llama, DINOv2 reach 10-100x the rest) do not wash every other cell out."""
    magnitudes = np.abs(to_numpy(values)).ravel()
    largest = float(magnitudes.max()) if magnitudes.size else 0.0
    bound = float(np.percentile(magnitudes, percentile)) if magnitudes.size else 0.0
    return (bound or largest or 1.0), largest


def wrap_title(text: str, chars: int) -> str:
    """Break a title into lines of at most about `chars` characters at spaces (plotly never wraps; a title
    wider than its chart is cut). A word longer than a line (a dotted parameter name) breaks after a dot."""
    lines: list[str] = []
    for word in text.split(" "):
        while len(word) > chars and "." in word[:chars]:
            cut = word[:chars].rindex(".") + 1
            lines.append(word[:cut])
            word = word[cut:]
        if lines and len(lines[-1]) + 1 + len(word) <= chars and "<br>" not in lines[-1][-4:]:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(line for line in lines if line)


def _title_layout(text: str, height: int, size: int = 13) -> dict:
    """The layout of a title whose lines are separated by <br> (plotly never wraps a title; a narrow column
    would cut it): the top margin and the height grow with the lines, so the plot area keeps its size."""
    extra = 18 * text.count("<br>")
    title = dict(text=text, font=dict(size=size))
    if extra:  # anchored at the top, so the added lines grow down into the added margin, not over the plot
        title.update(y=1.0, yref="container", yanchor="top", pad=dict(t=10))
    return dict(title=title, height=height + extra, margin={**LAYOUT["margin"], "t": LAYOUT["margin"]["t"] + extra})


def titled(fig: go.Figure, text: str, height: int, size: int = 13) -> go.Figure:
    """Give `fig` a title of several lines (see _title_layout)."""
    fig.update_layout(**_title_layout(text, height, size))
    return fig


def plain_figure(data, title: str, height: int, **layout) -> go.Figure:
    """A figure with its whole layout given at once, as plain dicts that plotly does not validate. Validation
    took 4 of a heatmap's 5 ms (the template's copy above all), and an Explore rerun draws two dozen figures
    under the server's one GIL. So these dicts are written as validation would leave them (axis titles as
    dicts, colour scales resolved by colorscale); tests/unit/test_figure_template.py validates every chart
    and finds nothing changed."""
    return go.Figure(data if isinstance(data, list) else [data],
                     layout={**RAW_LAYOUT, **_title_layout(title, height), **layout}, _validate=False)


def bars(labels, values, title: str, x_title: str = "", color: str = "#4c78a8") -> go.Figure:
    return plain_figure(dict(type="bar", x=list(values), y=list(labels), orientation="h", marker=dict(color=color),
                             text=[f"{v:.3f}" for v in values], textposition="auto"),
                        title, 260, yaxis=dict(autorange="reversed", type="category"), xaxis=axis_titled(x_title))


def paired_bars(labels, first, second, names: tuple[str, str], title: str, log: bool = False,
                height: int = 300) -> go.Figure:
    """Two values per label side by side (original beside scrambled, float64 beside float32)."""
    fig = go.Figure([go.Bar(x=list(labels), y=list(first), name=names[0], marker_color="#4c78a8"),
                     go.Bar(x=list(labels), y=list(second), name=names[1], marker_color="#f58518")])
    fig.update_layout(**{**LAYOUT, "height": height}, barmode="group", legend=LEGEND_ABOVE)
    titled(fig, title, height)
    fig.update_xaxes(type="category")
    if log:
        fig.update_yaxes(type="log", exponentformat="e")
    return fig


def threshold_parts(value: float, label: str, color: str, row: int | None, position: str, dash: str,
                    yanchor: str) -> tuple[dict, dict]:
    """The line and the label of a threshold (see threshold), as plotly's add_hline and add_annotation write them.
    position "outside": the label in the right margin, beside the line's end, off the bars (the caller leaves room)."""
    axis = "y" if (row or 1) == 1 else f"y{row}"
    line = dict(type="line", x0=0, x1=1, xref="x domain", y0=value, y1=value, yref=axis,
                line=dict(color=color, dash=dash))
    outside = position == "outside"
    if outside:
        position, yanchor = "left", "middle"
    text = dict(x=(1.01 if outside else 1) if position == "right" or outside else 0, xref="x domain",
                xanchor=position, y=math.log10(value), align="left",
                yref=axis, yanchor=yanchor, text=label, showarrow=False, font=dict(color=color, size=11),
                bgcolor="rgba(255,255,255,0.85)")  # readable where it crosses a bar or a line
    return line, text


def threshold(fig: go.Figure, value: float, label: str, color: str = "gray", row: int | None = None,
              position: str = "right", dash: str = "dash", yanchor: str = "bottom") -> None:
    """A horizontal threshold on a log axis with its label on the line. On a log axis an annotation's y is
    log10 of the value (plotly's add_hline label is placed as if the axis were linear, decades away)."""
    line, text = threshold_parts(value, label, color, row, position, dash, yanchor)
    fig.add_shape(line)
    fig.add_annotation(text)


def payload_bytes(figures) -> int:
    return sum(len(fig.to_json()) for fig in figures)


def powers_of_ten(fig):
    """Every axis and colour bar writes powers of ten (1e-15) unless it says otherwise, never plotly's SI suffixes
    (1µ, 1f: Backward's colour bars read "1.5f"). A plain-dict figure's axes carry the template, which already says
    so; its colour bars, and an application's own go.Figure, are set here."""
    if isinstance(fig, go.Figure):
        for axes in (fig.for_each_xaxis, fig.for_each_yaxis):
            axes(lambda axis: axis.update(exponentformat="e") if axis.exponentformat is None else None)
        for trace in fig.data:
            if "colorbar" in trace and trace.colorbar.exponentformat is None:
                trace.colorbar.exponentformat = "e"
    return fig
