"""Process-wide caches for the Explore page's compute (shared by all sessions).

The original trace is cached per (model, dtype, device, input); a result per (that, keys, control),
so moving a layer slider or switching pages re-runs no model. Parameter sets are cached inside
perm_core.explore (bounded LRU).
"""

from __future__ import annotations

import copy

import streamlit as st
import torch

from perm_core.explore import Exploration, ExploreResult


@st.cache_resource(show_spinner=False, max_entries=2)
def model_on(model_name: str, dtype_name: str, device: str, _model):
    """CPU uses the shared model itself; another device gets its own copy (the shared one never moves)."""
    return _model if device == "cpu" else copy.deepcopy(_model).to(device)


@st.cache_resource(show_spinner=False, max_entries=8)
def exploration(model_name: str, dtype_name: str, device: str, input_id: str, _model, _inputs) -> Exploration:
    model = model_on(model_name, dtype_name, device, _model)
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in _inputs.items()}
    return Exploration(model, inputs, model_id=f"{model_name}/{device}")


@st.cache_resource(show_spinner=False, max_entries=16)
def explore_result(model_name: str, dtype_name: str, device: str, input_id: str, keys: tuple, control: str | None,
                   _exploration: Exploration) -> ExploreResult:
    return _exploration.run(dict(keys), control)
