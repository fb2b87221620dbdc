"""Proof charts tell the truth: relative errors are drawn against the (relative) tolerance, absolute errors on
their own axis with no tolerance line, threshold labels sit on their lines (log axes), and raised float32
tolerances are drawn per tensor."""

import math

from ui.charts import figures
from ui.charts.figures_proof import EXACT_COLOR, difference_map, error_chart, tensor_error_chart

ROWS = [{"layer": i, "kind": "hidden state", "abs": 10.0 ** (i - 2), "rel": 10.0 ** (-9 + i),
         "tolerance": 1e-4 if i != 2 else 3e-4} for i in range(4)]


def axis_of(trace) -> str:
    return trace.yaxis or "y"


def test_relative_errors_face_the_tolerance_and_absolute_errors_have_their_own_axis():
    fig = error_chart(ROWS, "un-scrambled vs original", tolerance=1e-4, broken_at=1e-3)
    rel = next(t for t in fig.data if t.name == "hidden state (relative)")
    absolute = next(t for t in fig.data if t.name == "hidden state (absolute)")
    assert axis_of(rel) == "y" and axis_of(absolute) == "y2"
    assert list(absolute.y) == [r["abs"] for r in ROWS] and list(rel.y) == [r["rel"] for r in ROWS]
    lines = [(shape.y0, shape.yref) for shape in fig.layout.shapes]
    assert sorted(lines) == [(1e-4, "y"), (1e-3, "y")]  # both thresholds on the relative panel only
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "log"


def test_threshold_labels_sit_on_their_lines():
    fig = error_chart(ROWS, "t", tolerance=1e-4, broken_at=1e-3)
    labels = {a.text: a for a in fig.layout.annotations if a.yref == "y"}
    assert math.isclose(labels["tolerance 1e-04"].y, -4) and math.isclose(labels["broken above 1e-03"].y, -3)


def test_a_raised_float32_tolerance_is_drawn_for_its_tensor():
    fig = error_chart(ROWS, "t", tolerance=1e-4)
    raised = next(t for t in fig.data if t.name == "raised own tolerance")
    assert list(raised.x) == [2] and list(raised.y) == [3e-4]


def test_the_per_tensor_chart_has_the_same_split_and_every_tensors_own_tolerance():
    names = ["a", "b", "c"]
    fig = tensor_error_chart(names, [1.0, 2.0, 0.0], [1e-6, 2e-5, 0.0], "check", 1e-4,
                             tolerances=[1e-4, 4e-4, 1e-4])
    bars = next(t for t in fig.data if t.name == "max rel error")
    absolute = next(t for t in fig.data if t.name == "max abs error")
    own = next(t for t in fig.data if t.name == "own tolerance")
    assert axis_of(bars) == "y" and axis_of(absolute) == "y2" and axis_of(own) == "y"
    assert list(own.y) == [1e-4, 4e-4, 1e-4] and list(absolute.y) == [1.0, 2.0, figures.FLOOR]
    assert [(s.y0, s.yref) for s in fig.layout.shapes] == [(1e-4, "y")]


def test_a_robust_colour_scale_ignores_a_few_outlier_channels():
    import numpy as np

    values = np.ones((10, 400))
    values[:, 3] = 500.0  # one outlier channel
    bound, largest = figures.robust_zmax(values)
    assert largest == 500.0 and bound == 1.0  # a quarter of a percent of the cells: the 99th percentile skips them
    assert figures.robust_zmax(np.zeros((2, 2))) == (1.0, 0.0)


def test_the_rotation_near_miss_chart_puts_its_tolerance_label_on_the_line():
    from types import SimpleNamespace

    from perm_core.verify.tolerances import TensorError
    from ui.charts import figures_fusion

    comparison = SimpleNamespace(symmetry_label="plane", broken_label="general", title="t",
                                 symmetry=[TensorError("a", 1e-9, 1e-9)], broken=[TensorError("a", 0.5, 0.5)])
    fig = figures_fusion.error_comparison(comparison, 1e-4)
    label = next(a for a in fig.layout.annotations if a.text == "tolerance 0.0001")
    assert math.isclose(label.y, -4) and [s.y0 for s in fig.layout.shapes] == [1e-4]


def test_difference_map_is_log10_of_the_relative_difference_with_zeros_at_the_floor():
    import numpy as np

    from ui.charts import figures

    original = np.array([[2.0, -4.0], [1.0, 0.5]])
    restored = original.copy()
    restored[0, 1] += 4e-3  # 1e-3 of the largest |value|
    fig = difference_map(original, restored, "t")
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (2, 2)
    assert abs(z[0, 1] - (-3.0)) < 1e-5
    assert (np.delete(z.flatten(), 1) == np.log10(figures.FLOOR)).all()


def test_difference_map_of_a_large_tensor_keeps_the_largest_cell_of_each_block():
    import numpy as np

    original = np.ones((300, 900))
    restored = original.copy()
    restored[123, 457] += 0.5
    z = np.asarray(difference_map(original, restored, "t").data[0].z, dtype=float)
    assert z.size < original.size and np.isclose(z.max(), np.log10(0.5), atol=1e-5)
    assert (z == z.max()).sum() == 1


def test_colour_scales_reach_the_browser_as_rgb_so_exact_zeros_are_black():
    """plotly.js draws the hex '#000004' (Magma's first stop) purple: a difference map's exact zeros and its colour
    bar's 1e-18 end looked like errors near 1e-7 (seen in Chromium). Every stop is rgb(...); the hex control shows
    what went wrong."""
    import numpy as np
    import plotly.graph_objects as go

    for name in ("Magma", "Viridis", "RdBu"):
        scale = figures.rgb_colorscale(name)
        assert all(colour.startswith("rgb(") for _, colour in scale), name
    assert figures.rgb_colorscale("Magma")[0] == (0.0, "rgb(0, 0, 4)")
    assert go.Heatmap(colorscale="Magma").to_plotly_json()["colorscale"][0][1] == "#000004"  # plotly.py's own
    fig = difference_map(np.ones((2, 2)), np.ones((2, 2)), "t")
    assert fig.data[0].colorscale[0][1] == "rgb(0, 0, 4)" and set(np.ravel(fig.data[0].z)) == {-18.0}


def test_exact_zeros_have_their_own_colour_and_legend_entry():
    """A cell whose un-scrambled value equals the original exactly is drawn in EXACT_COLOR, named in the legend,
    and not in the error scale's colours; a cell off by round-off is not."""
    import numpy as np

    original = np.array([[2.0, -4.0], [1.0, 0.5]])
    restored = original.copy()
    restored[0, 1] += 4e-15
    fig = difference_map(original, restored, "t")
    scale, exact = fig.data
    assert exact.name == "exactly equal (0)" and exact.showlegend and not scale.showlegend
    assert exact.colorscale[0][1] == exact.colorscale[-1][1] == EXACT_COLOR
    assert EXACT_COLOR not in {colour for _, colour in scale.colorscale}
    painted = np.asarray(exact.z, dtype=float)
    assert np.isnan(painted[0, 1]) and (np.delete(painted.flatten(), 1) == 1.0).all()


def test_every_axis_writes_powers_of_ten_not_si_suffixes():
    """A log axis of 1e-15 .. 1e-6 read "1f" and "1µ" under plotly's default (SI suffixes); the charts' template
    sets powers of ten on every x and y axis, subplots included."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    from ui.charts import figures

    for fig in (go.Figure(layout=dict(template=figures.TEMPLATE)),
                make_subplots(rows=1, cols=2).update_layout(template=figures.TEMPLATE)):
        template = fig.to_plotly_json()["layout"]["template"]["layout"]
        assert template["xaxis"]["exponentformat"] == template["yaxis"]["exponentformat"] == "e"
    plain = pio.templates["plotly_white"].to_plotly_json()["layout"]["yaxis"]
    assert plain.get("exponentformat", "B") == "B"  # the control: without it, plotly writes SI suffixes


def test_a_figure_built_without_the_template_gets_powers_of_ten_too():
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from ui.charts import figures

    fig = make_subplots(rows=1, cols=2)
    fig.add_trace(go.Bar(x=["a"], y=[1e-6]), row=1, col=1)
    fig.update_yaxes(type="log")
    fig.update_xaxes(exponentformat="power", row=1, col=2)  # an axis that chose its own format keeps it
    fig = figures.powers_of_ten(fig)
    assert [fig.layout.yaxis.exponentformat, fig.layout.yaxis2.exponentformat] == ["e", "e"]
    assert [fig.layout.xaxis.exponentformat, fig.layout.xaxis2.exponentformat] == ["e", "power"]
    assert go.Figure(go.Bar(x=["a"], y=[1e-6])).layout.yaxis.exponentformat is None  # the control: plotly's own
