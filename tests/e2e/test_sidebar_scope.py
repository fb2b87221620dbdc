"""Real Chromium: the sidebar shows model, input and keys only where they act (Explore, Check); on pages with
their own controls it says so, and the choices come back on Explore."""

from playwright.sync_api import expect

from tests.e2e.conftest import patiently, wait_for_app


def sidebar(page):
    return page.locator('[data-testid="stSidebar"]')


def test_pages_with_their_own_controls_show_no_sidebar_model_and_explore_keeps_it(app_url, page, shot):
    page.goto(f"{app_url}/explore?model=random:gpt2&k_channels=77")
    wait_for_app(page, timeout_ms=180_000)
    expect(sidebar(page).get_by_label("channels key", exact=True)).to_have_value("77", timeout=120_000)
    for title in ("Backward", "Rotation"):
        sidebar(page).get_by_role("link", name=title).click(timeout=120_000)  # a busy server redraws the menu late
        patiently(lambda ms: sidebar(page).get_by_text("This page has its own controls").wait_for(timeout=ms), 120_000)
        wait_for_app(page, timeout_ms=180_000)
        # Streamlit keeps the last run's elements on screen until this run replaces them: wait for them to go
        expect(sidebar(page).get_by_text("Model", exact=True)).to_have_count(0, timeout=60_000)
        expect(sidebar(page).get_by_label("channels key", exact=True)).to_have_count(0, timeout=60_000)
        assert page.locator('[data-testid="stException"]').count() == 0
    shot(page, "rotation-own-controls")
    sidebar(page).get_by_role("link", name="Check").click()
    wait_for_app(page, timeout_ms=180_000)
    expect(sidebar(page).get_by_label("channels key", exact=True)).to_have_value("77", timeout=120_000)
    assert page.get_by_text("channels 77").count() >= 1  # the Check page names the key it will use
    assert page.get_by_text("random:gpt2 in float32").count() == 1
    shot(page, "check-sidebar")
