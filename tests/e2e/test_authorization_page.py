"""Real Chromium: the Model authorization page shows the key's worth and the wrong-key histogram."""

from tests.e2e.conftest import wait_for_app


def test_authorization_page_in_chromium(app_url, page, shot):
    page.goto(f"{app_url}/authorization?au_attack_steps=100")  # the attacker's fine-tuning sweep, short
    wait_for_app(page, timeout_ms=240_000)
    page.get_by_text("The right key restores the model exactly").wait_for(timeout=120_000)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1",
                           timeout=60_000)
    page.wait_for_timeout(800)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.get_by_text("The key is broken").wait_for(timeout=120_000)
    values = {}
    for i in range(page.locator('[data-testid="stMetric"]').count()):
        metric = page.locator('[data-testid="stMetric"]').nth(i)
        values[metric.locator('[data-testid="stMetricLabel"]').inner_text().strip()] = metric.locator(
            '[data-testid="stMetricValue"]').inner_text().strip()
    percent = {label: float(value.rstrip("%")) / 100 for label, value in values.items() if value.endswith("%")}
    assert percent["Right key"] > 0.95 and percent["No key"] < 0.3 and percent["Chance"] == 0.1
    assert values["Key recovered"] == "exactly" and values["Attacker's unlocked model"] == values["Right key"]
    assert page.get_by_text("Keys have up to 256 bits").count() == 1
    assert page.get_by_text("64! orderings of the residual channels, 296 bits").count() == 1
    path = shot(page, "authorization")
    assert path.stat().st_size > 20_000
