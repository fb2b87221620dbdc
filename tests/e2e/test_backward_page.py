"""Real Chromium: the Backward page shows gradient heatmaps, the error chart and the SGD lock-step."""

from tests.e2e.conftest import wait_for_app


def test_backward_page_in_chromium(app_url, page, shot):
    page.goto(f"{app_url}/backward")
    wait_for_app(page, timeout_ms=240_000)
    page.get_by_text("gradients (the input's and every parameter's) un-scramble to the original").wait_for(
        timeout=120_000)
    page.get_by_text("the scrambled world's update equals the scrambled original update").wait_for(timeout=120_000)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 11",
                           timeout=60_000)
    page.wait_for_timeout(800)
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 11
    assert page.locator('[data-testid="stException"]').count() == 0
    error_text = page.locator('[data-testid="stMetric"]').filter(has_text="Max relative gradient error")
    assert float(error_text.locator('[data-testid="stMetricValue"]').inner_text()) < 1e-9
    path = shot(page, "backward")
    assert path.stat().st_size > 20_000
    page.get_by_text("Training in both worlds").scroll_into_view_if_needed()
    page.wait_for_timeout(800)
    assert shot(page, "backward_sgd").stat().st_size > 20_000
