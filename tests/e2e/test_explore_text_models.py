"""Real Chromium: Explore on every random text model (no tokenizer: id chips) and on the real Gemma 3 270M
(its own tokenizer), each with a verdict, its charts drawn and no exception; one screenshot per model."""

import pytest

from tests.e2e.test_explore import charts, wait_verdict

EXCEPTION = '[data-testid="stException"]'


def chip_labels(page) -> list[str]:
    return page.locator("span[title^='original position']").all_inner_texts()


@pytest.mark.parametrize("model", [
    "random:bert", "random:gpt2", "random:llama", "random:gemma3",
    pytest.param("gemma3-270m", marks=pytest.mark.slow),
])
def test_explore_text_model_in_chromium(app_url, page, shot, model):
    page.set_viewport_size({"width": 1440, "height": 4000})
    page.goto(f"{app_url}/explore?model={model}&on_heads=1&on_mlp=1")
    wait_verdict(page, timeout_ms=400_000)  # gemma3-270m: the first load converts its GGUF wheels
    assert charts(page, at_least=10) >= 10
    assert page.locator(EXCEPTION).count() == 0 and page.locator('[data-testid="stAlertContentError"]').count() == 0
    labels = chip_labels(page)
    assert len(labels) >= 3 * 5, labels  # original, scrambled and un-scrambled rows
    tokenless = model.startswith("random:")
    assert all(label.startswith("#") for label in labels) == tokenless
    shot(page, f"explore-{model.replace(':', '-')}")
