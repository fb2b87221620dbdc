"""The e2e waits' budget is a quiet machine's time (tests/e2e/conftest.patiently): on a loaded machine a wait lasts
longer in proportion to the load, on a quiet one no longer than its budget, and a hang still ends."""

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.e2e import conftest
from tests.e2e.conftest import WAIT_SLICE_MS, patiently


class NeverReady:
    """A wait whose condition never holds: each call is one slice of a simulated clock."""

    def __init__(self):
        self.calls, self.now = 0, 0.0

    def __call__(self, slice_ms):
        self.calls += 1
        self.now += slice_ms / 1000
        raise PlaywrightTimeout("not yet")


@pytest.mark.parametrize("load", [1.0, 4.0])
def test_a_wait_gives_up_after_its_budget_in_quiet_machine_time(load):
    wait = NeverReady()
    with pytest.raises(PlaywrightTimeout):
        patiently(wait, 60_000, load=lambda: load, clock=lambda: wait.now)
    assert wait.calls == 60_000 / WAIT_SLICE_MS * load  # 12 slices quiet, 48 at four runnable processes a core


def test_a_hang_ends_however_loaded_the_machine():
    wait = NeverReady()
    with pytest.raises(PlaywrightTimeout):
        patiently(wait, 60_000, load=lambda: 1000.0, clock=lambda: wait.now)
    assert wait.now == 60 * conftest.HANG_FACTOR


def test_a_wait_that_is_met_returns_at_once_with_its_value():
    wait = NeverReady()

    def ready_on_third(slice_ms):
        if wait.calls < 2:
            wait(slice_ms)
        return "drawn"

    assert patiently(ready_on_third, 60_000, load=lambda: 1.0, clock=lambda: wait.now) == "drawn"
    assert wait.calls == 2
