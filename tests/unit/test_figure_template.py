"""Every chart carries plotly_white's look whatever the process's default template is (Streamlit sets its own
when imported), cut down to the keys and trace types these charts use."""

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from ui.charts import figures
from ui.charts.figures_attention import attention_overlay, head_grid_figure
from ui.charts.figures_heatmap import heatmap
from ui.charts.figures_path import permutation_figure
from ui.charts.figures_proof import difference_map, error_chart, tensor_error_chart


def sample_figures():
    rng = np.random.default_rng(0)
    return [heatmap(rng.random((6, 7)), "a<br>b", "x", "y"),
            figures.bars(["a", "b"], [0.25, 0.75], "bars", "p"),
            permutation_figure(rng.permutation(9), "perm"),
            attention_overlay(rng.integers(0, 255, (16, 16, 3)), rng.random((2, 2)), 8, "overlay"),
            head_grid_figure(rng.random((2, 2, 3, 3)), [0, 1], "grid", holds=[[1, 0], [0, 1]]),
            difference_map(rng.random((4, 5)), rng.random((4, 5)), "diff"),
            error_chart([{"layer": 0, "kind": "hidden state", "abs": 1e-7, "rel": 1e-8}], "errors", 1e-6),
            figures.paired_bars(["a"], [1.0], [2.0], ("p", "q"), "pairs")]


@pytest.mark.parametrize("default", ["plotly", "ggplot2", "plotly_dark"])
def test_every_chart_is_plotly_white_whatever_the_default(default, monkeypatch):
    monkeypatch.setattr(pio.templates, "default", default)
    white = pio.templates["plotly_white"].to_plotly_json()
    for fig in sample_figures():
        template = fig.layout.template.to_plotly_json()
        assert template["layout"]["plot_bgcolor"] == white["layout"]["plot_bgcolor"] == "white"
        # plotly_white's layout, with one addition: every axis writes powers of ten (1e-9), not SI suffixes
        powers = {axis: {**white["layout"][axis], "exponentformat": "e"} for axis in ("xaxis", "yaxis")}
        assert {k: powers.get(k, white["layout"][k]) for k in template["layout"]} == template["layout"]
        used = {trace.type for trace in fig.data} - {"image"}
        assert used <= set(template["data"]), used
        for kind in used:
            assert template["data"][kind] == white["data"][kind]


def test_the_template_is_cut_down():
    white = pio.templates["plotly_white"].to_plotly_json()
    mine = figures.TEMPLATE.to_plotly_json()
    assert not {"polar", "scene", "geo", "ternary"} & set(mine["layout"])
    assert set(mine["data"]) == {"bar", "heatmap", "histogram", "scatter", "scattergl"} < set(white["data"])


def as_sent(fig) -> dict:
    """The chart as Streamlit sends it to the browser (it serializes without validating)."""
    return json.loads(pio.to_json(fig, validate=False))


def more_figures():
    rng = np.random.default_rng(1)
    tokens = ["<s>", "the", "cat"]
    return [heatmap(rng.random((3, 3)), "labelled", "channel", "token", y_labels=tokens, x_labels=tokens),
            heatmap(rng.random((1, 40)), "strip", "channel", "", height=170, y_ticks=False),
            heatmap(rng.random((400, 300)), "decimated", colorscale="Viridis", symmetric=False),
            head_grid_figure(rng.random((1, 3, 2, 2)), [5], "no head moved", holds=[[0, 1, 2]]),
            permutation_figure(rng.permutation(10_000), "long"),
            error_chart([{"layer": -1, "kind": "output logits", "abs": 0.0, "rel": 0.0},
                         {"layer": 0, "kind": "attention map", "abs": 1e-9, "rel": 2e-7, "tolerance": 1e-5}],
                        "raised<br>broken", tolerance=1e-6, broken_at=1e-2),
            tensor_error_chart(["a", "b", "c"], [1e-7, 0.0, 1e-3], [1e-8, 0.0, 1e-4], "tensors", 1e-6,
                               tolerances=[1e-6, 1e-5, 1e-6], max_bars=2)]


def test_validating_a_chart_changes_nothing_the_browser_gets():
    """Charts are built unvalidated for speed (figures.plain_figure): every property must already be as plotly's
    validation writes it. A shorthand it would expand (an axis title as a plain string, a colour scale's name,
    which plotly.js reads as other colours) or a misspelt property it would refuse makes this fail."""
    for fig in sample_figures() + more_figures():
        validated = go.Figure(fig.to_dict())
        assert as_sent(validated) == as_sent(fig), fig.layout.title.text


def test_the_unvalidated_check_can_fail():
    shorthand = go.Figure([dict(type="heatmap", z=[[1.0]], colorscale="RdBu")],
                          layout=dict(xaxis=dict(title="x")), _validate=False)
    assert as_sent(go.Figure(shorthand.to_dict())) != as_sent(shorthand)
    with pytest.raises(ValueError, match="colorscal"):
        go.Figure(go.Figure([dict(type="heatmap", z=[[1.0]], colorscal="RdBu")], _validate=False).to_dict())


def test_orjson_sends_every_chart_as_the_standard_library_would():
    """requirements.txt installs orjson, which plotly then serializes each chart with (faster under the server's
    GIL): the browser must get the same chart, NaN cells (blank in a heatmap) included."""
    import orjson  # noqa: F401 - a requirement: without it plotly falls back to the slower json module

    assert pio.json.config.default_engine in ("auto", "orjson")
    with_nan = heatmap(np.where(np.eye(4, dtype=bool), np.nan, 1.0), "nan on the diagonal")
    for fig in sample_figures() + more_figures() + [with_nan]:
        fast = json.loads(pio.to_json(fig, validate=False, engine="orjson"))
        assert fast == json.loads(pio.to_json(fig, validate=False, engine="json")), fig.layout.title.text
    assert pio.to_json(with_nan, validate=False) == pio.to_json(with_nan, validate=False, engine="orjson")
