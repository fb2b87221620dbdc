"""Every chart carries plotly_white's look whatever the process's default template is (Streamlit sets its own
when imported), cut down to the keys and trace types these charts use."""

import numpy as np
import plotly.io as pio
import pytest

from perm_core import figures


def sample_figures():
    rng = np.random.default_rng(0)
    return [figures.heatmap(rng.random((6, 7)), "a<br>b", "x", "y"),
            figures.bars(["a", "b"], [0.25, 0.75], "bars", "p"),
            figures.permutation_figure(rng.permutation(9), "perm"),
            figures.attention_overlay(rng.integers(0, 255, (16, 16, 3)), rng.random((2, 2)), 8, "overlay"),
            figures.head_grid_figure(rng.random((2, 2, 3, 3)), [0, 1], "grid", holds=[[1, 0], [0, 1]]),
            figures.difference_map(rng.random((4, 5)), rng.random((4, 5)), "diff"),
            figures.error_chart([{"layer": 0, "kind": "hidden state", "abs": 1e-7, "rel": 1e-8}], "errors", 1e-6),
            figures.paired_bars(["a"], [1.0], [2.0], ("p", "q"), "pairs")]


@pytest.mark.parametrize("default", ["plotly", "ggplot2", "plotly_dark"])
def test_every_chart_is_plotly_white_whatever_the_default(default, monkeypatch):
    monkeypatch.setattr(pio.templates, "default", default)
    white = pio.templates["plotly_white"].to_plotly_json()
    for fig in sample_figures():
        template = fig.layout.template.to_plotly_json()
        assert template["layout"]["plot_bgcolor"] == white["layout"]["plot_bgcolor"] == "white"
        assert {k: white["layout"][k] for k in template["layout"]} == template["layout"]
        used = {trace.type for trace in fig.data} - {"image"}
        assert used <= set(template["data"]), used
        for kind in used:
            assert template["data"][kind] == white["data"][kind]


def test_the_template_is_cut_down():
    white = pio.templates["plotly_white"].to_plotly_json()
    mine = figures.TEMPLATE.to_plotly_json()
    assert not {"polar", "scene", "geo", "ternary"} & set(mine["layout"])
    assert set(mine["data"]) == {"bar", "heatmap", "histogram", "scatter", "scattergl"} < set(white["data"])
