"""The results runs share, process-wide and bounded by bytes (least recently used first out): Explore's original
traces and results (TSE_EXPLORATIONS_CACHE_MB, TSE_RESULTS_CACHE_MB) and the other pages' finished runs
(TSE_PAGES_CACHE_MB). A run computes at most once: a session that waited for a slot looks again first, since the
one ahead of it may have computed the same thing. Explore's one way in and out is explore(); the other pages' is
page_runs()."""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import streamlit as st
import torch

from perm_core.explore.exploration import Exploration, ExploreResult, head_grid
from perm_core.explore.page_data import PageChoice, block_views, page_data
from perm_core.fast import param_cache
from perm_core.fast.param_cache import TensorCache
from ui.runtime import budget, memory_audit, settings


@st.cache_resource(show_spinner=False, max_entries=2)
def model_on(model_name: str, dtype_name: str, device: str, _model):
    """CPU uses the shared model itself; another device gets its own copy (the shared one never moves)."""
    return _model if device == "cpu" else copy.deepcopy(_model).to(device)


@st.cache_resource(show_spinner=False)
def _caches() -> dict[str, TensorCache]:
    bounds = settings.current()
    caches = {"explorations": TensorCache(bounds.explorations_cache_bytes),
              "results": TensorCache(bounds.results_cache_bytes)}
    for name, cache in caches.items():
        memory_audit.register(name, cache)
    return caches


@st.cache_resource(show_spinner=False)
def _page_cache() -> TensorCache:
    """Apart from Explore's caches: a bad setting of one breaks only the pages that use it."""
    cache = TensorCache(settings.current().pages_cache_bytes)
    memory_audit.register("pages", cache)
    return cache


@dataclass(frozen=True)
class PageRequest:
    """A run of a page other than Explore (a gradient comparison, an authorization, a fusion ...): the page and
    its settings name the result, shared by every session; nbytes is what it holds of the run budget while it
    computes (page_run_bytes). in_slot: a long run (training, a check, gradients) waits for one of the page run
    slots (TSE_PAGE_RUNS); a short one (a few forwards of one model) runs at once, as Explore's do."""

    page: str
    settings: tuple
    nbytes: int = 0
    in_slot: bool = True


class PageRuns:
    """The runs one page run draws from, each fetched or computed once (bounded by bytes in the pages cache,
    TSE_PAGES_CACHE_MB: counted entries of unknown size let a classroom's keys pile up gigabytes). Each result's
    bytes are held from the run budget until the page has drawn it."""

    def __init__(self, run_budget: budget.RunBudget):
        self._budget = run_budget
        self.held = 0

    def finished(self, request: PageRequest):
        """The shared result if some session has computed it already (its bytes held as result's are), else
        None: a page can offer a long run on a button and still show at once what is there."""
        value = _page_cache().get((request.page, request.settings))
        if value is not None:
            nbytes = param_cache.tensor_bytes(value)
            budget.take(self._budget, nbytes, own=self.held)
            self.held += nbytes
        return value

    def result(self, request: PageRequest, compute):
        """The shared result, computed in a page slot holding request.nbytes of the run budget, outside any lock
        (compute can draw progress)."""
        value = _computed_once(_page_cache(), (request.page, request.settings), compute,
                               (lambda: budget.page_slot(request.nbytes, own=self.held)) if request.in_slot
                               else nullcontext)
        nbytes = param_cache.tensor_bytes(value)
        budget.take(self._budget, nbytes, own=self.held)
        self.held += nbytes
        return value


@contextmanager
def page_runs(run_budget: budget.RunBudget | None = None):
    """The one way a page other than Explore gets its results: `with page_runs() as shared_runs: main(shared_runs)`,
    the page asking shared_runs.result(PageRequest(...), compute); everything it held is given back on exit, however
    the run ends."""
    runs = PageRuns(run_budget or budget.RUN_BUDGET)
    try:
        yield runs
    finally:
        runs._budget.give(runs.held)


def _computed_once(cache: TensorCache, key, compute, slot=None):
    """The cached value, or compute it holding a run slot (by default one of its model's: key[0] names the
    model); a session that waited for a slot first looks again, since the one ahead of it may have computed the
    same thing (thirty students on one link)."""
    value = cache.get(key)
    if value is None:
        with slot() if slot else budget.model_slot(key[0]):
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
    """What an Explore page asks for. `key` names its result in the results cache; layer, head and weight (what
    the page shows of the result) make no other result: the layer's MLP activation is recorded in the same run."""

    model_name: str
    dtype_name: str
    device: str
    input_id: str
    keys: tuple[tuple[str, int], ...]  # (symmetry, key), sorted
    control: str | None = None
    layer: int | None = None
    head: int = 0
    weight: str | None = None

    @property
    def key(self) -> tuple:
        return (self.model_name, self.dtype_name, self.device, self.input_id, self.keys, self.control)


@contextmanager
def explore(request: ExploreRequest, explorer: Exploration, loaded, inputs: dict, computing=nullcontext,
            run_budget: budget.RunBudget | None = None):
    """The one way the Explore page gets what it draws (perm_core.explore.page_data.ExplorePageData), every tensor
    computed before the page draws its first chart. Holds the run budget's share first (the result's bytes, and
    twice the weights' while it computes: a transformed set and the graph's packed copy), fetches or computes the
    result, keeps only the result's bytes while the page draws, and gives everything back on exit, however the
    run ends (a rerun or a stop raises through here). computing: a context shown while the model runs."""
    def views(result, choice, mlp):
        return page_data(explorer, result, choice, mlp, inputs, loaded.labels, loaded.tokenizer, dict(request.keys),
                         request.control)

    with _held(request, explorer, views, computing, run_budget) as data:
        yield data


@contextmanager
def explore_block(request: ExploreRequest, explorer: Exploration, inputs: dict, computing=nullcontext,
                  run_budget: budget.RunBudget | None = None):
    """What a display change (the layer, the head, the weight matrix) redraws: the chosen block's views
    (perm_core.explore.page_data.BlockViews) of the request's result, held and given back as explore() does. The
    result is the cached one of the page's last run (computed again only if the cache has let it go since): every
    block's hidden states and attention maps are in its trace, so a step is a slice, not a run."""
    def views(result, choice, mlp):
        return block_views(explorer, result, choice, mlp, inputs, dict(request.keys), request.control)

    with _held(request, explorer, views, computing, run_budget) as data:
        yield data


@contextmanager
def explore_heads(request: ExploreRequest, explorer: Exploration, inputs: dict, computing=nullcontext,
                  run_budget: budget.RunBudget | None = None):
    """The layer x head grid (perm_core.explore.exploration.HeadGrid) of the request's result, held and given back
    as explore() does: what the head grid's own control (the followed head) redraws, from the cached result."""
    def views(result, choice, mlp):
        return head_grid(explorer, result)

    with _held(request, explorer, views, computing, run_budget) as data:
        yield data


@contextmanager
def _held(request: ExploreRequest, explorer: Exploration, views, computing, run_budget: budget.RunBudget | None):
    """views(result, choice, mlp) of the request's result, with the run budget's share held as explore() says."""
    run_budget = run_budget or budget.RUN_BUDGET
    compute_bytes = 0 if request.key in _caches()["results"] else explorer.compute_bytes
    budget.take(run_budget, explorer.trace_bytes + compute_bytes)
    held = explorer.trace_bytes + compute_bytes
    try:
        with computing():
            result = _computed_once(_caches()["results"], request.key,
                                    lambda: explorer.run(dict(request.keys), request.control, request.layer))
            run_budget.give(compute_bytes)  # the weights' share ends with the run; what the page shows is small
            held = explorer.trace_bytes
            layer = request.layer if request.layer is not None else explorer.geometry.n_layers - 1
            data = views(result, PageChoice(layer, request.head, request.weight),
                         _mlp_result(request, layer, explorer, result))
        yield data
    finally:
        run_budget.give(held)


def _mlp_result(request: ExploreRequest, layer: int, explorer: Exploration, result: ExploreResult):
    """The MLP-neuron view of one block (None for a block without an MLP), cached beside the result it belongs
    to: a rerun that changes nothing else (a chart export, another weight matrix) runs no model. When the result
    recorded this block in its own run, no forward runs and no run slot is waited for."""
    from perm_core.explore.mlp_view import mlp_view, output_projection

    try:
        output_projection(explorer, layer)
    except ValueError:
        return None
    recorded = layer in result.mlp_inputs

    def build():
        params = None if recorded else explorer.params_for(result.scramble, dict(request.keys), request.control)[0]
        return mlp_view(explorer, result, params, layer)

    return _computed_once(_caches()["results"], (*request.key, "mlp", layer), build,
                          slot=nullcontext if recorded else None)
