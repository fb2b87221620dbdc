"""Real Chromium: the split-learning page trains, attacks and shows the table and the reconstructions."""

from tests.e2e.conftest import wait_for_app


def test_split_learning_page_in_chromium(app_url, page, shot):
    # Query parameters set small first values for the sliders, so the test runs in seconds.
    page.goto(f"{app_url}/split_learning?sl_epochs=2&sl_attack_epochs=3&sl_victims=40")
    wait_for_app(page, timeout_ms=240_000)
    page.get_by_text("What the measurements say").wait_for(timeout=120_000)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3",
                           timeout=60_000)
    page.wait_for_timeout(800)
    assert page.locator('[data-testid="stException"]').count() == 0
    table = page.locator('[data-testid="stTable"]')  # the results: every column in view, cells wrapped
    table.first.wait_for(timeout=60_000)
    assert table.count() == 1 and "channels recovered" in table.inner_text()
    labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
    assert any("Scrambled: held-out" in label for label in labels)
    assert page.get_by_text("Without protection the decoder's reconstructions reach SSIM").count() == 1
    page.set_viewport_size({"width": 1400, "height": 3800})  # Streamlit scrolls inside the app: show it all
    page.wait_for_timeout(1500)
    path = shot(page, "split_learning")
    assert path.stat().st_size > 20_000
