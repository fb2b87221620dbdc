"""Transformed parameters, cached per tensor and bounded by bytes, so a key change rebuilds only what it moves.

A parameter's transformed value depends only on the keys of the symmetries that act on its axes'
roles: the MLP key never touches an attention weight, the tokens key only a learned position table.
So each transformed tensor is cached under (model, dtype, parameter, the keys that reach it). Changing
one key then recomputes just the tensors that key reaches and shares every other tensor; a fresh set of
keys costs one pass over the weights, as before.

The cache holds at most CACHE_BYTES of tensors (env TSE_PARAMS_CACHE_MB, default 1024 MiB), evicting
the least recently used; one tensor larger than the bound is computed and not kept.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import torch

from perm_core.spec import Concat, Scramble, apply_axes

CACHE_BYTES = int(float(os.environ.get("TSE_PARAMS_CACHE_MB", "1024")) * 2**20)

# Which symmetries act on a space of each role (see perm_core.symmetries).
SYMMETRIES_OF_ROLE = {
    "positions": ("tokens",),
    "resid": ("channels",),
    "q": ("heads", "head_channels", "rotation"),
    "k": ("heads", "head_channels", "rotation"),
    "v": ("heads", "head_channels", "rotation"),
    "o": ("heads", "head_channels", "rotation"),
    "heads": ("heads",),
    "mlp": ("mlp",),
}


def roles_of(axes) -> set[str]:
    found = set()
    for role in axes if isinstance(axes, tuple) else ():
        if role is None:
            continue
        if isinstance(role, Concat):
            found.update(part for part, _ in role.parts)
        else:
            found.add(role[0] if isinstance(role, tuple) else role)
    return found


class TensorCache:
    """A thread-safe LRU of tensors bounded by their total bytes."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = 0

    def get(self, key):
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        with self._lock:
            self.misses += 1
            if size > self.max_bytes or key in self._items:
                return
            self._items[key] = tensor
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self.bytes -= evicted.numel() * evicted.element_size()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0


TENSORS = TensorCache()


def transformed_params(subject, scramble: Scramble, keys_by_symmetry: dict[str, int], scope: tuple,
                       cache: TensorCache = TENSORS) -> dict[str, torch.Tensor]:
    """The scrambled parameter dict, tensor by tensor from the cache where the keys that reach it match.

    scope: what else identifies the model's weights and this element (model id, dtype, n_tokens, control).
    Tensors nothing acts on are the model's own, shared and never copied.
    """
    params = {}
    for name, tensor in subject.params.items():
        claim = subject.claims[name]
        roles = roles_of(claim.rule.axes)
        reaching = tuple(sorted((s, keys_by_symmetry[s]) for role in roles
                                for s in SYMMETRIES_OF_ROLE.get(role, ()) if s in keys_by_symmetry))
        if not reaching or claim.rule.tag in scramble.skip_tags:
            params[name] = tensor
            continue
        key = (scope, name, reaching)
        cached = cache.get(key)
        if cached is None:
            cached = apply_axes(tensor, claim.rule.axes, scramble, claim.layer)
            cache.put(key, cached)
        params[name] = cached
    return params
