"""Real headless Chromium against the real app on a loopback port the kernel gives it.

Fixtures: `app_url` (one streamlit server for the whole run), `browser` (session), `page` (a fresh page
per test), `wait_for_app(page)` (blocks until the script run finished), `shot(page, name)`.
"""

from __future__ import annotations

import contextlib
import os
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




def wait_for_app(page, timeout_ms: int = 120_000) -> None:
    """Wait until Streamlit's script run is over and its charts are drawn. Right after a click or a key the page
    still shows the previous run's "notRunning" until the server answers, so a run is first given
    RUN_BEGINS_WITHIN_MS to begin (after a page load it has: the state starts at "initial")."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(f"() => {SCRIPT_STATE} !== 'notRunning'", timeout=RUN_BEGINS_WITHIN_MS)
    page.wait_for_function(RUN_OVER, timeout=timeout_ms)
    page.wait_for_function(DRAWN, timeout=timeout_ms)


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
