"""Real Chromium: the Rotation page renders its proof, side-by-side heatmaps and the near misses."""

from tests.e2e.conftest import wait_for_app


def test_rotation_page_in_chromium(app_url, page, shot):
    page.goto(f"{app_url}/rotation")
    wait_for_app(page, timeout_ms=180_000)
    page.get_by_text("Rotated model is the same function").wait_for(timeout=60_000)
    charts = page.locator('[data-testid="stPlotlyChart"]')
    charts.nth(7).wait_for(timeout=60_000)  # charts mount after the text on a slow machine
    wait_for_app(page, timeout_ms=60_000)
    assert page.get_by_text("broken, as it must be").count() >= 1
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 8
    assert page.locator('[data-testid="stException"]').count() == 0
    path = shot(page, "rotation")
    assert path.stat().st_size > 20_000
