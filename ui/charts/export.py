"""Charts as files: PNG and SVG through Kaleido (it drives the Chromium already installed for the tests), and
the numbers behind a chart as CSV, one row per point (heatmaps: one row per matrix row)."""

from __future__ import annotations

import csv
import hashlib
import io
import re
import time

import numpy as np
import plotly.graph_objects as go

IMAGE_FORMATS = ("png", "svg")


class ExportError(RuntimeError):
    """A chart that cannot be rendered to a file here (no Chromium for Kaleido): one line for the page."""


def figure_title(fig: go.Figure) -> str:
    text = fig.layout.title.text or "chart"
    return re.sub(r"<[^>]+>", " ", text).strip()


def _digest(value, sha) -> None:
    if isinstance(value, np.ndarray):
        sha.update(f"{value.dtype}{value.shape}".encode())
        sha.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for key in sorted(value):
            sha.update(key.encode())
            _digest(value[key], sha)
    elif isinstance(value, list | tuple):
        sha.update(b"[")
        for item in value:
            _digest(item, sha)
        sha.update(b"]")
    else:
        sha.update(repr(value).encode())


def file_stem(fig: go.Figure) -> str:
    """A readable, unique file name: the title as a slug plus a digest of what the chart shows (its title and
    traces; arrays are read in place, where a JSON dump would encode every chart a second time per rerun)."""
    title = figure_title(fig)
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "chart"
    sha = hashlib.sha1(title.encode())
    for trace in fig.data:
        _digest(trace.to_plotly_json(), sha)
    return f"{slug}-{sha.hexdigest()[:8]}"


# Kaleido's headless page once ran a render before its own scripts had loaded ('kaleido_scopes is not defined', a
# fresh clone's test run on two busy cores); a second try renders. A browser that cannot start fails every try.
RENDER_ATTEMPTS = 3


def figure_image(fig: go.Figure, fmt: str, scale: float = 2.0) -> bytes:
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; choose from {', '.join(IMAGE_FORMATS)}")
    for attempt in range(RENDER_ATTEMPTS):
        try:
            return fig.to_image(format=fmt, scale=scale if fmt == "png" else 1.0)
        except Exception as error:  # noqa: BLE001 - kaleido raises several kinds when no browser can start
            if attempt + 1 < RENDER_ATTEMPTS:  # a fresh Kaleido page can run before its scripts have loaded
                time.sleep(0.5)
                continue
            raise ExportError(f"could not render the chart as {fmt.upper()} ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else 'no detail'}); the CSV still has "
                              "its numbers") from error
    raise AssertionError("unreachable")


def figure_csv(fig: go.Figure) -> str:
    """Point traces (bars, lines) in one long table: trace, x, y; each heatmap as its own labelled matrix."""
    out = io.StringIO()
    writer = csv.writer(out)
    header_written = False
    for i, trace in enumerate(fig.data):
        name = trace.name or f"trace {i}"
        z = getattr(trace, "z", None)
        if z is not None:
            matrix = np.asarray(z, dtype=float)
            columns = list(trace.x) if trace.x is not None else list(range(matrix.shape[1]))
            rows = list(trace.y) if trace.y is not None else list(range(matrix.shape[0]))
            writer.writerow([f"{name}: row \\ column", *columns])
            for label, values in zip(rows, matrix, strict=False):
                writer.writerow([label, *("" if np.isnan(v) else repr(float(v)) for v in values)])
            continue
        if not header_written:
            writer.writerow(["trace", "x", "y"])
            header_written = True
        xs = list(trace.x) if getattr(trace, "x", None) is not None else []
        ys = list(trace.y) if getattr(trace, "y", None) is not None else []
        for x, y in zip(xs, ys, strict=False):
            writer.writerow([name, x, y])
    return out.getvalue()
