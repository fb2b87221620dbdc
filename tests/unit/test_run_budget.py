"""Explore runs' data alive at once is bounded by bytes (ui.runtime.budget.RunBudget): a run past the budget waits its
turn, first come first served, a small one goes in whenever it fits, and a run that gives up takes nothing."""

import contextlib
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from ui.runtime import budget as run_budgets
from ui.runtime import runs
from ui.runtime.budget import RunBudget

WAIT_S = 5.0


class AdmissionOrder(RunBudget):
    """A RunBudget that notes each run's bytes as it goes in, under the budget's own lock: the order the runs are
    admitted in. The order their threads then append to a list is the scheduler's, and is not asserted."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes)
        self.admitted: list[int] = []

    def _fits(self, run) -> bool:
        fits = super()._fits(run)
        if fits:  # each run's wait ends at the first call that says it fits, and it goes in under the same lock
            self.admitted.append(run.nbytes)
        return fits


def taking(budget: RunBudget, nbytes: int, done: list, name: str, **kwargs) -> threading.Thread:
    """A run taking nbytes in its own thread; its name goes into `done` once it is in."""
    def run():
        budget.take(nbytes, **kwargs)
        done.append(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waiting(budget: RunBudget, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(budget._queue) < count:
        assert time.monotonic() < deadline, "the runs never queued"
        time.sleep(0.01)


def test_a_run_past_the_budget_waits_until_bytes_are_given_back():
    budget, done = RunBudget(100), []
    budget.take(60)
    assert budget.used == 60
    thread = taking(budget, 50, done, "second")
    waiting(budget, 1)
    time.sleep(0.1)
    assert done == [] and budget.used == 60  # 60 + 50 is over 100
    budget.give(60)
    thread.join(WAIT_S)
    assert done == ["second"] and budget.used == 50
    budget.give(50)
    assert budget.used == 0 and budget._queue == []


def test_runs_go_in_first_come_first_served():
    """The third run's 30 bytes fit beside the first's 60, but the second came earlier and waits for 50."""
    budget, done = AdmissionOrder(100), []
    budget.take(60)
    second = taking(budget, 50, done, "second")
    waiting(budget, 1)
    third = taking(budget, 30, done, "third")
    waiting(budget, 2)
    time.sleep(0.1)
    assert done == []
    budget.give(60)
    second.join(WAIT_S)
    third.join(WAIT_S)
    assert sorted(done) == ["second", "third"] and budget.used == 80
    assert budget.admitted == [60, 50, 30]


def test_a_small_run_goes_in_beside_a_waiting_large_one():
    budget, done = RunBudget(6400), []
    budget.take(4000)
    large = taking(budget, 3000, done, "large")
    waiting(budget, 1)
    budget.take(6400 // run_budgets.SMALL_SHARE)  # fits beside the 4000 held; the large one still waits
    assert budget.used == 4100 and done == []
    budget.give(4100)
    large.join(WAIT_S)
    assert done == ["large"]


def test_a_run_larger_than_the_budget_runs_alone():
    budget, done = RunBudget(100), []
    budget.take(250)  # nothing held: it goes in
    small = taking(budget, 1, done, "small")
    waiting(budget, 1)
    time.sleep(0.1)
    assert done == []  # 250 + 1 is over the budget
    budget.give(250)
    small.join(WAIT_S)
    assert done == ["small"]


def test_a_run_that_stops_while_waiting_takes_nothing_and_lets_the_next_in():
    budget, done, calls = RunBudget(100), [], []

    class Stopped(Exception):
        pass

    def stop(seconds):
        calls.append(seconds)
        raise Stopped  # Streamlit stops a run from inside a redraw of its notice

    budget.take(60)
    with pytest.raises(Stopped):
        budget.take(50, while_waiting=stop, every_s=0.05)
    assert len(calls) == 1 and budget._queue == [] and budget.used == 60
    next_run = taking(budget, 40, done, "next")  # was behind the stopped one: in at once now
    next_run.join(WAIT_S)
    assert done == ["next"] and budget.used == 100


LOADED = SimpleNamespace(labels=None, tokenizer=None)


class FakeExplorer:
    """What ui.runtime.runs.explore reads of an Exploration: its result's bytes, what computing adds, and run()."""
    trace_bytes, compute_bytes = 30, 50

    def __init__(self, fail=False):
        self.fail, self.runs = fail, 0

    def run(self, keys, control, mlp_layer):
        self.runs += 1
        if self.fail:
            raise RuntimeError("the model failed")
        return f"result {self.runs}"


def test_an_explore_run_holds_its_bytes_while_drawn_and_gives_them_back_however_it_ends(monkeypatch):
    budget, explorer, seen = RunBudget(100), FakeExplorer(), []
    monkeypatch.setattr(runs, "_caches", lambda: {"results": runs.TensorCache(1 << 20)})
    monkeypatch.setattr(runs, "_mlp_result", lambda *args: None)
    monkeypatch.setattr(runs, "page_data", lambda explorer, result, *args: f"page of {result}")
    request = runs.ExploreRequest("m", "float32", "cpu", "x", (("mlp", 3),), layer=0)
    with runs.explore(request, explorer, LOADED, {}, lambda: _seeing(seen, budget), budget) as data:
        assert data == "page of result 1" and seen == [80]  # while computing: the result's bytes and the weights'
        assert budget.used == 30  # while the page draws: the result's bytes
    assert budget.used == 0
    with pytest.raises(RuntimeError), runs.explore(request, FakeExplorer(fail=True), LOADED, {}, run_budget=budget):
        pass
    assert budget.used == 0  # a failed run gives back everything
    stopped = RuntimeError("Streamlit stops the run while the page draws")
    with pytest.raises(RuntimeError), runs.explore(request, explorer, LOADED, {}, run_budget=budget):
        raise stopped
    assert budget.used == 0


def test_a_page_holds_each_result_while_drawn_and_gives_them_back_however_it_ends(monkeypatch):
    budget = RunBudget(1 << 20)
    cache = runs.TensorCache(1 << 20)
    monkeypatch.setattr(runs, "_page_cache", lambda: cache)
    gradients, lockstep = torch.zeros(1000), torch.zeros(3000)  # float32: 4000 and 12000 bytes
    with runs.page_runs(budget) as page:
        assert page.result(runs.PageRequest("backward/gradients", ("k", 1)), lambda: gradients) is gradients
        assert budget.used == 4000
        assert page.result(runs.PageRequest("backward/lockstep", ("k", 1)), lambda: lockstep) is lockstep
        assert budget.used == 16000  # both are drawn now
    assert budget.used == 0
    with pytest.raises(RuntimeError), runs.page_runs(budget) as page:
        page.result(runs.PageRequest("backward/gradients", ("k", 1)), lambda: 1 / 0)  # cached: not computed
        assert budget.used == 4000
        raise RuntimeError("Streamlit stops the run while the page draws")
    assert budget.used == 0


@contextlib.contextmanager
def _seeing(seen, budget):
    seen.append(budget.used)
    yield


def test_a_page_run_holds_its_bytes_while_it_computes_and_gives_them_back_on_failure(monkeypatch):
    budget = RunBudget(1000)
    monkeypatch.setattr(run_budgets, "RUN_BUDGET", budget)
    with run_budgets.page_slot(300):
        assert budget.used == 300
    assert budget.used == 0
    with pytest.raises(RuntimeError), run_budgets.page_slot(300):
        raise RuntimeError("the run failed")
    assert budget.used == 0 and budget._queue == []


def test_a_page_run_counts_three_copies_of_its_models_weights(monkeypatch):
    from ui.runtime import models as shared_models

    monkeypatch.setattr(shared_models, "_loaded_bytes", {("a", "float32"): 100, ("b", "float32"): 10,
                                                     ("a", "float64"): 200})
    assert run_budgets.page_run_bytes("a") == 300
    assert run_budgets.page_run_bytes("a", "b") == 330
    assert run_budgets.page_run_bytes("a", dtype_name="float64") == 600
    assert run_budgets.page_run_bytes("not loaded") == 0  # small: it never waits


class Stopped(Exception):
    pass


@pytest.fixture
def stopped_when_notice_clears(monkeypatch) -> threading.Event:
    """Streamlit stops a run at its next call: here, the one clearing a wait notice. The event is set once a notice
    has been drawn: a waiting run has really waited, whatever the scheduler did with its thread."""
    drawn = threading.Event()

    class Notice:
        def info(self, *args, **kwargs):
            drawn.set()

        def empty(self):
            raise Stopped

    monkeypatch.setattr(run_budgets.st, "empty", Notice)
    return drawn


def test_a_run_stopped_as_its_wait_notice_is_cleared_holds_nothing(stopped_when_notice_clears):
    """Streamlit stops a run at its next call: here the one clearing the wait notice, after the bytes were taken."""
    budget, errors = RunBudget(100), []
    budget.take(60)

    def run():
        try:
            run_budgets.take(budget, 50)
        except Stopped:
            errors.append("stopped")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    waiting(budget, 1)
    assert stopped_when_notice_clears.wait(WAIT_S)  # the notice is drawn: the run is waiting in it
    budget.give(60)
    thread.join(WAIT_S)
    assert errors == ["stopped"] and budget.used == 0 and budget._queue == []


def test_a_page_run_stopped_as_its_slot_notice_is_cleared_gives_the_slot_back(stopped_when_notice_clears,
                                                                             monkeypatch):
    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(run_budgets, "_page_slots", slots)
    slots.acquire()  # another visitor's run holds the only slot
    errors = []

    def run():
        try:
            with run_budgets.page_slot():
                errors.append("ran")
        except Stopped:
            errors.append("stopped")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert stopped_when_notice_clears.wait(WAIT_S)  # the notice is drawn: the run is waiting for the slot
    slots.release()
    thread.join(WAIT_S)
    assert errors == ["stopped"]
    assert slots.acquire(blocking=False)  # the stopped run gave its slot back


def test_a_short_page_run_does_not_wait_for_a_page_slot(monkeypatch):
    """Rotation's residual and RoPE comparisons are a few forwards: they run at once, as Explore's do, while the
    long runs (a Check, training) queue for the page slots."""
    import threading

    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(run_budgets, "_page_slots", slots)
    cache = runs.TensorCache(1 << 20)
    monkeypatch.setattr(runs, "_page_cache", lambda: cache)
    slots.acquire()  # another visitor's long run holds the only slot
    try:
        with runs.page_runs(RunBudget(1 << 20)) as page:
            short = runs.PageRequest("rotation/residual", ("digits-vit", 7), in_slot=False)
            assert page.result(short, lambda: torch.ones(3)).sum().item() == 3.0
        waited = []
        long_run = threading.Thread(target=lambda: waited.append(run_budgets._page_slots.acquire(timeout=0.3)))
        long_run.start()
        long_run.join()
        assert waited == [False]  # the control: a run that needs the slot would still be waiting
    finally:
        slots.release()


def test_a_key_change_does_not_queue_behind_a_page_run_waiting_for_memory():
    """A page run (a Check) waiting for the page runs' share holds up page runs only: an Explore run that came later
    goes in beside the one computing. Control: with a single line, the Explore run waits behind it."""
    budget, done = RunBudget(100), []
    budget.take(50, page=True)  # the page runs' whole share (100 // PAGE_SHARE)
    check = taking(budget, 40, done, "check", page=True)
    waiting(budget, 1)
    key_change = taking(budget, 40, done, "key change")
    key_change.join(WAIT_S)
    assert done == ["key change"] and budget.used == 90 and budget.page_used == 50
    budget.give(40)
    time.sleep(0.1)
    assert done == ["key change"]  # 50 + 40 is over the page runs' share: the check waits for the first
    budget.give(50, page=True)
    check.join(WAIT_S)
    assert done == ["key change", "check"] and budget.used == budget.page_used == 40

    single_line, done = AdmissionOrder(100), []
    single_line.take(50)
    second = taking(single_line, 60, done, "second")
    waiting(single_line, 1)
    third = taking(single_line, 40, done, "third")  # fits beside the 50, but the second came first
    waiting(single_line, 2)
    time.sleep(0.1)
    assert done == []
    single_line.give(50)
    second.join(WAIT_S)
    third.join(WAIT_S)
    assert sorted(done) == ["second", "third"] and single_line.admitted == [50, 60, 40]


def test_page_runs_together_hold_at_most_their_share_and_one_larger_runs_alone_among_them():
    budget, done = RunBudget(100), []
    budget.take(30, page=True)
    second = taking(budget, 30, done, "second", page=True)  # 60 is within the budget, over the share of 50
    waiting(budget, 1)
    time.sleep(0.1)
    assert done == [] and budget.page_used == 30
    budget.take(30)  # an Explore run's 30 beside it: 60 of 100
    budget.give(30, page=True)
    second.join(WAIT_S)
    assert done == ["second"] and budget.page_used == 30 and budget.used == 60
    budget.give(30, page=True)
    budget.give(30)
    budget.take(70, page=True)  # over the share, nothing else held by page runs: it goes in
    assert budget.page_used == 70
    budget.give(70, page=True)
    assert budget.used == budget.page_used == 0


def test_a_page_run_kept_waiting_by_key_changes_stops_new_ones_until_it_is_in(monkeypatch):
    # The check's patience is set, not waited out: long while it is early in its wait, none once it has waited
    # (a 0.2 s patience let a busy machine's scheduler decide which side of it the early key change fell)
    monkeypatch.setattr(run_budgets, "PAGE_PATIENCE_S", 3600)
    budget, done = AdmissionOrder(100), []
    budget.take(80)  # key changes computing
    check = taking(budget, 40, done, "check", page=True)
    waiting(budget, 1)
    budget.take(10)  # early in its wait, a key change still goes in: 90 of 100
    monkeypatch.setattr(run_budgets, "PAGE_PATIENCE_S", 0)
    late = taking(budget, 10, done, "late key change")  # would fit (100), but the check has waited long enough
    waiting(budget, 2)
    time.sleep(0.1)
    assert done == []
    budget.give(90)
    check.join(WAIT_S)
    late.join(WAIT_S)
    assert sorted(done) == ["check", "late key change"] and budget.used == 50
    assert budget.admitted == [80, 10, 40, 10]  # the check before the late key change


def test_a_small_page_run_is_not_held_up_by_a_large_one_waiting_for_memory(monkeypatch):
    """Memory before the slot: a large Check waiting for the page runs' share holds no slot, so a digits-vit Check
    takes the free one. Control: the large one holding the last slot keeps the small one out."""
    budget = RunBudget(1000)
    monkeypatch.setattr(run_budgets, "RUN_BUDGET", budget)
    monkeypatch.setattr(run_budgets, "_page_slots", threading.BoundedSemaphore(2))
    entered = []

    def page_run(nbytes, name, leave):
        with run_budgets.page_slot(nbytes):
            entered.append(name)
            leave.wait(WAIT_S)

    first_leaves, second_leaves, small_leaves = threading.Event(), threading.Event(), threading.Event()
    threads = [threading.Thread(target=page_run, args=(400, "first", first_leaves), daemon=True)]
    threads[0].start()
    while entered != ["first"]:
        time.sleep(0.01)
    threads.append(threading.Thread(target=page_run, args=(400, "second", second_leaves), daemon=True))
    threads[1].start()  # 800 is over the share of 500: it waits for memory, not holding the second slot
    waiting(budget, 1)
    threads.append(threading.Thread(target=page_run, args=(10, "small", small_leaves), daemon=True))
    threads[2].start()
    deadline = time.monotonic() + WAIT_S
    while "small" not in entered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert entered == ["first", "small"]
    small_leaves.set()
    first_leaves.set()
    threads[1].join(0.1)
    while "second" not in entered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert entered == ["first", "small", "second"]
    second_leaves.set()
    for thread in threads:
        thread.join(WAIT_S)
    assert budget.used == budget.page_used == 0

    monkeypatch.setattr(run_budgets, "_page_slots", threading.BoundedSemaphore(1))  # control: no free slot
    entered.clear()
    first_leaves.clear()
    holder = threading.Thread(target=page_run, args=(400, "first", first_leaves), daemon=True)
    holder.start()
    while entered != ["first"]:
        time.sleep(0.01)
    small_leaves.clear()
    small = threading.Thread(target=page_run, args=(10, "small", small_leaves), daemon=True)
    small.start()
    time.sleep(0.7)
    assert entered == ["first"]
    first_leaves.set()
    while "small" not in entered and time.monotonic() < deadline + WAIT_S:
        time.sleep(0.01)
    assert entered == ["first", "small"]
    small_leaves.set()  # every run leaves before the test puts the process's slots back
    small.join(WAIT_S)
    holder.join(WAIT_S)
    assert not small.is_alive() and not holder.is_alive()


def test_a_check_counts_its_measured_copies_by_direction(monkeypatch):
    from ui.runtime import models as shared_models

    monkeypatch.setattr(shared_models, "_loaded_bytes", {("a", "float32"): 100})
    forward, backward = (run_budgets.page_run_bytes("a", copies=run_budgets.CHECK_WEIGHT_COPIES[b]) for b in (0, 1))
    assert (forward, backward) == (200, 350)
    # a dinov2-s-sized forward Check fits the page runs' share of the default budget, beside which a key change's
    # two copies of the same weights still fit: key changes do not wait for it
    budget, weights = RunBudget(384 << 20), 88 << 20
    assert 2 * weights <= budget.page_cap and 2 * weights + 2 * weights + (30 << 20) <= budget.max_bytes


def test_a_page_holding_its_result_is_not_kept_waiting_by_itself_for_a_run_larger_than_the_budget(monkeypatch):
    """Backward on minilm in float64 drew its gradients (247 MB held) and then asked for its SGD run (520 MB, more
    than the 384 MB budget): a run that large goes in alone, and the page waited for its own result forever."""
    budget = RunBudget(100)
    monkeypatch.setattr(run_budgets, "RUN_BUDGET", budget)
    cache = runs.TensorCache(1 << 20)
    monkeypatch.setattr(runs, "_page_cache", lambda: cache)
    gradients, lockstep = torch.zeros(15), torch.zeros(5)  # 60 and 20 bytes
    finished = []

    def page():
        with runs.page_runs(budget) as shared:
            shared.result(runs.PageRequest("backward/gradients", ("k",), nbytes=80), lambda: gradients)
            seen = []
            shared.result(runs.PageRequest("backward/lockstep", ("k",), nbytes=250),
                          lambda: seen.append(budget.used) or lockstep)
            finished.append(seen[0])

    thread = threading.Thread(target=page, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert finished == [60 + 250]  # its own 60 bytes held, the large run in beside them
    assert budget.used == 0 and budget._queue == []


def test_a_run_larger_than_the_budget_still_waits_for_what_others_hold():
    """The negative control: only the caller's own bytes are set aside; another run's keep it waiting."""
    budget, done = RunBudget(100), []
    budget.take(60, own=0)  # the page's own result
    budget.take(10)  # another visitor's run
    large = taking(budget, 250, done, "large", page=True, own=60)
    waiting(budget, 1)
    time.sleep(0.1)
    assert done == []
    budget.give(10)
    large.join(WAIT_S)
    assert done == ["large"] and budget.used == 310
    no_own = taking(budget, 250, done, "no own", page=True)  # without `own`, its own bytes would keep it out
    waiting(budget, 1)
    time.sleep(0.1)
    assert done == ["large"]
    budget.give(250, page=True)
    budget.give(60)
    no_own.join(WAIT_S)
    assert done == ["large", "no own"]
