"""Every process-wide resource of the app, in one place; pages come in and out through the names below.

| resource                      | where                    | bound (perm_core.limits)                          |
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
| a finished run's page data    | housekeeping             | globals over 256 KiB of tensors dropped           |
| memory and weights audits     | memory_audit, weights_audit | TSE_MEMORY_AUDIT_FILE, TSE_WEIGHTS_HASH_FILE   |

An Explore run comes in through `with explore_run(ExploreRequest(...), explorer) as result:` (its share of the run
budget held while it computes and while the page draws, given back on exit); another page's run through
`page_run(page, settings, compute, page_run_bytes(...))` (a slot and its share, then a shared cached result).
"""

from ui.runtime.budget import page_run_bytes, page_slot
from ui.runtime.housekeeping import collect_garbage, drop_page_data, give_back_freed_memory
from ui.runtime.models import long_lived_objects_frozen, shared_model
from ui.runtime.runs import ExploreRequest, exploration, explore_run, mlp_result, model_on, page_run

__all__ = ["ExploreRequest", "collect_garbage", "drop_page_data", "exploration", "explore_run",
           "give_back_freed_memory", "long_lived_objects_frozen", "mlp_result", "model_on", "page_run",
           "page_run_bytes", "page_slot", "shared_model"]
