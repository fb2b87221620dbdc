"""Process-wide cached resources: each model is loaded once and shared by every session, never mutated."""

from __future__ import annotations

import streamlit as st
import torch

from perm_core.zoo import LoadedModel, load_model

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@st.cache_resource(show_spinner=False, max_entries=6)
def shared_model(name: str, dtype_name: str = "float32") -> LoadedModel:
    """Raises perm_core.zoo.ModelLoadError with a one-line message; callers show it with st.error."""
    with st.spinner(f"Loading {name} ({dtype_name}) ..."):
        progress = st.progress(0.0, text=f"Loading {name}")
        loaded = load_model(name, dtype=DTYPES[dtype_name],
                            progress=lambda fraction, message: progress.progress(min(max(fraction, 0.0), 1.0),
                                                                                 text=message))
        progress.empty()
    return loaded
