"""Process-wide cached resources: each model is loaded once and shared by every session, never mutated."""

from __future__ import annotations

import gc
import threading
import time

import streamlit as st

from perm_core import malloc, param_cache
from perm_core.malloc import give_freed_memory_back
from perm_core.stateless import own_dtype, own_parameters
from perm_core.zoo import DTYPES, LoadedModel, load_model
from ui import memory_audit, weights_audit

# One load at a time in the process: transformers resolves its lazy imports without a lock, and two sessions
# loading different models at once failed with "cannot import name 'Dinov2Model' from 'transformers'" (found
# by benchmarks/classroom.py). Loads are CPU-bound, so serializing them costs the classroom nothing.
_LOADING = threading.Lock()
memory_audit.register("params", param_cache.TENSORS)
give_freed_memory_back()  # large blocks each in their own mapping, returned when freed
memory_audit.start()  # only with TSE_MEMORY_AUDIT_FILE set (benchmarks/classroom.py)


@st.cache_resource(show_spinner=False, max_entries=6)
def shared_model(name: str, dtype_name: str = "float32") -> LoadedModel:
    """Raises perm_core.zoo.ModelLoadError with a one-line message; callers show it with st.error."""
    with st.spinner(f"Loading {name} ({dtype_name}) ..."):
        progress = st.progress(0.0, text=f"Loading {name}")
        with _LOADING:
            loaded = load_model(name, dtype=DTYPES[dtype_name],
                                progress=lambda fraction, message: progress.progress(min(max(fraction, 0.0), 1.0),
                                                                                     text=message))
        progress.empty()
    weights_audit.track(name, dtype_name, loaded.model)  # only with TSE_WEIGHTS_HASH_FILE set
    with _LOADING:
        weights = own_parameters(loaded.model).values()
        own_dtype(loaded.model)  # remembered from now on, so no rerun waits for a forward to read it
        _loaded_bytes[(name, dtype_name)] = sum(p.numel() * p.element_size() for p in weights)
        param_cache.fit_bound_to_models(sum(_loaded_bytes.values()))
        keep_out_of_gc()
    return loaded


def keep_out_of_gc() -> None:
    """Move every object alive now (modules, models, tokenizers: the process's long-lived objects) out of the
    garbage collector's sight. A full collection (collect_garbage; Streamlit's after every script run before
    it) walked some 450,000 long-lived objects in 0.2-0.35 s, under the GIL, so a classroom's sessions queued
    behind it. Frozen objects are still freed by reference counting."""
    gc.collect()
    gc.freeze()


@st.cache_resource(show_spinner=False)
def long_lived_objects_frozen() -> bool:
    """Once per process, after the first run has imported the app's modules."""
    keep_out_of_gc()
    return True


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


# Bytes of each model loaded in this process, by (name, dtype): the parameter cache's bound follows their sum.
_loaded_bytes: dict[tuple[str, str], int] = {}


def loaded_weight_bytes(name: str, dtype_name: str = "float32") -> int:
    """The bytes of a model's weights as this process loaded it (0 if it has not loaded it)."""
    return _loaded_bytes.get((name, dtype_name), 0)


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


def use_navigation_registry() -> None:
    """Make Streamlit run app.py (st.navigation) on every run, even when a page's URL is opened first.

    Streamlit treats an app with a pages/ folder as an old-style multipage app until app.py has run
    once in the process: opening /explore first would run pages/explore.py alone, without the shared
    sidebar and with a menu of file names. The flag is process-wide and st.navigation clears it too.
    """
    from streamlit.runtime.pages_manager import PagesManager

    PagesManager.uses_pages_directory = False


use_navigation_registry()


def key_or_stop(text) -> int:
    """A validated key; otherwise the key's own message as st.error, and this page stops here."""
    from perm_core.keys import InvalidKeyError, validate_key

    try:
        return validate_key(text)
    except InvalidKeyError as error:
        st.error(str(error))
        st.stop()
