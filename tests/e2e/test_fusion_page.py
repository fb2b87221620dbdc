"""Real Chromium: the Fusion page shows the four methods, the three alignments' proofs (plain averaging aligns
nothing) and the barrier curves; then the experiment over seed pairs (tiny here: 32 wide, one epoch) with its
sentence and four charts."""

from tests.e2e.conftest import wait_for_app


def test_fusion_page_in_chromium(app_url, page, shot):
    page.goto(f"{app_url}/fusion?fx_width=32&fx_epochs=1&fx_run=1")
    wait_for_app(page, timeout_ms=300_000)
    page.get_by_text("Over 5 seed pairs, adding per-head rotations").wait_for(timeout=240_000)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 8",
                           timeout=60_000)
    page.locator('[data-testid="stPlotlyChart"]').first.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    path = shot(page, "fusion")
    alerts = page.locator('[data-testid="stAlert"]')
    texts = [alerts.nth(i).inner_text() for i in range(alerts.count())]
    assert sum("broken, as it must be" in text for text in texts) == 3  # the three alignments' proofs
    assert sum("nothing to prove" in text or "no aligned B to prove" in text for text in texts) == 1  # averaging
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 8  # the pair's four, the experiment's four
    assert page.locator('[data-testid="stException"]').count() == 0
    assert path.stat().st_size > 20_000
