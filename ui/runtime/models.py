"""The shared models: each loaded once per process, shared by every session and never mutated."""

from __future__ import annotations

import threading

import streamlit as st

from perm_core.fast import param_cache
from perm_core.models.registry import DTYPES, LoadedModel, load_model
from perm_core.run.malloc import give_freed_memory_back
from perm_core.run.stateless import own_dtype, own_parameters
from ui.runtime import memory_audit, weights_audit
from ui.runtime.housekeeping import keep_out_of_gc

# One load at a time in the process: transformers resolves its lazy imports without a lock, and two sessions
# loading different models at once failed with "cannot import name 'Dinov2Model' from 'transformers'" (found
# by benchmarks/classroom.py). Loads are CPU-bound, so serializing them costs the classroom nothing.
_LOADING = threading.Lock()
memory_audit.register("params", param_cache.TENSORS)
give_freed_memory_back()  # large blocks each in their own mapping, returned when freed
memory_audit.start()  # only with TSE_MEMORY_AUDIT_FILE set (benchmarks/classroom.py)


@st.cache_resource(show_spinner=False, max_entries=6)
def shared_model(name: str, dtype_name: str = "float32") -> LoadedModel:
    """Raises perm_core.models.registry.ModelLoadError with a one-line message; callers show it with st.error."""
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


# Bytes of each model loaded in this process, by (name, dtype): the parameter cache's bound follows their sum.
_loaded_bytes: dict[tuple[str, str], int] = {}


def loaded_weight_bytes(name: str, dtype_name: str = "float32") -> int:
    """The bytes of a model's weights as this process loaded it (0 if it has not loaded it)."""
    return _loaded_bytes.get((name, dtype_name), 0)
