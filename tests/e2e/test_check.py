"""Real Chromium: the Check page runs the report on digits-vit and offers the JSON."""

from tests.e2e.conftest import wait_for_app


def test_check_page_in_chromium(app_url, page, shot):
    page.goto(f"{app_url}/check?model=digits-vit")  # the sidebar opens on dinov2-s; the report here is digits-vit's
    wait_for_app(page, timeout_ms=180_000)
    page.get_by_role("button", name="Run check").click()
    page.get_by_text("PASSED").first.wait_for(timeout=180_000)
    wait_for_app(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)  # plotly draws after the run ends
    assert page.get_by_role("button", name="Download the report (JSON)").count() == 1
    shot(page, "check")
