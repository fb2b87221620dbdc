"""Process-wide caches for the Explore page's compute (shared by all sessions), bounded by bytes.

The original trace is cached per (model, dtype, device, input); a result per (that, keys, control),
so moving a layer slider or switching pages re-runs no model. Both hold traces whose size grows with
the model and the input, so each cache is bounded by the bytes of the tensors it keeps (least recently
used first out): TSE_EXPLORATIONS_CACHE_MB (default 192) and TSE_RESULTS_CACHE_MB (default 192). The other
pages' finished runs share TSE_PAGES_CACHE_MB (default 128, `page_run`). Transformed parameters have their own
bound (perm_core.param_cache, TSE_PARAMS_CACHE_MB).
"""

from __future__ import annotations

import copy
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import streamlit as st
import torch

from perm_core import limits
from perm_core.explore import Exploration, ExploreResult
from perm_core.param_cache import TensorCache
from ui import memory_audit
from ui.resources import loaded_weight_bytes


@st.cache_resource(show_spinner=False, max_entries=2)
def model_on(model_name: str, dtype_name: str, device: str, _model):
    """CPU uses the shared model itself; another device gets its own copy (the shared one never moves)."""
    return _model if device == "cpu" else copy.deepcopy(_model).to(device)


@st.cache_resource(show_spinner=False)
def _caches() -> dict[str, TensorCache]:
    settings = limits.current()
    caches = {"explorations": TensorCache(settings.explorations_cache_bytes),
              "results": TensorCache(settings.results_cache_bytes)}
    for name, cache in caches.items():
        memory_audit.register(name, cache)
    return caches


@st.cache_resource(show_spinner=False)
def _page_cache() -> TensorCache:
    """Apart from Explore's caches: a bad setting of one breaks only the pages that use it."""
    cache = TensorCache(limits.current().pages_cache_bytes)
    memory_audit.register("pages", cache)
    return cache


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


# 384: thirty sessions (benchmarks/classroom.py) at 256 queued dinov2-s and minilm key changes one at a time (p95
# 13.7-15.4 s against 11.5-11.7 s at 384 and 9.7-11.3 s without a budget, in the same hours); digits-vit's stay fast.
RUN_BUDGET = RunBudget(limits.current().run_budget_bytes)
# What runs at a memory peak (benchmarks/classroom.py): a semaphore's free count is its _value (CPython's).
memory_audit.register_gauge("run_budget_bytes_held", lambda: RUN_BUDGET.used)
memory_audit.register_gauge("runs_waiting_for_memory", lambda: len(RUN_BUDGET._queue))
memory_audit.register_gauge("explore_runs_computing",
                            lambda: sum(_SLOTS_PER_MODEL - slots._value for slots in list(_slots.values())))
memory_audit.register_gauge("page_runs", lambda: _PAGE_RUNS - _page_slots._value)


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


def _take(budget: RunBudget, nbytes: int) -> None:
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
    _take(budget, nbytes)
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


def page_run(page: str, settings, compute, nbytes: int = 0):
    """A finished run of another page (a gradient comparison, an authorization, a fusion ...) by its settings,
    shared by sessions and bounded by bytes (TSE_PAGES_CACHE_MB): counted entries of unknown size
    let a classroom's keys pile up gigabytes. Computed in a page slot holding nbytes of the run budget
    (page_run_bytes), outside any lock (it can draw progress)."""
    return _computed_once(_page_cache(), (page, settings), compute, lambda: page_slot(nbytes))


# Explore's runs of one model at once (TSE_CONCURRENT_RUNS, default 2: the cores). The server's Python runs one
# thread at a time and a model one forward at a time, so more at once only holds more transformed parameter sets
# and traces alive while they wait: 30 sessions opening one link held 30 of them. Per model, so a digits-vit run
# never queues behind a slower model's.
_SLOTS_PER_MODEL = limits.current().concurrent_runs
_slots: dict[str, threading.BoundedSemaphore] = {}
_slots_guard = threading.Lock()


def _slots_of(model_name: str) -> threading.BoundedSemaphore:
    with _slots_guard:
        return _slots.setdefault(model_name, threading.BoundedSemaphore(_SLOTS_PER_MODEL))


def _computed_once(cache: TensorCache, key, compute, slot=None):
    """The cached value, or compute it holding a run slot (by default one of its model's: key[0] names the
    model); a session that waited for a slot first looks again, since the one ahead of it may have computed the
    same thing (thirty students on one link)."""
    value = cache.get(key)
    if value is None:
        with slot() if slot else _slots_of(key[0]):
            value = cache.get(key)
            if value is None:
                value = compute()
                cache.put(key, value)
    return value


def exploration(model_name: str, dtype_name: str, device: str, input_id: str, _model, _inputs) -> Exploration:
    def build():
        model = model_on(model_name, dtype_name, device, _model)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in _inputs.items()}
        return Exploration(model, inputs, model_id=f"{model_name}/{device}")

    return _computed_once(_caches()["explorations"], (model_name, dtype_name, device, input_id), build)


@dataclass(frozen=True)
class ExploreRequest:
    """What an Explore run is asked for. `key` names its result in the results cache; mlp_layer, the block whose
    MLP neurons the page shows, is recorded in the same run but does not make another result."""

    model_name: str
    dtype_name: str
    device: str
    input_id: str
    keys: tuple[tuple[str, int], ...]  # (symmetry, key), sorted
    control: str | None = None
    mlp_layer: int | None = None

    @property
    def key(self) -> tuple:
        return (self.model_name, self.dtype_name, self.device, self.input_id, self.keys, self.control)


@contextmanager
def explore_run(request: ExploreRequest, explorer: Exploration, computing=nullcontext, budget: RunBudget | None = None):
    """The one way an Explore page gets its result. Holds the run budget's share first (the result's bytes, and twice
    the weights' while it computes: a transformed set and the graph's packed copy), fetches or computes the result,
    keeps only the result's bytes while the page draws it, and gives everything back on exit, however the run ends
    (a rerun or a stop raises through here). computing: a context to show while the model runs (a spinner)."""
    budget = budget or RUN_BUDGET
    compute_bytes = 0 if request.key in _caches()["results"] else explorer.compute_bytes
    _take(budget, explorer.trace_bytes + compute_bytes)
    held = explorer.trace_bytes + compute_bytes
    try:
        with computing():
            result = _computed_once(_caches()["results"], request.key,
                                    lambda: explorer.run(dict(request.keys), request.control, request.mlp_layer))
        budget.give(compute_bytes)
        held = explorer.trace_bytes
        yield result
    finally:
        budget.give(held)


def mlp_result(request: ExploreRequest, layer: int, explorer: Exploration, result: ExploreResult):
    """The MLP-neuron view of one block, cached beside the result it belongs to: a rerun that changes nothing
    else (a chart export, another weight matrix) runs no model. When the result recorded this block in its own
    run, no forward runs and no run slot is waited for."""
    from perm_core.mlp_view import mlp_view

    recorded = layer in result.mlp_inputs

    def build():
        params = None if recorded else explorer.params_for(result.scramble, dict(request.keys), request.control)[0]
        return mlp_view(explorer, result, params, layer)

    return _computed_once(_caches()["results"], (*request.key, "mlp", layer), build,
                          slot=nullcontext if recorded else None)
