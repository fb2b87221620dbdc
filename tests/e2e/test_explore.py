"""Real Chromium: Explore renders its proof, a key change reruns it, and two
sessions with different keys at once both get correct verdicts."""

from tests.e2e.conftest import patiently, wait_for_app

VERDICT = "un-scrambled tensors match"


def wait_verdict(page, text: str = VERDICT, timeout_ms: int = 180_000):
    wait_for_app(page, timeout_ms=timeout_ms)
    page.get_by_text(text).first.wait_for(timeout=timeout_ms)
    wait_for_app(page, timeout_ms=timeout_ms)  # the verdict comes first; the charts follow in the same run
    charts(page)


def charts(page, at_least: int = 10, timeout_ms: int = 120_000) -> int:
    """Charts drawn by plotly (they render after the script run ends)."""
    page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot').length >= {at_least}",
                           timeout=timeout_ms)
    return page.locator('[data-testid="stPlotlyChart"]').count()


def set_key(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Enter")
    wait_for_app(page)


def test_explore_key_change_in_chromium(app_url, page, shot):
    page.set_viewport_size({"width": 1400, "height": 3600})  # Streamlit scrolls inside its own container
    page.goto(f"{app_url}/explore?model=digits-vit")  # the small, fast model; dinov2-s: test_explore_photo.py
    wait_verdict(page)
    assert charts(page) >= 10
    assert page.locator('[data-testid="stException"]').count() == 0
    shot(page, "explore-default")

    set_key(page, "channels key", "1234")
    wait_verdict(page)
    assert page.get_by_text("key 1234").count() >= 1  # the permutation picture follows the new key
    assert "k_channels=1234" in page.url
    assert charts(page) >= 10 and page.locator('[data-testid="stException"]').count() == 0

    set_key(page, "channels key", "-1")
    patiently(lambda ms: page.get_by_text("whole number").first.wait_for(timeout=ms), 60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    shot(page, "explore-bad-key")

    # The shared link reproduces the view in a fresh page.
    page.goto(f"{app_url}/explore?model=digits-vit&k_channels=77&control=channels/norms_not_permuted")
    wait_verdict(page, "breaks, as it must")
    assert page.locator('[data-testid="stException"]').count() == 0
    shot(page, "explore-control")


def test_two_sessions_with_different_keys(app_url, browser, tmp_path):
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    try:
        tabs = [c.new_page() for c in contexts]
        for tab, key in zip(tabs, (11, 22), strict=True):  # both load before either is waited for
            tab.goto(f"{app_url}/explore?model=digits-vit&k_channels={key}&k_tokens={key + 1}&dtype=float64")
        for tab, key in zip(tabs, (11, 22), strict=True):
            wait_verdict(tab, "in float64")
            assert tab.get_by_text(f"key {key}").count() >= 1 and charts(tab) >= 10
            assert tab.locator('[data-testid="stException"]').count() == 0
            tab.screenshot(path=str(tmp_path / f"session-{key}.png"), full_page=True)
    finally:
        for context in contexts:
            context.close()
