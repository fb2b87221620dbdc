"""torch.func.functional_call made safe for a model that several threads (app sessions) share.

functional_call swaps the given tensors into the module, runs it, and puts back the tensors it found there.
Two threads on one model interleave: the second finds the first one's tensors and "restores" them, so the
shared model keeps a scrambled (or float64) copy for good. benchmarks/classroom.py found it: with ten browser
sessions per model, every shared model's weights hash changed and verdicts failed. One re-entrant lock per
model makes swap, run and restore one step; code that installs hooks on a shared model holds it too, so its
hooks never see another session's run, and so does code that reads a shared model's own parameters (or their
dtype), which mid-swap would be another session's scrambled or float64 copies.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch.func import functional_call as _functional_call

_locks: weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def model_lock(model: torch.nn.Module) -> threading.RLock:
    with _guard:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = threading.RLock()
        return lock


def functional_call(module: torch.nn.Module, parameters_and_buffers, args=None, kwargs=None, *,
                    tie_weights: bool = True, strict: bool = False):
    with model_lock(module):
        return _functional_call(module, parameters_and_buffers, args, kwargs, tie_weights=tie_weights, strict=strict)


def own_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's own named parameters, never another session's tensors swapped in for a call."""
    with model_lock(model):
        return dict(model.named_parameters())


_dtypes: weakref.WeakKeyDictionary[torch.nn.Module, torch.dtype] = weakref.WeakKeyDictionary()


def own_dtype(model: torch.nn.Module) -> torch.dtype:
    """Read under the model's lock once, then remembered: a shared model keeps the dtype it was loaded in, and
    every rerun of a page asks (the sidebar's image input), where waiting for the lock meant waiting for
    whichever session's forward held it, seconds under a classroom's load."""
    dtype = _dtypes.get(model)
    if dtype is None:
        with model_lock(model):
            dtype = _dtypes[model] = next(model.parameters()).dtype
    return dtype
