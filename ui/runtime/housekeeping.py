"""The process's housekeeping: garbage collection and giving freed memory back to the system, each at most every
few seconds process-wide, and dropping a finished page run's heavy data."""

from __future__ import annotations

import gc
import threading
import time

from perm_core.fast import param_cache
from perm_core.run import malloc

_last_run: dict[str, float] = {}
_rate_guard = threading.Lock()


def _due(task: str, min_interval: float) -> bool:
    """True at most once per `min_interval` seconds per task, process-wide (every session's runs ask)."""
    now = time.monotonic()
    with _rate_guard:
        if now - _last_run.get(task, float("-inf")) < min_interval:
            return False
        _last_run[task] = now
        return True


def give_back_freed_memory(min_interval: float = 1.0) -> bool:
    """Return the pages glibc holds after torch freed them (malloc_trim), at most once per `min_interval`
    seconds process-wide; True if it ran. glibc keeps freed memory for reuse, scattered among live chunks and
    per-thread arenas: 30 sessions' runs left a server at 3.2 GiB resident whose live data was 1.1 GiB. A trim
    costs about 5 ms and the next run faults its pages in again (about 9% of a forward)."""
    if not malloc.CAN_TRIM or not _due("trim", min_interval):  # without glibc there is nothing to give back
        return False
    return malloc.trim()


def collect_garbage(min_interval: float = 5.0) -> bool:
    """A full garbage collection at most once per `min_interval` seconds process-wide; True if it ran.
    Streamlit's own, after every script run, is off (runner.postScriptGC in .streamlit/config.toml): under a
    classroom's load it walked every session's objects each time, and took 43% of the server's GIL time
    (py-spy --gil, 30 sessions). Reference counting frees all but cycles, and this frees those."""
    if not _due("collect", min_interval):
        return False
    gc.collect()
    return True


# A page's data outlives its run unless dropped: Streamlit keeps a session's widgets (their callbacks and format
# functions) from one run to the next, and each function defined in a page holds the page's globals. Thirty
# sessions kept thirty Explore results alive (1.0 GB of traces) past the results cache's bound.
PAGE_DATA_KEPT_BYTES = 1 << 18
_OWN_PACKAGES = ("perm_core", "ui")


def _may_hold_tensors(value) -> bool:
    return (isinstance(value, (dict, list, tuple)) or type(value).__name__ in ("Tensor", "ndarray")
            or type(value).__module__.split(".")[0] in _OWN_PACKAGES)


def drop_page_data(page_globals: dict) -> list[str]:
    """Delete the globals of a finished page run that hold more than PAGE_DATA_KEPT_BYTES of tensors or arrays
    (results, reports, traces); returns their names. What the caches hold stays there; what only this page held
    is freed now instead of at the session's next run. Light globals (labels, options, settings) stay for the
    callbacks and format functions Streamlit may still call."""
    dropped = [name for name, value in page_globals.items() if not name.startswith("__") and
               _may_hold_tensors(value) and param_cache.holds_more_than(value, PAGE_DATA_KEPT_BYTES)]
    for name in dropped:
        del page_globals[name]
    return dropped
