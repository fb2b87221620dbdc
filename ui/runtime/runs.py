"""The results runs share, process-wide and bounded by bytes (least recently used first out): Explore's original
traces and results (TSE_EXPLORATIONS_CACHE_MB, TSE_RESULTS_CACHE_MB) and the other pages' finished runs
(TSE_PAGES_CACHE_MB). A run computes at most once: a session that waited for a slot looks again first, since the
one ahead of it may have computed the same thing. Explore's one way in and out is explore_run."""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import streamlit as st
import torch

from perm_core import limits
from perm_core.explore.exploration import Exploration, ExploreResult
from perm_core.fast.param_cache import TensorCache
from ui.runtime import budget, memory_audit


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


def page_run(page: str, settings, compute, nbytes: int = 0):
    """A finished run of another page (a gradient comparison, an authorization, a fusion ...) by its settings,
    shared by sessions and bounded by bytes (TSE_PAGES_CACHE_MB): counted entries of unknown size
    let a classroom's keys pile up gigabytes. Computed in a page slot holding nbytes of the run budget
    (page_run_bytes), outside any lock (it can draw progress)."""
    return _computed_once(_page_cache(), (page, settings), compute, lambda: budget.page_slot(nbytes))


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
def explore_run(request: ExploreRequest, explorer: Exploration, computing=nullcontext,
                run_budget: budget.RunBudget | None = None):
    """The one way an Explore page gets its result. Holds the run budget's share first (the result's bytes, and twice
    the weights' while it computes: a transformed set and the graph's packed copy), fetches or computes the result,
    keeps only the result's bytes while the page draws it, and gives everything back on exit, however the run ends
    (a rerun or a stop raises through here). computing: a context to show while the model runs (a spinner)."""
    run_budget = run_budget or budget.RUN_BUDGET
    compute_bytes = 0 if request.key in _caches()["results"] else explorer.compute_bytes
    budget.take(run_budget, explorer.trace_bytes + compute_bytes)
    held = explorer.trace_bytes + compute_bytes
    try:
        with computing():
            result = _computed_once(_caches()["results"], request.key,
                                    lambda: explorer.run(dict(request.keys), request.control, request.mlp_layer))
        run_budget.give(compute_bytes)
        held = explorer.trace_bytes
        yield result
    finally:
        run_budget.give(held)


def mlp_result(request: ExploreRequest, layer: int, explorer: Exploration, result: ExploreResult):
    """The MLP-neuron view of one block, cached beside the result it belongs to: a rerun that changes nothing
    else (a chart export, another weight matrix) runs no model. When the result recorded this block in its own
    run, no forward runs and no run slot is waited for."""
    from perm_core.explore.mlp_view import mlp_view

    recorded = layer in result.mlp_inputs

    def build():
        params = None if recorded else explorer.params_for(result.scramble, dict(request.keys), request.control)[0]
        return mlp_view(explorer, result, params, layer)

    return _computed_once(_caches()["results"], (*request.key, "mlp", layer), build,
                          slot=nullcontext if recorded else None)
