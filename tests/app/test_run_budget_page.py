"""An Explore run holds its share of the process-wide run budget (ui.runtime.budget.RUN_BUDGET): its result's bytes from
before its model runs until its page is drawn, and its weights' twice while it computes; it gives them back when
the page is drawn (ui.runtime.runs.explore)."""

import pytest

from tests.app.test_explore import explore  # digits-vit's Explore page, no exception
from ui.runtime import budget as run_budget
from ui.runtime import runs


class RecordingBudget(run_budget.RunBudget):
    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.taken: list[int] = []

    def take(self, nbytes, while_waiting=None, every_s=0.5, page=False, own=0):
        super().take(nbytes, while_waiting, every_s, page, own)
        self.taken.append(nbytes)


@pytest.fixture
def budget(monkeypatch):
    recording = RecordingBudget(256 << 20)
    monkeypatch.setattr(run_budget, "RUN_BUDGET", recording)
    runs._caches.clear()  # no result kept: the first run computes
    yield recording
    runs._caches.clear()


def digits_exploration():
    explorations = runs._caches()["explorations"]
    (explorer,) = [e for key, e in explorations._items.items() if key[0] == "digits-vit"]
    return explorer


def test_an_explore_run_holds_its_share_until_it_ends(budget):
    at = explore()
    assert at.get("plotly_chart"), "the page drew no chart"
    explorer = digits_exploration()
    weights = sum(p.numel() * p.element_size() for p in explorer.subject.params.values())
    assert explorer.trace_bytes > 0 and explorer.compute_bytes == 2 * weights > 0
    assert budget.taken == [explorer.trace_bytes + explorer.compute_bytes]  # the result was computed
    assert budget.used == 0  # given back when the run ended
    at.run()  # the same settings again: the result is kept, so only its bytes are held
    assert budget.taken[1:] == [explorer.trace_bytes] and budget.used == 0


def test_control_a_run_that_never_gives_back_keeps_its_result_bytes(budget, monkeypatch):
    """The check above can fail: with explore()'s last give left out, the result's bytes stay held (those for
    computing went back once the result was there)."""
    gives = []
    real_give = budget.give
    monkeypatch.setattr(budget, "give", lambda n: gives.append(n) or (real_give(n) if len(gives) == 1 else None))
    explore()
    assert budget.used == digits_exploration().trace_bytes > 0
