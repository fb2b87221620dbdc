"""Issue 47's figure rules, each asserted on the figure every caller gets: powers of ten on colour bars, a readable
scale for large probability maps, probabilities never on a diverging scale, sparse layer ticks, legends off the axis
labels, projector titles of one or two lines."""

import math

import numpy as np
import plotly.graph_objects as go
import torch

from ui.charts import figures, figures_backward, figures_fusion
from ui.charts.figures_heatmap import LOG_DECADES, heatmap
from ui.charts.figures_projector import MIN_PROJECTOR_TITLE_SIZE, PROJECTOR_TITLE_LINES, for_projector
from ui.charts.figures_proof import error_chart, layer_ticks, tensor_error_chart


def test_every_colour_bar_writes_powers_of_ten():
    """Backward's |error| map has values near 1e-15: plotly's default writes them 1.5f (femto)."""
    error = np.full((8, 8), 1.5e-15)
    fig = heatmap(error, "|error|", colorscale="Greys", symmetric=False)
    assert fig.data[0].colorbar.exponentformat == "e"
    own = go.Figure(go.Heatmap(z=error))  # an application's own figure gets it where it is drawn (ui.export.chart)
    assert figures.powers_of_ten(own).data[0].colorbar.exponentformat == "e"
    for fig in figures_backward.gradient_triptych(torch.ones(1, 1, 8, 8), torch.ones(1, 1, 8, 8),
                                                  torch.ones(1, 1, 8, 8) + 1e-15, "pixels"):
        assert fig.data[0].colorbar.exponentformat == "e"


def test_a_257_token_attention_map_is_drawn_on_a_log_scale_said_on_its_bar():
    rng = np.random.default_rng(0)
    attention = rng.dirichlet(np.full(257, 0.3), size=257)  # rows sum to 1: most mass far below the largest cell
    fig = heatmap(attention, "attention", colorscale="Viridis", symmetric=False, zmax=float(attention.max()))
    trace = fig.data[0]
    assert trace.colorbar.title.text == "log scale"
    assert math.isclose(trace.zmax, math.log10(attention.max()), rel_tol=1e-6)
    assert math.isclose(trace.zmin, trace.zmax - LOG_DECADES)
    assert [f"1e{t}" for t in trace.colorbar.tickvals] == list(trace.colorbar.ticktext)
    # the colours are log10 of the (decimated) values, floored at the scale's bottom
    assert np.nanmin(np.asarray(trace.z)) >= trace.zmin - 1e-6
    small = heatmap(attention[:17, :17], "digits", colorscale="Viridis", symmetric=False)
    assert small.data[0].colorbar.title.text is None  # a 17-token map stays linear
    hidden = heatmap(rng.normal(size=(257, 384)), "hidden")  # signed values: never log
    assert hidden.data[0].colorbar.title.text is None


def test_probabilities_are_never_on_a_diverging_scale_and_one_row_has_no_y_axis():
    probabilities = torch.softmax(torch.randn(17, 17), dim=-1)
    fig = figures_fusion.side_by_side(probabilities, probabilities, "attention", "key token")
    assert all(t.zmin == 0.0 for t in fig.data) and "RdBu" not in str(fig.data[0].colorscale)
    assert fig.data[0].colorscale == go.Heatmap(colorscale="Viridis").colorscale
    signed = figures_fusion.side_by_side(torch.randn(17, 16), torch.randn(17, 16), "queries")
    assert signed.data[0].zmin == -signed.data[0].zmax
    logits = figures_fusion.side_by_side(torch.randn(10), torch.randn(10), "logits", "output index", "")
    assert logits.layout.yaxis.showticklabels is False
    assert heatmap(np.ones((1, 10)), "strip").layout.yaxis.showticklabels is False


def test_a_deep_models_layer_axis_is_ticked_sparsely():
    rows = [{"layer": layer, "kind": "hidden state", "abs": 1e-9, "rel": 1e-10} for layer in range(-1, 33)]
    fig = error_chart(rows, "smollm2", tolerance=1e-6)
    assert fig.layout.xaxis.dtick == 4 and fig.layout.xaxis2.dtick == 4  # 34 layers: every 4th
    assert layer_ticks(range(-1, 12))["dtick"] == 2 and layer_ticks(range(12))["dtick"] == 1
    assert {t.name for t in fig.data} == {"hidden state (relative)", "hidden state (absolute)"}


def test_legends_stay_off_the_x_labels():
    fig = tensor_error_chart(["a", "b"], [1e-7, 1e-7], [1e-8, 1e-8], "t", 1e-6)
    assert fig.layout.legend.x > 1  # beside the plot
    bars = figures.paired_bars(["a"], [1.0], [2.0], ("p", "q"), "pairs")
    assert bars.layout.legend.y >= 1 and bars.layout.legend.yanchor == "bottom"  # above the plot


def test_a_decimated_map_says_what_a_cell_is_in_words():
    fig = heatmap(np.ones((400, 300)), "big")
    assert "(mean of 3x2 per cell)" in fig.layout.title.text and "blocks" not in fig.layout.title.text


def test_projector_titles_take_one_or_two_lines_padded_to_two():
    """A chart in a third of the page (titles wrapped at 30 characters) and one across it (wrapped at 60)."""
    for title, wrap in (("original", 30), ("block 0 hidden state: scrambled, key 18446744073709551615", 30),
                        ("relative error of every tensor after un-scrambling (tokens and channels, key 7)", 60)):
        fig = for_projector(heatmap(np.ones((3, 3)), title, wrap=wrap))
        assert fig.layout.title.text.count("<br>") == PROJECTOR_TITLE_LINES - 1, title
        assert fig.layout.title.font.size >= MIN_PROJECTOR_TITLE_SIZE
        words = fig.layout.title.text.replace("<br>", " ").split()
        assert words == title.replace("<br>", " ").split()  # nothing cut


def test_projector_plots_side_by_side_start_at_one_height_when_one_title_is_set_smaller():
    """Explore's three MLP maps at 1024 px: the un-scrambled title, longer, is set in smaller letters to stay on two
    lines; its plot must still start where its neighbours' do (it sat 4 px higher)."""
    titles = [f"{label}:<br>MLP neurons of block 5<br>(mean of 2 columns per cell)"
              for label in ("Original", "Scrambled", "Un-scrambled")]
    figs = [for_projector(heatmap(np.ones((3, 3)), title)) for title in titles]
    sizes = [fig.layout.title.font.size for fig in figs]
    assert sizes[2] < sizes[0] == sizes[1]  # the case: one title smaller
    tops = {fig.layout.margin.t for fig in figs}
    plot_heights = {fig.layout.height - fig.layout.margin.t - fig.layout.margin.b for fig in figs}
    assert len(tops) == 1 and len(plot_heights) == 1, (tops, plot_heights)


def test_only_a_probability_map_goes_log():
    """An |error| map of 64x64 cells in [0, 1] (Backward's) is not a distribution per row: it stays linear."""
    errors = np.random.default_rng(1).random((64, 64)) * 1e-15
    assert heatmap(errors, "|error|", colorscale="Greys", symmetric=False).data[0].colorbar.title.text is None


def test_error_panels_label_whole_decades_only_and_every_value_is_in_range():
    """minilm's absolute errors all lie within one decade: plotly labelled 2, 3, ... 9 between decades, which ran into
    each other at 1024 px. Each panel now labels whole decades, at most its share, over a range that holds every
    point and threshold drawn on it."""
    narrow = [dict(layer=i, kind="hidden state", rel=2e-7 + 1e-8 * i, abs=9e-7 + 1e-7 * i) for i in range(-1, 6)]
    wide = [dict(layer=i, kind="attention map", rel=10.0 ** (-16 + 2 * i), abs=0.0) for i in range(7)]
    for rows in (narrow, wide):
        fig = error_chart(rows, "t", tolerance=1e-4)
        for axis, data, limit in (("yaxis", fig.data[0].y, 6), ("yaxis2", fig.data[1].y, 4)):
            settings = fig.layout[axis]
            low, high = settings.range
            assert settings.dtick >= 1 and float(settings.dtick).is_integer()
            decades = [d for d in range(math.ceil(low), math.floor(high) + 1) if d % settings.dtick == 0]
            assert 2 <= len(decades) <= limit, (axis, decades)
            assert all(low <= math.log10(y) <= high for y in data)
        assert fig.layout.yaxis.range[1] >= math.log10(1e-4)  # the tolerance line is in view
    assert error_chart(narrow, "t").layout.yaxis2.dtick == 1
