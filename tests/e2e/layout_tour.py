"""A lecturer's tour in real Chromium: Explore (in each view of its block the model has: hidden states, attention,
MLP neurons or experts chosen, weights, each clicked in its "Show" control) and Check with every model on the
sidebar's menu, and every other page, each at 1024x768 in projector mode, at 1024 px and at 1440 px, with the layout
test's checks (clipped text, texts or charts over each other, colliding tick labels, a legend over axis labels, words
cut across lines, a title under the header, blank charts) run on each, and a full-page screenshot of each for a
person to look at.

    TRANSFORMER_SYMMETRY_CACHE=/tmp/tse-cache HF_HUB_OFFLINE=1 .venv/bin/python tests/e2e/layout_tour.py \
        --out /tmp/tour [--models digits-vit,minilm] [--pages explore,check,home]

The models are converted on their first visit (minutes for the larger ones) and kept in the cache. Prints one line
per page, model and width with what the checks found (on Explore, each led by the block view it was found in);
writes out/summary.json. Exit status 1 if any check found something. Not a test: a tour of every model takes tens
of minutes on a 2-core machine (tests/e2e/test_layout_widths.py runs the same checks on one model per page, in each
of Explore's block views).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from perm_core.models.zoo import EXPLORE, serving  # noqa: E402
from serve.local_server import CHROMIUM_FLAGS, DRAWN, chromium_executable, start_streamlit  # noqa: E402
from tests.e2e.conftest import BLOCK_VIEWS, block_view_labels, show_block_view, wait_for_app  # noqa: E402
from tests.e2e.test_layout_widths import PAGES, layout_problems, settle  # noqa: E402

MODEL_PAGES = {"explore": "explore?model={model}", "check": "check?model={model}"}
VIEWS = (("projector", 1024, 768), ("1024", 1024, 2400), ("1440", 1440, 2400))
# Streamlit scrolls inside its own containers
TO_THE_TOP = """() => {
  const scrolled = '[data-testid="stMain"], [data-testid="stAppViewContainer"], '
    + '[data-testid="stAppScrollToBottomContainer"]';
  for (const el of document.querySelectorAll(scrolled)) el.scrollTo(0, 0);
  window.scrollTo(0, 0);
}"""


def visits(models: list[str], pages: list[str]) -> list[tuple[str, str, str]]:
    """(page name, model or '-', path) of the tour."""
    tour = [(name, model, MODEL_PAGES[name].format(model=model)) for name in MODEL_PAGES if name in pages
            for model in models]
    return tour + [(name, "-", path) for name, path in PAGES.items() if name in pages and name not in MODEL_PAGES
                   and not name.startswith("explore")]  # Explore's pages there: one model's, here every model's


def look(page, url: str, name: str, path: str, view: tuple[str, int, int], out: Path, model: str) -> list[str]:
    """The checks' findings on one page at one size; on Explore, in each view of the block (clicked in its "Show"
    control, the hidden states first), each finding led by the view's name."""
    label, width, height = view
    page.set_viewport_size({"width": width, "height": height})
    link = path + (("&" if "?" in path else "?") + "projector=1" if label == "projector" else "")
    page.goto(f"{url}/{link}")
    wait_for_app(page, timeout_ms=900_000)
    if name == "check":
        page.get_by_role("button", name="Run check").click()
        page.get_by_text("PASSED").or_(page.get_by_text("FAILED")).first.wait_for(timeout=900_000)
    names = {shown: value for value, shown in BLOCK_VIEWS.items()}
    block_views = [names[shown] for shown in block_view_labels(page)] if name == "explore" else [None]
    found = []
    for block_view in block_views:
        if block_view not in (None, block_views[0]):
            show_block_view(page, block_view, timeout_ms=900_000)
            # the click scrolled the control into view: back to the top, where a page is checked after its load
            page.evaluate(TO_THE_TOP)
        settle(page, timeout_ms=900_000)
        page.wait_for_timeout(500)
        page.wait_for_function(DRAWN, timeout=300_000)
        shot = out / f"{name}-{model.replace(':', '_')}{'' if block_view is None else '-' + block_view}-{label}.png"
        page.screenshot(path=str(shot), full_page=label != "projector")
        here = layout_problems(page)
        if page.locator('[data-testid="stException"]').count():
            here.append("an exception box")
        found += [problem if block_view is None else f"{BLOCK_VIEWS[block_view]}: {problem}" for problem in here]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "tour")
    parser.add_argument("--models", default=",".join(serving(EXPLORE)))
    parser.add_argument("--pages", default=",".join([*MODEL_PAGES, *PAGES]))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server, url = start_streamlit(args.out / "server.log", {}, healthy_within_s=300)
    summary = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_FLAGS)
            for name, model, path in visits(args.models.split(","), args.pages.split(",")):
                page = browser.new_page()
                for view in VIEWS:
                    started = time.time()
                    try:
                        found = look(page, url, name, path, view, args.out, model)
                    except Exception as error:  # noqa: BLE001 - one page that fails to load is a finding, not the end
                        found = [f"did not load: {type(error).__name__}: {str(error)[:200]}"]
                    summary.append(dict(page=name, model=model, view=view[0], found=found,
                                        seconds=round(time.time() - started, 1)))
                    print(f"{name:16s} {model:14s} {view[0]:9s} {len(found)} found {found[:3]}", flush=True)
                page.close()
            browser.close()
    finally:
        server.terminate()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    sys.exit(1 if any(s["found"] for s in summary) else 0)


if __name__ == "__main__":
    main()
