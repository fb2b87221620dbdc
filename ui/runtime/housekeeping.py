"""The process's housekeeping: garbage collection and giving freed memory back to the system, each at most every
few seconds process-wide, and dropping a finished page run's heavy data."""

from __future__ import annotations

import gc
import sys
import threading
import time

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


def keep_out_of_gc() -> None:
    """Move every object alive now (modules, models, tokenizers: the process's long-lived objects) out of the
    garbage collector's sight. A full collection (collect_garbage; Streamlit's after every script run before
    it) walked some 450,000 long-lived objects in 0.2-0.35 s, under the GIL, so a classroom's sessions queued
    behind it. Frozen objects are still freed by reference counting."""
    gc.collect()
    gc.freeze()


_modules_when_frozen = [0]


def long_lived_objects_frozen() -> bool:
    """After each run that imported modules (the process's first run; the first visit to a page that imports torch
    and the library, which Home does not): every object alive then is long-lived. True if it froze them."""
    with _rate_guard:
        if len(sys.modules) <= _modules_when_frozen[0]:
            return False
        _modules_when_frozen[0] = len(sys.modules)
    keep_out_of_gc()
    return True
