"""An Explore run holds its result's bytes of the process-wide run budget (ui.compute.RUN_BUDGET) from before its
model runs until its page is drawn, and gives them back when the run ends (ui.sidebar.end_run)."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import ui.sidebar
from ui import compute

APP = str(Path(__file__).resolve().parents[2] / "app.py")


class RecordingBudget(compute.RunBudget):
    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.taken: list[int] = []

    def take(self, nbytes, while_waiting=None, every_s=0.5):
        super().take(nbytes, while_waiting, every_s)
        self.taken.append(nbytes)


@pytest.fixture
def budget(monkeypatch):
    recording = RecordingBudget(256 << 20)
    monkeypatch.setattr(compute, "RUN_BUDGET", recording)
    monkeypatch.setattr(compute.hold_for_this_run, "__defaults__", (recording,))
    return recording


def explore_digits() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = "digits-vit"
    at.run()
    at.switch_page("pages/explore.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def original_trace_bytes() -> int:
    explorations = compute._caches()["explorations"]
    (explorer,) = [e for key, e in explorations._items.items() if key[0] == "digits-vit"]
    return explorer.trace_bytes


def test_an_explore_run_holds_its_result_bytes_until_it_ends(budget):
    at = explore_digits()
    assert at.get("plotly_chart"), "the page drew no chart"
    assert budget.taken == [original_trace_bytes()] and budget.taken[0] > 0
    assert budget.used == 0  # given back when the run ended


def test_control_a_run_that_never_gives_back_keeps_its_bytes(budget, monkeypatch):
    """The check above can fail: with the release left out of end_run, the bytes stay held."""
    monkeypatch.setattr(ui.sidebar, "release_run_budget", lambda: None)
    explore_digits()
    assert budget.used == original_trace_bytes() > 0
