"""Real Chromium: Explore on random text models (no tokenizer: id chips), an encoder, a decoder with grouped
key/value heads and a mixture of experts, and on the real Gemma 3 270M (its own tokenizer), each with a verdict, its
charts drawn in every one of the block's views and no exception; one screenshot per model and view. random:gpt2 is
drawn in Chromium by the layout test (explore_text, two widths, each view) and the Gemma 3 family by gemma3-270m
here; every family's Explore runs in tests/app/test_explore_every_family.py."""

import pytest

from tests.e2e.conftest import BLOCK_VIEWS, block_view_labels, block_views_shown, show_block_view
from tests.e2e.test_explore import charts, wait_verdict

EXCEPTION = '[data-testid="stException"]'


def chip_labels(page) -> list[str]:
    return page.locator("span[title^='original position']").all_inner_texts()


@pytest.mark.parametrize("model", [
    "random:bert", "random:llama", "random:mixtral",
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
    # Every view of the block, each alone: a mixture of experts shows the experts chosen where a dense MLP's
    # neurons would be
    views = [view for label in block_view_labels(page) for view, name in BLOCK_VIEWS.items() if name == label]
    dense = ["hidden", "attention", "mlp", "weights"]
    assert views == (["hidden", "attention", "experts", "weights"] if model == "random:mixtral" else dense), views
    for view in views:
        if view != "hidden":  # the page opens on the hidden states
            show_block_view(page, view, timeout_ms=400_000)
        assert block_views_shown(page) == {view}
        assert page.locator(EXCEPTION).count() == 0 and page.locator('[data-testid="stAlertContentError"]').count() == 0
        shot(page, f"explore-{model.replace(':', '-')}-{view}")
