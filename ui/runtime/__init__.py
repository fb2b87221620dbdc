"""Every process-wide resource of the app, in one place; pages come in and out through the names below.

| resource                      | where                    | bound (settings, perm_core.limits)                |
|-------------------------------|--------------------------|---------------------------------------------------|
| shared models                 | models.shared_model      | loaded once per (name, dtype), at most 6          |
| one model load at a time      | models._LOADING          | a lock (transformers' lazy imports are not safe)  |
| transformed parameter sets    | perm_core.fast.param_cache    | TSE_PARAMS_CACHE_MB, and the loaded weights' size |
| Explore's traces and results  | runs._caches             | TSE_EXPLORATIONS_CACHE_MB, TSE_RESULTS_CACHE_MB   |
| other pages' finished runs    | runs._page_cache         | TSE_PAGES_CACHE_MB                                |
| runs' data alive at once      | budget.RUN_BUDGET        | TSE_RUN_BUDGET_MB, first come first served        |
| other pages' runs at once     | budget.page_slot         | TSE_PAGE_RUNS                                     |
| Explore runs of one model     | budget.model_slot        | TSE_CONCURRENT_RUNS                               |
| forwards on a shared model    | perm_core.run.stateless      | one lock per model                                |
| garbage collection            | housekeeping             | a full collection at most every 5 s               |
| freed memory to the system    | housekeeping, malloc     | malloc_trim at most every 1 s; 1 MiB mmap blocks  |
| memory and weights audits     | memory_audit, weights_audit | TSE_MEMORY_AUDIT_FILE, TSE_WEIGHTS_HASH_FILE   |

An Explore run comes in through `with explore(ExploreRequest(...), explorer, loaded, inputs) as data:`: its share
of the run budget is held while it computes and while the page draws every tensor it was handed, and given back on
exit; a display change (layer, head, weight) redraws its panel through `explore_block`, the same way, from
the same cached result. Another page's runs come in through `with page_runs() as shared_runs: main(shared_runs)`,
the page asking `shared_runs.result(PageRequest(...), compute)`, the same way.
"""

# Each name is imported from its module when first asked for (PEP 562): app.py's housekeeping and a page without a
# model (Home) come in here without importing torch or the library, which a just-started server's first run waits for.
_WHERE = {"CHECK_WEIGHT_COPIES": "budget", "page_run_bytes": "budget", "page_slot": "budget",
          "collect_garbage": "housekeeping", "give_back_freed_memory": "housekeeping",
          "long_lived_objects_frozen": "housekeeping", "shared_model": "models", "ExploreRequest": "runs",
          "PageRequest": "runs", "exploration": "runs", "explore": "runs", "explore_block": "runs",
          "explore_heads": "runs", "model_on": "runs", "page_runs": "runs"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'ui.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ui.runtime.{_WHERE[name]}"), name)
