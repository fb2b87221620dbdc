"""Plotly builders: arrays in, go.Figure out; no model code.

Every heatmap is decimated to at most MAX_CELLS cells (block max of |x| keeps sign-free structure
visible) and sent as float32, so one page render stays far below 2 MB of chart data.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import torch

MAX_CELLS = 24_000
FLOOR = 1e-18  # exact zeros drawn on a log axis
COLORS = {"hidden state": "#1f77b4", "attention map": "#d62728"}
EXACT_COLOR = "rgb(26, 152, 80)"  # green: exactly equal, apart from the error scale
OUTPUT_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2")


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
_RAW_LAYOUT = {**LAYOUT, "template": TEMPLATE.to_plotly_json()}


@functools.cache
def _colorscale(name: str) -> tuple:
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


def _axis(title: str = "", **options) -> dict:
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


def _figure(data, title: str, height: int, **layout) -> go.Figure:
    """A figure with its whole layout given at once, as plain dicts that plotly does not validate. Validation
    took 4 of a heatmap's 5 ms (the template's copy above all), and an Explore rerun draws two dozen figures
    under the server's one GIL. So these dicts are written as validation would leave them (axis titles as
    dicts, colour scales resolved by _colorscale); tests/unit/test_figure_template.py validates every chart
    and finds nothing changed."""
    return go.Figure(data if isinstance(data, list) else [data],
                     layout={**_RAW_LAYOUT, **_title_layout(title, height), **layout}, _validate=False)


# A probability map this many cells or more (a 257-token attention map) is drawn on a log colour scale: on a linear
# one its mass near 1/n looks uniformly dark beside a few cells near 1, and the structure is invisible.
LOG_PROBABILITY_CELLS = 64 * 64
LOG_DECADES = 3  # the log scale's range below its largest value; smaller cells take the scale's darkest colour


def _blocks_note(row_step: int, col_step: int, how: str = "mean") -> str:
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
    note = _blocks_note(row_step, col_step)
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
    trace = dict(type="heatmap", z=values.astype(np.float32), x=x, y=y, colorscale=_colorscale(colorscale),
                 zmin=zmin, zmax=zmax, colorbar=colorbar)
    if hover:
        trace["hovertemplate"] = hover
    yaxis, xaxis = _axis(y_title, autorange="reversed"), _axis(x_title)
    if not y_ticks or shape[0] == 1:
        yaxis.update(showticklabels=False)
    if y_labels is not None and row_step == 1 and len(y_labels) <= MAX_LABELS:
        yaxis.update(tickmode="array", tickvals=list(y), ticktext=list(y_labels), tickfont=dict(size=LABEL_FONT))
    if x_labels is not None and col_step == 1 and len(x_labels) <= MAX_LABELS:
        xaxis.update(tickmode="array", tickvals=list(x), ticktext=list(x_labels), tickangle=-60,
                     tickfont=dict(size=LABEL_FONT))
    shapes = path_shapes(row_paths, col_paths, row_step, col_step)
    return _figure(trace, (wrap_title(title, wrap) if wrap else title) + note, height, xaxis=xaxis, yaxis=yaxis,
                   **({"shapes": shapes} if shapes else {}))


# The followed items' outlines: a token in black, a channel or an MLP neuron in magenta (neither is a colour of the
# RdBu or Viridis scales), each over a wider white halo so it shows on dark and on light cells alike.
PATH_COLORS = {"token": "#111111", "channel": "#e6007e", "neuron": "#e6007e"}
PATH_NAME = "path"  # a shape named "path <item> <position>" outlines where a followed item is (tests read it)


def _outline(item: str, position: int, box: dict) -> list[dict]:
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
        shapes += _outline(item, position, dict(xref="x domain", x0=0, x1=1, yref="y", y0=centre - row_step / 2,
                                                y1=centre + row_step / 2))
    for item, position in col_paths:
        centre = (position // col_step) * col_step
        shapes += _outline(item, position, dict(yref="y domain", y0=0, y1=1, xref="x", x0=centre - col_step / 2,
                                                x1=centre + col_step / 2))
    return shapes


def bars(labels, values, title: str, x_title: str = "", color: str = "#4c78a8") -> go.Figure:
    return _figure(dict(type="bar", x=list(values), y=list(labels), orientation="h", marker=dict(color=color),
                        text=[f"{v:.3f}" for v in values], textposition="auto"),
                   title, 260, yaxis=dict(autorange="reversed", type="category"), xaxis=_axis(x_title))


def _threshold_parts(value: float, label: str, color: str, row: int | None, position: str, dash: str,
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
    line, text = _threshold_parts(value, label, color, row, position, dash, yanchor)
    fig.add_shape(line)
    fig.add_annotation(text)


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


def _two_panels(title: str, height: int, traces: list[dict], thresholds: list[tuple[dict, dict]],
                xaxes: tuple[dict, dict], **layout) -> go.Figure:
    """Relative errors on top, absolute below; traces name their panel by "row" (1 or 2)."""
    import json

    base = json.loads(_two_panels_base())
    for axis, extra in zip(("xaxis", "xaxis2"), xaxes, strict=True):
        base[axis].update(extra)
    for trace in traces:
        row = trace.pop("row")
        trace.update(xaxis="x" if row == 1 else "x2", yaxis="y" if row == 1 else "y2")
    annotations = base.pop("annotations") + [text for _, text in thresholds]
    shapes = [line for line, _ in thresholds]
    return go.Figure(traces, layout={**base, **_RAW_LAYOUT, "height": height, "annotations": annotations,
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
        thresholds.append(_threshold_parts(tolerance, f"tolerance {tolerance:.0e}", "gray", 1, "right", "dash",
                                           "bottom"))
    if broken_at:
        thresholds.append(_threshold_parts(broken_at, f"broken above {broken_at:.0e}", "#e45756", 1, "left", "dash",
                                           "bottom"))
    layers = sorted({r["layer"] for r in rows})
    ticks = layer_ticks(layers)
    return _two_panels(title, 540, traces, thresholds,
                       (ticks, dict(ticks, title=dict(text="layer (-1 = embeddings, outputs after the last block)"))),
                       legend=LEGEND_BELOW, margin=dict(l=60, r=20, t=60, b=110))


def permutation_figure(index, title: str, max_points: int = 4096) -> go.Figure:
    """A permutation as its matrix drawn sparsely: a dot at (old position, new position)."""
    index = to_numpy(index).astype(np.int64)
    n = len(index)
    step = max(1, math.ceil(n / max_points))
    new_positions = np.arange(0, n, step)
    note = f" (every {step}th row)" if step > 1 else ""
    return _figure(dict(type="scattergl", x=index[new_positions].astype(np.float32),
                        y=new_positions.astype(np.float32), mode="markers",
                        marker=dict(size=max(2, min(12, 360 // max(n, 1))), symbol="square", color="#4c78a8")),
                   title + note, 300, xaxis=_axis("original index", range=[-0.5, n - 0.5]),
                   yaxis=_axis("new position", range=[n - 0.5, -0.5]))


def payload_bytes(figures) -> int:
    return sum(len(fig.to_json()) for fig in figures)


def pixels_to_rgb(pixels) -> np.ndarray:
    """A normalized pixel batch [1, C, H, W] -> an RGB uint8 array [H, W, 3], stretched to its own min..max.

    A permutation of patches keeps the min and max, so scrambled pixels get exactly the original's colours.
    """
    array = to_numpy(pixels)[0]
    lo, hi = float(array.min()), float(array.max())
    array = (array - lo) / (hi - lo) if hi > lo else np.zeros_like(array)
    array = (np.moveaxis(array, 0, -1) * 255).round().astype(np.uint8)
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return array


def mosaic_image(pixels, patch_size: int, display: int = 240, smooth: bool = False, patch: int | None = None):
    """A normalized pixel batch [1, C, H, W] -> an upscaled PIL image with its patch grid drawn. smooth: a grey
    picture as dark ink on white, upscaled smoothly (an 8x8 digit drawn as white squares on black is not
    recognisable); the grid lines then thin and light. patch: a followed patch (row-major number), outlined as the
    charts outline a followed token (black over a white halo)."""
    from PIL import Image, ImageDraw

    array = pixels_to_rgb(pixels)
    if smooth and bool((array[..., 0] == array[..., 1]).all() and (array[..., 1] == array[..., 2]).all()):
        array = 255 - array
    height, width = array.shape[:2]
    scale = max(1, display // max(height, width))
    image = Image.fromarray(array).resize((width * scale, height * scale),
                                          Image.Resampling.BICUBIC if smooth else Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(image)
    grid = (255, 200, 120) if smooth else (255, 160, 0)
    step = patch_size * scale
    for offset in range(step, width * scale, step):
        draw.line([(offset, 0), (offset, height * scale)], fill=grid, width=1)
    for offset in range(step, height * scale, step):
        draw.line([(0, offset), (width * scale, offset)], fill=grid, width=1)
    if patch is not None:
        row, col = divmod(patch, width // patch_size)
        box = [col * step, row * step, (col + 1) * step - 1, (row + 1) * step - 1]
        draw.rectangle(box, outline=(255, 255, 255), width=5)
        draw.rectangle([box[0] + 1, box[1] + 1, box[2] - 1, box[3] - 1], outline=(17, 17, 17), width=3)
    return image


def token_chips(tokens: list[str], origins: list[int], followed: int | None = None) -> str:
    """HTML: tokens as coloured chips; the colour follows each token's original position. followed: the original
    position of a followed token, its chip outlined as the charts outline it."""
    import html

    n = max(len(tokens), 1)
    chips = []
    for token, origin in zip(tokens, origins, strict=True):
        hue = int(300 * origin / n)
        outline = (f"outline:2.5px solid {PATH_COLORS['token']};box-shadow:0 0 0 4px white;font-weight:bold;"
                   if origin == followed else "")
        chips.append(f'<span style="background:hsl({hue},70%,85%);color:#111;border-radius:4px;padding:1px 4px;'
                     f'margin:1px;display:inline-block;font-family:monospace;font-size:0.85em;{outline}" '
                     f'title="original position {origin}">{html.escape(token)}</span>')
    return '<div style="line-height:1.9">' + "".join(chips) + "</div>"


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
    thresholds = [_threshold_parts(tolerance, f"tolerance {tolerance:.0e}", "gray", 1, "right", "dash", "bottom")
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
    fig = _figure(dict(type="bar", x=labels, y=[max(v, 1e-12) for v in values], marker=dict(color=colors),
                       hovertext=[f"{s.worst_tensor}: {s.error_over_tolerance:.2g} x tolerance" for s in stages],
                       hoverinfo="text", name="worst error / tolerance"),
                  title, 320, yaxis=_axis("worst error / tolerance", type="log"),
                  xaxis=_axis("in the order the run computed them", type="category"))
    threshold(fig, 1.0, "tolerance", color="#e45756")
    return fig


# Transparent where the class token does not look, opaque hot colours where it does: the photo stays visible.
HEAT = [[0.0, "rgba(20,20,90,0)"], [0.2, "rgba(40,40,200,0.12)"], [0.45, "rgba(130,50,220,0.45)"],
        [0.7, "rgba(240,70,40,0.7)"], [1.0, "rgba(255,235,0,0.9)"]]


def image_data_uri(rgb: np.ndarray, exact: bool | None = None) -> str:
    """An RGB array as a data URI: PNG when exact (by default for small pictures: every pixel kept), else JPEG
    (photos: a sixth of the bytes)."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    kind = "png" if (rgb.shape[0] * rgb.shape[1] <= 4096 if exact is None else exact) else "jpeg"
    Image.fromarray(rgb).save(buffer, format=kind.upper(), **({"optimize": True} if kind == "png" else {
        "quality": 90}))
    return f"data:image/{kind};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


PALE = 170  # the darkest grey of a picture under an attention overlay


def attention_overlay(rgb, grid, patch_size: int, title: str, zmax: float | None = None,
                      display: int = 224, name: str = "", patch: int | None = None) -> go.Figure:
    """A photo with one number per patch drawn over it as a semi-transparent heatmap.

    rgb: [H, W, 3] uint8 (the model's input, e.g. pixels_to_rgb); grid: [H / patch, W / patch], cell (i, j)
    covering the patch at row i, column j; the picture is drawn pale (PALE), so the heat shows the colour bar's
    colours. Small images (8x8 digits) are upscaled by nearest neighbour to about
    `display` pixels; each heat cell is stretched over its patch. Hover shows the patch and its value; `name`
    names the heat trace (what its numbers are); patch: a followed patch (row-major number) outlined as a token."""
    # The picture drawn pale (its grey levels mapped into PALE..255): over a full-contrast photo the semi-transparent
    # heat blended with dark pixels into colours that were not on the colour bar; over a pale one they are the bar's
    rgb = (PALE + np.asarray(rgb, dtype=np.uint16) * (255 - PALE) // 255).astype(np.uint8)
    grid = to_numpy(grid)
    height, width = rgb.shape[:2]
    if grid.shape != (height // patch_size, width // patch_size):
        raise ValueError(f"grid {grid.shape} does not tile a {height}x{width} image in {patch_size}-pixel patches")
    scale = max(1, display // max(height, width))
    small = height * width <= 4096  # digits and icons: exact pixels as PNG; photos as JPEG
    if scale > 1:
        rgb = np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)
    step = patch_size * scale
    if zmax is None:
        zmax = float(np.nanmax(grid)) if grid.size else 1.0
    patch_number = np.arange(grid.size, dtype=np.int32).reshape(grid.shape)  # row-major, as the tokens
    heat = dict(
        type="heatmap", z=grid.astype(np.float32), x0=(step - 1) / 2, dx=step, y0=(step - 1) / 2, dy=step,
        zmin=0.0, zmax=zmax or 1.0, colorscale=HEAT, customdata=patch_number, name=name,
        colorbar=dict(orientation="h", thickness=8, len=1.0, y=-0.02, yanchor="top", tickfont=dict(size=10)),
        hovertemplate="patch %{customdata}: %{z:.4f}<extra></extra>")
    image = dict(type="image", source=image_data_uri(rgb, exact=small), hoverinfo="skip")
    shapes = []
    if patch is not None:
        row, col = divmod(patch, grid.shape[1])
        shapes = _outline("token", patch, dict(xref="x", yref="y", x0=col * step - 0.5, x1=(col + 1) * step - 0.5,
                                               y0=row * step - 0.5, y1=(row + 1) * step - 0.5))
    return _figure([image, heat], title, 330,
                   xaxis=dict(visible=False, range=[-0.5, rgb.shape[1] - 0.5], constrain="domain"),
                   yaxis=dict(visible=False, range=[rgb.shape[0] - 0.5, -0.5], scaleanchor="x", constrain="domain"),
                   **({"shapes": shapes} if shapes else {}))


def head_grid_figure(maps, layers, title: str, holds=None, zmax: float | None = None) -> go.Figure:
    """A layer x head grid of small attention maps tiled into one heatmap (one trace keeps it light).
    holds: per layer, which original head each position holds; a moved head is labelled with it."""
    maps = to_numpy(maps)
    n_layers, n_heads, cells, _ = maps.shape
    step = cells + 1  # one blank (NaN) row and column between tiles
    tiled = np.full((n_layers * step - 1, n_heads * step - 1), np.nan, dtype=np.float32)
    for i in range(n_layers):
        for h in range(n_heads):
            tiled[i * step:i * step + cells, h * step:h * step + cells] = maps[i, h]
    zmax = zmax if zmax is not None else float(np.nanmax(maps)) or 1.0
    height = max(260, 24 * n_layers + 90)
    moved = [] if holds is None else [
        dict(x=h * step + cells / 2 - 0.5, y=i * step + cells / 2 - 0.5, showarrow=False, text=f"<b>{holds[i][h]}</b>",
             font=dict(color="white", size=11))
        for i in range(n_layers) for h in range(n_heads) if holds[i][h] != h]
    return _figure(dict(type="heatmap", z=tiled, colorscale=_colorscale("Viridis"), zmin=0.0, zmax=zmax,
                        colorbar=dict(thickness=10), hoverongaps=False), title, height,
                   xaxis=_axis("head", tickmode="array", tickvals=[h * step + cells / 2 - 0.5 for h in range(n_heads)],
                               ticktext=[str(h) for h in range(n_heads)], showgrid=False),
                   yaxis=_axis("layer", tickmode="array",
                               tickvals=[i * step + cells / 2 - 0.5 for i in range(n_layers)],
                               ticktext=[str(layer) for layer in layers], autorange="reversed", showgrid=False),
                   **({"annotations": moved} if moved else {}))


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


def difference_map(original, restored, title: str, x_title: str = "channel", y_title: str = "token") -> go.Figure:
    """|restored - original| per cell on a log colour scale, relative to the original's largest |value|, so round-off
    (around 1e-16 in float64) and a real break (around 1) are decades apart. Exact zeros sit at FLOOR."""
    reference = to_numpy(original).astype(np.float64)
    scale = float(np.abs(reference).max()) or 1.0
    relative = np.abs(to_numpy(restored).astype(np.float64) - reference) / scale
    values, row_step, col_step = decimate(np.log10(np.maximum(relative, FLOOR)))
    note = _blocks_note(row_step, col_step, "max")
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
    return _figure([dict(type="heatmap", z=values.astype(np.float32), colorscale=_colorscale("Magma"), zmin=-18,
                         zmax=0, x=x, y=y, colorbar=dict(thickness=10, tickvals=ticks,
                                                         ticktext=[f"1e{t}" for t in ticks]),
                         hovertemplate="row %{y}, column %{x}: 10^%{z:.1f}<extra></extra>", showlegend=False),
                    dict(type="heatmap", z=exact, x=x, y=y, colorscale=((0.0, EXACT_COLOR), (1.0, EXACT_COLOR)),
                         showscale=False, name="exactly equal (0)", showlegend=True,
                         hovertemplate="row %{y}, column %{x}: exactly equal<extra></extra>")],
                   title + note, LAYOUT["height"] + 30, yaxis=_axis(y_title, autorange="reversed"),
                   xaxis=_axis(x_title), legend=dict(orientation="h", yanchor="top", y=-0.3, x=0))


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


LABEL_FONT = 9  # token labels on a map's axes, one per row or column
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
                          margin_t=30 + (title_size + 8) * n_lines,
                          height=height + (title_size + 8) * n_lines - 13)
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
