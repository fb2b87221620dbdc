"""Real Chromium: the Check page runs the report on digits-vit and offers the JSON."""

import re

from tests.e2e.conftest import patiently, wait_for_app


def run_check_when_ready(page) -> None:
    """The button appears once the sidebar's model is loaded: on a busy machine the script run can start after
    wait_for_app's first look, and loading smollm2 in float64 then takes longer than a click's own 30 s."""
    wait_for_app(page, timeout_ms=180_000)
    button = page.get_by_role("button", name="Run check")
    patiently(lambda ms: button.wait_for(timeout=ms), 180_000)
    button.click()


def test_check_page_in_chromium(app_url, page, shot):
    page.goto(f"{app_url}/check?model=digits-vit")  # the sidebar opens on dinov2-s; the report here is digits-vit's
    run_check_when_ready(page)
    patiently(lambda ms: page.get_by_text("PASSED").first.wait_for(timeout=ms), 180_000)
    wait_for_app(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    # plotly draws after the run ends
    patiently(lambda ms: page.wait_for_selector(".js-plotly-plot", timeout=ms), 60_000)
    assert page.get_by_role("button", name="Download the report (JSON)").count() == 1
    shot(page, "check")


def test_a_long_check_shows_the_time_left_and_stops(app_url, page, shot):
    """smollm2-135m in float64 runs for minutes: the bar names the run and the time left, and Stop ends it."""
    page.goto(f"{app_url}/check?model=smollm2-135m&dtype=float64&on_heads=1&on_mlp=1&on_rotation=1")
    run_check_when_ready(page)
    stop = page.get_by_role("button", name="Stop the check")
    patiently(lambda ms: stop.wait_for(timeout=ms), 180_000)
    page.get_by_text(re.compile(r"so far, about .+ left")).first.wait_for(timeout=120_000)
    shot(page, "check-running")
    stop.click()
    page.get_by_text("Stopped: the check").wait_for(timeout=120_000)
    wait_for_app(page)
    assert page.get_by_role("button", name="Run the check again").count() == 1
    assert page.get_by_text("PASSED").count() == 0 and page.locator('[data-testid="stException"]').count() == 0
    shot(page, "check-stopped")
