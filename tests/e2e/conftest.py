"""Real headless Chromium against the real app on a loopback port the kernel gives it.

Fixtures: `app_url` (one streamlit server for the whole run), `browser` (session), `page` (a fresh page
per test), `wait_for_app(page)` (blocks until the script run finished), `shot(page, name)`. Explore's block views
(one at a time, chosen in its "Show" segmented control): `with_block_view(path, view)`, `show_block_view(page,
view)`, `block_views_shown(page)`, `chart_titles(page)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from serve.local_server import (
    CHROMIUM_FLAGS,
    DRAWN,
    RUN_BEGINS_WITHIN_MS,
    RUN_OVER,
    SCRIPT_STATE,
    chromium_executable,
)
from tests.e2e.shared_server import shared_app_url
from tests.explore_views import BLOCK_VIEWS, DENSE_VIEWS, VIEW_CHARTS, block_view_of  # noqa: F401 - the e2e tests' own

ROOT = Path(__file__).resolve().parents[2]
ACTION_TIMEOUT_MS = 120_000  # each page's default for clicks and waits (see `page`)


@pytest.fixture(scope="session")
def app_url():
    """The run's one app server (tests/e2e/shared_server.py), shared by every worker's e2e tests."""
    try:
        return shared_app_url(Path(os.environ["TSE_TEST_SHARED_DIR"]))
    except RuntimeError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api")
    executable = chromium_executable()
    if executable is None:
        pytest.fail("Debian's chromium is not installed (make test installs it)")
    with playwright_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


FAILED_SCREENSHOTS = ROOT / "out" / "failed"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report kept on the test item, so the page fixture knows at teardown whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    # Every test's browsers share one app server: on a loaded machine (CI beside another run) a click's element can
    # take longer than Playwright's 30 s to appear. A wait that ends on its condition costs nothing when it is met.
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    tab = context.new_page()
    yield tab
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:  # what the page showed when the test gave up: out/failed/<test>.png
        FAILED_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)[:120]
        try:
            tab.screenshot(path=str(FAILED_SCREENSHOTS / f"{name}.png"), full_page=True, timeout=30_000)
        except Exception as error:  # noqa: BLE001 - a page that cannot be drawn any more: the failure stands alone
            print(f"no screenshot of the failed page: {error}")
    context.close()




# A wait's budget is counted in a quiet machine's time: each slice of it counts in full on a quiet machine and
# divided by the runnable processes per core on a loaded one. Two make tests side by side held the load average at
# 24 on 2 cores, and pages that load in 10-30 s quiet ran past 180-240 s wall budgets. A hang still ends: a wait
# gives up after HANG_FACTOR budgets of wall time, however loaded the machine.
WAIT_SLICE_MS = 5_000
HANG_FACTOR = 8


def machine_load() -> float:
    """Runnable processes per core this process may use, over the last minute; at least 1 (a quiet machine)."""
    return max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))


def patiently(wait, timeout_ms: float, load=machine_load, clock=time.monotonic):
    """wait(slice_ms) (a Playwright wait) again until it returns, its value; PlaywrightTimeout once the slices
    waited, each divided by the machine's load when it ended, add up to timeout_ms, or after HANG_FACTOR x
    timeout_ms of wall time."""
    counted, started = 0.0, clock()
    while True:
        try:
            return wait(WAIT_SLICE_MS)
        except PlaywrightTimeout:
            counted += WAIT_SLICE_MS / load()
            if counted >= timeout_ms or (clock() - started) * 1000 >= HANG_FACTOR * timeout_ms:
                raise


def wait_for_app(page, timeout_ms: int = 120_000) -> None:
    """Wait until Streamlit's script run is over and its charts are drawn, each wait `patiently`. Right after a
    click or a key the page still shows the previous run's "notRunning" until the server answers, so a run is first
    given RUN_BEGINS_WITHIN_MS (times the machine's load) to begin (after a page load it has: the state starts at
    "initial")."""
    patiently(lambda ms: page.wait_for_selector('[data-testid="stApp"]', timeout=ms), timeout_ms)
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(f"() => {SCRIPT_STATE} !== 'notRunning'",
                               timeout=RUN_BEGINS_WITHIN_MS * machine_load())
    patiently(lambda ms: page.wait_for_function(RUN_OVER, timeout=ms), timeout_ms)
    patiently(lambda ms: page.wait_for_function(DRAWN, timeout=ms), timeout_ms)


# A chart's title as plotly holds it in its layout: its line breaks as spaces, without its bold tags.
CHART_TITLE = """const title = gd => {
  const t = gd && gd.layout && gd.layout.title;
  return String((t && (t.text !== undefined ? t.text : t)) || '').replace(/<br>/g, ' ').replace(/<[^>]*>/g, '');
};"""
CHART_TITLES = "() => {" + CHART_TITLE + """
  return Array.from(document.querySelectorAll('[data-testid="stMain"] [data-testid="stPlotlyChart"]'))
    .map(chart => title(chart.querySelector('.js-plotly-plot')));
}"""


def chart_titles(page) -> list[str]:
    """The title of every chart in the page's main area, top to bottom."""
    return page.evaluate(CHART_TITLES)


def block_views_shown(page) -> set[str]:
    """The block views whose charts are on the page."""
    return {view for view in map(block_view_of, chart_titles(page)) if view is not None}


def with_block_view(path: str, view: str) -> str:
    """An Explore link that opens on one block view."""
    return f"{path}{'&' if '?' in path else '?'}block_view={view}"


def block_view_control(page):
    """Explore's "Show" segmented control: a radio group whose buttons are its radios."""
    return page.get_by_role("radiogroup", name="Show", exact=True)


def block_view_button(page, view: str):
    return block_view_control(page).get_by_role("radio", name=BLOCK_VIEWS[view], exact=True)


def block_view_labels(page) -> list[str]:
    """The labels of the "Show" control's buttons, in order: the block views this model has."""
    return [label.strip() for label in block_view_control(page).get_by_role("radio").all_inner_texts()]


def show_block_view(page, view: str, timeout_ms: int = 120_000) -> None:
    """Click the block view's button in Explore's "Show" control and wait until that view's charts are drawn and no
    other view's are left (the click reruns the block's panel alone)."""
    button = block_view_button(page, view)
    button.click()
    wait_for_app(page, timeout_ms=timeout_ms)
    chosen = block_view_control(page).get_by_role("radio", name=BLOCK_VIEWS[view], exact=True, checked=True)
    patiently(lambda ms: chosen.wait_for(timeout=ms), timeout_ms)
    leads = {v: list(leads) for v, leads in VIEW_CHARTS.items()}
    only = "() => {" + CHART_TITLE + f"""
      const leads = {json.dumps(leads)};
      const shown = new Set();
      for (const gd of document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')) {{
        const whats = [title(gd), title(gd).split(': ').slice(1).join(': ')];
        for (const [view, starts] of Object.entries(leads)) {{
          if (starts.some(s => whats.some(w => w.startsWith(s)))) shown.add(view);
        }}
      }}
      return shown.size === 1 && shown.has({json.dumps(view)});
    }}"""
    patiently(lambda ms: page.wait_for_function(only, timeout=ms), timeout_ms)
    patiently(lambda ms: page.wait_for_function(DRAWN, timeout=ms), timeout_ms)


@pytest.fixture
def shot(tmp_path):
    def take(tab, name: str) -> Path:
        path = tmp_path / f"{name}.png"
        tab.screenshot(path=str(path), full_page=True)
        return path

    return take


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
