"""A just-started server that a classroom opens at once: three sessions' first runs start together, on Check, Explore
and the Symmetry matrix. Streamlit ran some of them as bare files of pages/ (its pages-directory mode lasts until a
run of app.py calls st.navigation) with no sidebar, and two sessions importing the library at once left one with a
half-imported transformers ("module 'transformers' has no attribute 'ViTConfig'"): 3 of 3 such servers showed an
error box before ui.view.through_app and ui.runtime.first_imports. Each page now comes up whole, and the server logs
no error. Its own server: the shared one is long past its first runs."""

from pathlib import Path

from serve.local_server import start_streamlit
from tests.e2e.conftest import wait_for_app

FIRST_VISITS = {"check": "Check: is this model exactly symmetric?", "explore?model=random:gpt2&k_channels=77":
                "Explore: scramble a Transformer", "matrix": "Symmetry matrix: which architecture"}


def test_a_classroom_opening_a_just_started_server_at_once_gets_whole_pages(browser, tmp_path):
    log = tmp_path / "server.log"
    server, url = start_streamlit(Path(log), {}, healthy_within_s=300)
    contexts = []
    try:
        tabs = {}
        for path in FIRST_VISITS:
            contexts.append(browser.new_context(viewport={"width": 1400, "height": 1000}))
            tabs[path] = contexts[-1].new_page()
        check, explore, matrix = FIRST_VISITS
        tabs[check].goto(f"{url}/{check}")  # Check and Explore at once, the matrix while their runs import
        tabs[explore].goto(f"{url}/{explore}")
        tabs[check].wait_for_timeout(8_000)
        tabs[matrix].goto(f"{url}/{matrix}")
        for path, title in FIRST_VISITS.items():
            tab = tabs[path]
            wait_for_app(tab, timeout_ms=300_000)
            tab.get_by_text(title).first.wait_for(timeout=120_000)
            assert tab.locator('[data-testid="stException"]').count() == 0, path
            assert tab.get_by_text("Something went wrong").count() == 0, path
            # app.py ran: its menu, with every page's title, is in the sidebar
            assert tab.locator('[data-testid="stSidebarNav"]').get_by_text("Guided walk").count() == 1, path
        assert tabs["matrix"].locator("table.symmetry-matrix").count() == 1
    finally:
        for context in contexts:
            context.close()
        server.terminate()
        server.wait(timeout=60)
    assert "Traceback" not in log.read_text()
