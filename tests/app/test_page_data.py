"""A finished page run keeps no heavy data alive. Streamlit keeps a session's widgets until its next run, and with
them the functions a page hands them (format functions, callbacks) and so the page's globals: thirty sessions once
kept thirty Explore results past the results cache's bound that way. Every page keeps its run's data in the frame
of its main(), so only constants and functions are globals."""

import ast
import gc
import re
import weakref
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from perm_core.explore.exploration import ExploreResult
from tests.app.conftest import APP
from ui.runtime import runs, settings

PAGES = sorted((Path(__file__).resolve().parents[2] / "pages").glob("*.py"))


def _constant_names(target: ast.expr) -> bool:
    """An UPPER_CASE name, or a tuple of them ((MODEL,) = the one model a page serves)."""
    if isinstance(target, ast.Tuple):
        return bool(target.elts) and all(_constant_names(t) for t in target.elts)
    return isinstance(target, ast.Name) and target.id.isupper()


def module_level_data(source: str) -> list[str]:
    """The statements of a page at module level other than imports, functions, UPPER_CASE constants, the first call
    of through_app() (it binds nothing) and the final call of main() (in `with page_runs() as shared_runs:` for a
    page with shared runs): each binds a global that outlives the run."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):  # the docstring
            continue
        if ast.unparse(node) in ("main()", "through_app()") or re.fullmatch(
                r"with page_runs\(\) as (\w+):\n    main\(\1\)", ast.unparse(node)):
            continue
        if isinstance(node, ast.Assign) and all(_constant_names(t) for t in node.targets):
            continue
        found.append(ast.unparse(node).splitlines()[0])
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_page_keeps_its_run_in_main(page):
    assert module_level_data(page.read_text()) == []


def test_the_rule_finds_a_global_result():
    source = ("import streamlit as st\nLIMIT = 3\n(MODEL,) = serving()\nresult = run()\n(kept, LIMITS) = run()\n"
              "def main():\n    x = 1\nmain()\n")
    assert module_level_data(source) == ["result = run()", "kept, LIMITS = run()"]


def _live_results() -> dict:
    """Every ExploreResult alive now, by id and weakly: a result an earlier test left may be freed meanwhile, and
    must not count as this test's."""
    gc.collect()
    return {id(o): weakref.ref(o) for o in gc.get_objects() if type(o) is ExploreResult}


def _new_results(before: dict) -> list:
    return [ref() for key, ref in _live_results().items() if key not in before or before[key]() is not ref()]


@pytest.fixture
def uncached_results():
    """No results cache: a bound of 0 bytes keeps nothing, so only the session could keep a result alive."""
    previous = settings.use(settings.RuntimeSettings({**settings.DEFAULTS, "TSE_RESULTS_CACHE_MB": "0"}))
    runs._caches.clear()
    yield
    settings.use(previous)
    runs._caches.clear()  # the next test gets the default bounds again


def _explore() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = "digits-vit"
    at.run()
    at.switch_page("pages/explore.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.get("plotly_chart"), "the page drew no charts"
    return at


def test_a_session_keeps_no_explore_result_after_its_run(uncached_results):
    before = _live_results()
    at = _explore()
    assert _new_results(before) == [], "the session still holds the Explore result after its run"
    assert at.session_state["layer"] >= 0  # the session itself lives on


def test_control_a_page_that_keeps_its_result_is_seen(uncached_results, monkeypatch):
    """The check above can fail: a page that puts its result where the session keeps it is found."""
    import streamlit as st

    from ui import explore_panels

    outputs = explore_panels.outputs

    def keeping(shown):
        st.session_state["kept"] = [o for o in gc.get_referrers(shown) if hasattr(o, "result")][0].result
        outputs(shown)

    monkeypatch.setattr(explore_panels, "outputs", keeping)
    before = _live_results()
    at = _explore()
    assert len(_new_results(before)) == 1, "the control should keep the result in session state"
    assert at.session_state["layer"] >= 0
