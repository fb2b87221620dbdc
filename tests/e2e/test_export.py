"""Real Chromium: a chart's Export menu downloads a valid PNG, a valid SVG and its numbers as CSV."""

import csv
import io
import xml.etree.ElementTree as ET

from tests.e2e.conftest import wait_for_app


def test_the_walks_chart_downloads_as_png_svg_and_csv(app_url, page):
    page.set_viewport_size({"width": 1440, "height": 2400})
    page.goto(f"{app_url}/walk?walk_step=1&walk_key=7")
    wait_for_app(page, timeout_ms=180_000)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1",
                           timeout=60_000)
    files = {}
    for label in ("PNG image", "SVG image", "Data (CSV)"):
        page.get_by_role("button", name="Export").first.click()
        with page.expect_download(timeout=120_000) as download:  # PNG and SVG render on click (Kaleido)
            page.get_by_role("button", name=label).click()
        files[label] = (download.value.suggested_filename, open(download.value.path(), "rb").read())
        page.keyboard.press("Escape")
    name, png = files["PNG image"]
    assert name.startswith("class-probabilities-") and name.endswith(".png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000
    name, svg = files["SVG image"]
    assert name.endswith(".svg") and ET.fromstring(svg).tag.endswith("svg") and b"shuffled" in svg
    name, data = files["Data (CSV)"]
    rows = list(csv.reader(io.StringIO(data.decode())))
    assert rows[0] == ["trace", "x", "y"] and len(rows) == 1 + 2 * 10  # ten digits, original and shuffled
    original = {r[1]: float(r[2]) for r in rows[1:] if r[0] == "original"}
    shuffled = {r[1]: float(r[2]) for r in rows[1:] if r[0] == "shuffled"}
    assert abs(sum(original.values()) - 1) < 1e-6 and max(abs(original[d] - shuffled[d]) for d in original) < 1e-6
