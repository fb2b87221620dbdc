"""How much runs may hold at once, process-wide: the run budget (bytes of runs' data alive at once), the other pages'
run slots, and Explore's run slots per model. A visitor who has to wait is told why."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import streamlit as st

from perm_core import limits
from ui.runtime import memory_audit
from ui.runtime.models import loaded_weight_bytes

# The bytes of runs' data alive at once, process-wide (TSE_RUN_BUDGET_MB, default 384). An Explore run holds its
# result's until its page is drawn, and its weights' twice more while it computes (a transformed set and the
# graph's packed copy); another page's run holds three copies of its models' weights while it computes
# (page_run_bytes). A page draws for as long as the server's Python is shared with every other session's: thirty
# students opening one dinov2-s link held thirty 23 MB results while their charts were drawn in turn. Runs past
# the budget wait their turn (first come, first served); a run larger than the whole budget runs alone, and one
# of at most 1/SMALL_SHARE of it (a digits-vit run) goes in whenever it fits.
SMALL_SHARE = 64


class RunBudget:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used = 0
        self._turns = threading.Condition()
        self._queue: list[object] = []  # waiting runs, first come first

    def _fits(self, nbytes: int, ticket) -> bool:
        """At the head of the queue, or small enough never to hold up the one there (a digits-vit run beside
        dinov2-s ones); and within the budget beside what is held, or alone."""
        in_turn = self._queue[0] is ticket or nbytes <= self.max_bytes // SMALL_SHARE
        return in_turn and (self.used == 0 or self.used + nbytes <= self.max_bytes)

    def take(self, nbytes: int, while_waiting=None, every_s: float = 0.5) -> None:
        """Take nbytes once they fit and every run that came earlier has gone in. while_waiting(seconds) is called
        every `every_s` seconds of a wait; if it raises (Streamlit stopping the run), nothing is taken and the
        run leaves the queue."""
        ticket, start = object(), time.monotonic()
        with self._turns:
            self._queue.append(ticket)
            try:
                while not self._turns.wait_for(lambda: self._fits(nbytes, ticket), every_s):
                    if while_waiting is not None:
                        self._turns.release()  # drawing a notice must not hold up the others
                        try:
                            while_waiting(time.monotonic() - start)
                        finally:
                            self._turns.acquire()
            except BaseException:
                self._queue.remove(ticket)
                self._turns.notify_all()  # the one behind may fit now
                raise
            self._queue.remove(ticket)  # not always the head: a small run goes in beside a waiting large one
            self.used += nbytes
            self._turns.notify_all()

    def give(self, nbytes: int) -> None:
        with self._turns:
            self.used -= nbytes
            self._turns.notify_all()


RUN_BUDGET = RunBudget(limits.current().run_budget_bytes)


class _WaitNotice:
    """What a waiting visitor sees: drawn again at each call (where Streamlit can stop the run if the visitor
    left), cleared once the run goes in."""

    def __init__(self):
        self._box = None

    def show(self, text: str) -> None:
        self._box = self._box or st.empty()
        self._box.info(text, icon=":material/hourglass:")

    def clear(self) -> None:
        if self._box is not None:
            self._box.empty()


def take(budget: RunBudget, nbytes: int) -> None:
    """Take nbytes of the budget; a visitor who has to wait is told why, every half second."""
    notice = _WaitNotice()
    budget.take(nbytes, lambda seconds: notice.show(
        f"Waiting for memory: this server keeps at most {budget.max_bytes / 2**20:.0f} MB of runs at once, for all "
        f"its visitors ({seconds:.0f} s so far)."))
    try:
        notice.clear()
    except BaseException:  # Streamlit stopping the run here: it never holds what it took
        budget.give(nbytes)
        raise


# The other pages' runs at once, process-wide (TSE_PAGE_RUNS, default 2): a Check, a gradient comparison or an
# SGD lockstep holds several model-sized sets while it runs, and ten students pressing Run check together held
# gigabytes. Process-wide, not per model: these pages have their own model lists, and each run is long anyway.
_PAGE_RUNS = limits.current().page_runs
_page_slots = threading.BoundedSemaphore(_PAGE_RUNS)


# A page run's share of the run budget while it computes, in copies of its models' weights: a Check of dinov2-s
# peaked at 1.7 copies over its base, a Rotation of minilm at 2.3 (transformed sets, gradients, traces).
PAGE_RUN_WEIGHT_COPIES = 3


def page_run_bytes(*models: str, dtype_name: str = "float32") -> int:
    """What a page run on these models (each loaded in this process) holds while it computes, for the budget."""
    return PAGE_RUN_WEIGHT_COPIES * sum(loaded_weight_bytes(name, dtype_name) for name in models)


@contextmanager
def page_slot(nbytes: int = 0):
    """Hold nbytes of the run budget (page_run_bytes), then one of the page run slots. A visitor who has to wait
    is told why, and the notice is redrawn every half second, which is where Streamlit can stop this run if the
    visitor leaves."""
    budget = RUN_BUDGET
    take(budget, nbytes)
    try:
        notice, start = _WaitNotice(), time.monotonic()
        while not _page_slots.acquire(timeout=0.5):
            notice.show(f"Waiting for a free run slot: this server runs {_PAGE_RUNS} of these at once, for all its "
                        f"visitors ({time.monotonic() - start:.0f} s so far).")
        try:
            notice.clear()  # where Streamlit may stop the run: the slot is given back below
            yield
        finally:
            _page_slots.release()
    finally:
        budget.give(nbytes)


# Explore's runs of one model at once (TSE_CONCURRENT_RUNS, default 2: the cores). The server's Python runs one
# thread at a time and a model one forward at a time, so more at once only holds more transformed parameter sets
# and traces alive while they wait: 30 sessions opening one link held 30 of them. Per model, so a digits-vit run
# never queues behind a slower model's.
_SLOTS_PER_MODEL = limits.current().concurrent_runs
_slots: dict[str, threading.BoundedSemaphore] = {}
_slots_guard = threading.Lock()


def model_slot(model_name: str) -> threading.BoundedSemaphore:
    with _slots_guard:
        return _slots.setdefault(model_name, threading.BoundedSemaphore(_SLOTS_PER_MODEL))


# What runs at a memory peak (benchmarks/classroom.py): a semaphore's free count is its _value (CPython's).
memory_audit.register_gauge("run_budget_bytes_held", lambda: RUN_BUDGET.used)
memory_audit.register_gauge("runs_waiting_for_memory", lambda: len(RUN_BUDGET._queue))
memory_audit.register_gauge("explore_runs_computing",
                            lambda: sum(_SLOTS_PER_MODEL - slots._value for slots in list(_slots.values())))
memory_audit.register_gauge("page_runs", lambda: _PAGE_RUNS - _page_slots._value)
