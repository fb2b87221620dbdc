"""How much runs may hold at once, process-wide: the run budget (bytes of runs' data alive at once), the other pages'
run slots, and Explore's run slots per model. A visitor who has to wait is told why."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import streamlit as st

from ui.runtime import memory_audit, settings
from ui.runtime.models import loaded_weight_bytes

# The bytes of runs' data alive at once, process-wide (TSE_RUN_BUDGET_MB, default 384). An Explore run holds its
# result's until its page is drawn, and its weights' twice more while it computes (a transformed set and the
# graph's packed copy); another page's run holds its measured copies of its models' weights while it computes
# (page_run_bytes). A page draws for as long as the server's Python is shared with every other session's: thirty
# students opening one dinov2-s link held thirty 23 MB results while their charts were drawn in turn. Runs past
# the budget wait their turn (first come, first served); a run larger than the whole budget runs alone, and one
# of at most 1/SMALL_SHARE of it (a digits-vit run) goes in whenever it fits.
SMALL_SHARE = 64
# Page runs (a Check, gradients, training) hold their bytes for tens of seconds to minutes, an Explore run for
# seconds: together page runs hold at most 1/PAGE_SHARE of the budget (one larger than that runs alone among
# them), so key changes always find the rest. Each kind waits in its own line, so a key change never queues
# behind a Check that waits for memory; the first waiting page run, once it has waited PAGE_PATIENCE_S for the
# budget itself, stops new Explore runs (small ones aside) until it is in, so key changes cannot starve it.
PAGE_SHARE = 2
PAGE_PATIENCE_S = 2.0


@dataclass(eq=False)  # each waiting run is its own ticket: found and removed by identity
class _Waiting:
    nbytes: int
    page: bool
    own: int = 0  # of what is held, the bytes the waiting run's own page holds already (its drawn results)
    since: float = field(default_factory=time.monotonic)


class RunBudget:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used = 0
        self.page_used = 0  # of `used`, what page runs hold
        self._turns = threading.Condition()
        self._queue: list[_Waiting] = []  # first come first

    @property
    def page_cap(self) -> int:
        return self.max_bytes // PAGE_SHARE

    def _fits(self, run: _Waiting) -> bool:
        """At the head of its kind's line, or small enough never to hold up the one there (a digits-vit run beside
        dinov2-s ones); within the budget beside what is held, or alone; a page run also within the page runs'
        share, or alone among them. An Explore run also waits while a page run has waited too long."""
        small = run.nbytes <= self.max_bytes // SMALL_SHARE
        head = next(waiting for waiting in self._queue if waiting.page == run.page)
        if not run.page and not small and self._page_run_starving():
            return False
        # "Alone" counts only others' bytes: a page that holds its first result and asks for a run larger than the
        # budget would otherwise wait for itself forever (Backward on minilm in float64: 247 MB held, 520 MB asked)
        within = self.used == run.own or self.used + run.nbytes <= self.max_bytes
        if run.page:
            within = within and self._within_page_share(run.nbytes)
        return (head is run or small) and within

    def _within_page_share(self, nbytes: int) -> bool:
        return self.page_used == 0 or self.page_used + nbytes <= self.page_cap

    def _page_run_starving(self) -> bool:
        """The first waiting page run has waited PAGE_PATIENCE_S for the budget itself (not for the other page runs'
        share: that wait is theirs to end, and key changes need not stop for it)."""
        first = next((waiting for waiting in self._queue if waiting.page), None)
        return (first is not None and time.monotonic() - first.since >= PAGE_PATIENCE_S
                and self._within_page_share(first.nbytes))

    def take(self, nbytes: int, while_waiting=None, every_s: float = 0.5, page: bool = False, own: int = 0) -> None:
        """Take nbytes once they fit and every run of its kind that came earlier has gone in. while_waiting(seconds)
        is called every `every_s` seconds of a wait; if it raises (Streamlit stopping the run), nothing is taken
        and the run leaves the queue. page: a page run's bytes (the page runs' share). own: the bytes the caller's
        page already holds (they count as held, but a run larger than the budget need not wait for them)."""
        run = _Waiting(nbytes, page, own)
        with self._turns:
            self._queue.append(run)
            try:
                while not self._turns.wait_for(lambda: self._fits(run), every_s):
                    if while_waiting is not None:
                        self._turns.release()  # drawing a notice must not hold up the others
                        try:
                            while_waiting(time.monotonic() - run.since)
                        finally:
                            self._turns.acquire()
            except BaseException:
                self._queue.remove(run)
                self._turns.notify_all()  # the one behind may fit now
                raise
            self._queue.remove(run)  # not always the head: a small run goes in beside a waiting large one
            self.used += nbytes
            self.page_used += nbytes if page else 0
            self._turns.notify_all()

    def give(self, nbytes: int, page: bool = False) -> None:
        with self._turns:
            self.used -= nbytes
            self.page_used -= nbytes if page else 0
            self._turns.notify_all()


RUN_BUDGET = RunBudget(settings.current().run_budget_bytes)


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


def take(budget: RunBudget, nbytes: int, page: bool = False, own: int = 0) -> None:
    """Take nbytes of the budget (page: a page run's; own: what the caller's page holds already, RunBudget.take); a
    visitor who has to wait is told why, every half second."""
    notice = _WaitNotice()
    budget.take(nbytes, lambda seconds: notice.show(
        f"Waiting for memory: this server keeps at most {budget.max_bytes / 2**20:.0f} MB of runs at once, for all "
        f"its visitors ({seconds:.0f} s so far)."), page=page, own=own)
    try:
        notice.clear()
    except BaseException:  # Streamlit stopping the run here: it never holds what it took
        budget.give(nbytes, page=page)
        raise


# The other pages' runs at once, process-wide (TSE_PAGE_RUNS, default 2): a Check, a gradient comparison or an
# SGD lockstep holds several model-sized sets while it runs, and ten students pressing Run check together held
# gigabytes. Process-wide, not per model: these pages have their own model lists, and each run is long anyway.
_PAGE_RUNS = settings.current().page_runs
_page_slots = threading.BoundedSemaphore(_PAGE_RUNS)


# A page run's share of the run budget while it computes, in copies of its models' weights: a Rotation of minilm
# peaked at 2.3 copies over its base (transformed sets, gradients, traces). A Check's own, measured in a server's
# malloc settings (peak resident above the loaded model, float32): forward only 1.5 (minilm) and 2.0 (dinov2-s)
# copies, with gradients 3.3 (dinov2-s) and 3.4 (minilm).
PAGE_RUN_WEIGHT_COPIES = 3
CHECK_WEIGHT_COPIES = {False: 2, True: 3.5}  # backward too?


def page_run_bytes(*models: str, dtype_name: str = "float32", copies: float = PAGE_RUN_WEIGHT_COPIES) -> int:
    """What a page run on these models (each loaded in this process) holds while it computes, for the budget."""
    return int(copies * sum(loaded_weight_bytes(name, dtype_name) for name in models))


@contextmanager
def page_slot(nbytes: int = 0, own: int = 0):
    """nbytes of the run budget (page_run_bytes) from the page runs' share (own: what the page holds already, as
    RunBudget.take counts it), then one of the page run slots. Memory first: a large run waiting for the page runs'
    share holds no slot, so a small one (digits-vit) is not held up by it. A visitor who has to wait is told why, and
    the notice is redrawn every half second, which is where Streamlit can stop this run if the visitor leaves."""
    budget = RUN_BUDGET
    take(budget, nbytes, page=True, own=own)
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
        budget.give(nbytes, page=True)


# Explore's runs of one model at once (TSE_CONCURRENT_RUNS, default 2: the cores). The server's Python runs one
# thread at a time and a model one forward at a time, so more at once only holds more transformed parameter sets
# and traces alive while they wait: 30 sessions opening one link held 30 of them. Per model, so a digits-vit run
# never queues behind a slower model's.
_SLOTS_PER_MODEL = settings.current().concurrent_runs
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
