"""A finished page run keeps no heavy data alive: Streamlit keeps a session's widgets (and through the functions
a page hands them, the page's globals) until the session's next run, and thirty sessions kept thirty Explore
results past the results cache's bound. ui.sidebar.end_run drops them (ui.runtime.housekeeping.drop_page_data)."""

import gc
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

import ui.runtime.housekeeping as resources
from perm_core import limits
from perm_core.explore.exploration import ExploreResult
from ui.runtime import runs as compute

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGES = sorted((Path(__file__).resolve().parents[2] / "pages").glob("*.py"))


def test_heavy_globals_are_dropped_and_light_ones_kept():
    big = torch.zeros(resources.PAGE_DATA_KEPT_BYTES // 4 + 1)  # one element over the bound
    page = {"__file__": "pages/x.py", "big": big, "nested": {"trace": [big.clone()]},
            "array": np.zeros(resources.PAGE_DATA_KEPT_BYTES + 1, dtype=np.uint8),
            "small": torch.zeros(4), "labels": ["a", "b"], "np": np, "torch": torch, "fn": print,
            "settings": ("digits-vit", 3)}
    dropped = resources.drop_page_data(page)
    assert sorted(dropped) == ["array", "big", "nested"]
    assert sorted(page) == ["__file__", "fn", "labels", "np", "settings", "small", "torch"]
    assert torch.equal(page["small"], torch.zeros(4))  # kept as it was


def test_an_object_of_our_own_holding_a_large_trace_is_dropped():
    holder = type("Holder", (), {"__module__": "perm_core.explore.exploration"})()
    holder.trace = {"hidden": torch.ones(2**19)}  # 2 MiB
    page = {"result": holder, "other": SimpleNamespace(x=torch.ones(2**19))}  # another library's: not walked
    assert resources.drop_page_data(page) == ["result"]


def test_every_page_hands_its_globals_to_the_sidebar():
    for page in PAGES:
        assert "globals())" in page.read_text(), f"{page.name} does not call ensure_view with globals()"


def _live_results() -> dict:
    """Every ExploreResult alive now, by id and weakly: a result an earlier test left may be freed meanwhile, and
    must not count as this test's."""
    gc.collect()
    return {id(o): weakref.ref(o) for o in gc.get_objects() if type(o) is ExploreResult}


def _new_results(before: dict) -> list:
    return [ref() for key, ref in _live_results().items() if key not in before or before[key]() is not ref()]


@pytest.fixture
def uncached_results(monkeypatch):
    """No results cache (a bound of 0 bytes keeps nothing), and every global with tensors counts as heavy:
    digits-vit's result is small."""
    previous = limits.use(limits.Limits({**limits.DEFAULTS, "TSE_RESULTS_CACHE_MB": "0"}))
    monkeypatch.setattr(resources, "PAGE_DATA_KEPT_BYTES", 0)
    compute._caches.clear()
    yield
    limits.use(previous)
    compute._caches.clear()  # the next test gets the default bounds again


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


def test_control_without_the_drop_the_session_keeps_its_result(uncached_results, monkeypatch):
    sidebar = sys.modules["ui.sidebar"]
    monkeypatch.setattr(sidebar, "drop_page_data", lambda page_globals: [])
    before = _live_results()
    at = _explore()
    assert len(_new_results(before)) == 1, "the control should keep the result through the page's globals"
    assert at.session_state["layer"] >= 0
