"""Chart export: PNG and SVG rendered by Kaleido are valid files of the figure; CSV holds the figure's numbers."""

import csv
import io
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from ui.charts import export, figures
from ui.charts.figures_heatmap import heatmap


def test_csv_of_a_heatmap_is_its_matrix_with_labels():
    matrix = np.arange(12, dtype=float).reshape(3, 4) - 5.5
    rows = list(csv.reader(io.StringIO(export.figure_csv(heatmap(matrix, "a title")))))
    assert rows[0][1:] == ["0", "1", "2", "3"]
    assert [r[0] for r in rows[1:]] == ["0", "1", "2"]
    assert np.array_equal(np.array([[float(v) for v in r[1:]] for r in rows[1:]]), matrix.astype(np.float32))


def test_csv_of_paired_bars_has_every_point_once():
    fig = figures.paired_bars(["a", "b"], [1.5, 2.5], [3e-16, 4.0], ("float64", "float32"), "t")
    rows = list(csv.reader(io.StringIO(export.figure_csv(fig))))
    assert rows == [["trace", "x", "y"], ["float64", "a", "1.5"], ["float64", "b", "2.5"], ["float32", "a", "3e-16"],
                    ["float32", "b", "4.0"]]


def test_file_names_differ_for_different_charts_and_are_readable():
    first = export.file_stem(figures.paired_bars(["a"], [1.0], [2.0], ("x", "y"), "Class probabilities<br>key 7"))
    second = export.file_stem(figures.paired_bars(["a"], [1.0], [3.0], ("x", "y"), "Class probabilities<br>key 7"))
    assert first.startswith("class-probabilities-key-7-") and first != second


def test_file_names_follow_every_cell_of_a_heatmap():
    matrix = np.random.default_rng(0).random((40, 30))
    nudged = matrix.copy()
    nudged[39, 29] += 1e-3  # one cell, after float32
    stems = [export.file_stem(heatmap(m, "hidden state")) for m in (matrix, matrix.copy(), nudged)]
    assert stems[0] == stems[1] != stems[2]


def test_png_and_svg_are_valid_images_of_the_chart():
    fig = figures.paired_bars(["a", "b"], [1.0, 2.0], [2.0, 1.0], ("original", "shuffled"), "export check")
    png = export.figure_image(fig, "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (2 * 700, 2 * fig.layout.height)  # Kaleido's default width, scale 2
    svg = export.figure_image(fig, "svg")
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and b"export check" in svg and b"shuffled" in svg


def test_unknown_format_and_missing_browser_are_clear_errors(monkeypatch):
    fig = figures.paired_bars(["a"], [1.0], [2.0], ("x", "y"), "t")
    with pytest.raises(ValueError, match="unknown image format"):
        export.figure_image(fig, "gif")

    def no_browser(*args, **kwargs):
        raise RuntimeError("could not find a Chrome executable")

    monkeypatch.setattr(type(fig), "to_image", no_browser)
    with pytest.raises(export.ExportError, match="could not render the chart as PNG .*the CSV still has"):
        export.figure_image(fig, "png")


def test_a_render_that_fails_once_is_tried_again(monkeypatch):
    """Kaleido's page once ran before its scripts had loaded ('kaleido_scopes is not defined'): a second try
    renders; a browser that never starts still fails every try, with the clear error."""
    fig = figures.paired_bars(["a"], [1.0], [2.0], ("x", "y"), "t")
    calls = []

    def flaky(self, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise RuntimeError("ReferenceError: kaleido_scopes is not defined")
        return b"\x89PNG rendered"

    monkeypatch.setattr(export.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(type(fig), "to_image", flaky)
    assert export.figure_image(fig, "png") == b"\x89PNG rendered" and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(type(fig), "to_image", lambda self, **kwargs: calls.append(1) or (_ for _ in ()).throw(
        RuntimeError("could not find a Chrome executable")))
    with pytest.raises(export.ExportError):
        export.figure_image(fig, "png")
    assert len(calls) == export.RENDER_ATTEMPTS
