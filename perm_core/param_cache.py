"""Transformed parameters, cached per tensor and bounded by bytes, so a key change rebuilds only what it moves.

A parameter's transformed value depends only on the keys of the symmetries that act on its axes'
roles: the MLP key never touches an attention weight, the tokens key only a learned position table.
So each transformed tensor is cached under (model, dtype, parameter, the keys that reach it). Changing
one key then recomputes just the tensors that key reaches and shares every other tensor; a fresh set of
keys costs one pass over the weights, as before.

The cache holds at most CACHE_BYTES of tensors (env TSE_PARAMS_CACHE_MB, default 640 MiB; the app lowers it to
the bytes of the models it has loaded, at least 128 MiB: fit_bound_to_models), evicting
the least recently used; one tensor larger than the bound is computed and not kept. That bound includes
the residual-first intermediates (see _transform): a weight permuted on its residual axes only, kept under
the channels key, from which a change of any other key re-gathers just its own axes. They are kept only for a
model whose weights fit the bound twice over (dinov2-s, MiniLM and the digits ViTs at the default bound; not the
110M-parameter base models: TSE_PARAMS_CACHE_MB=1024 buys them faster single-key changes for 384 MiB more).
The default keeps a server with every zoo model loaded within 2x their float32 weights + 1 GiB
(benchmarks/memory_tour.py).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import torch

from perm_core.spec import Concat, Scramble, apply_axes
from perm_core.transforms import Permutation

CACHE_BYTES = int(float(os.environ.get("TSE_PARAMS_CACHE_MB", "640")) * 2**20)

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


def tensor_bytes(value, seen: set | None = None) -> int:
    """The bytes of every tensor reachable from value (dicts, sequences, dataclasses, objects), each storage
    counted once: what keeping value alive costs. A model's parameters belong to the model (loaded once per
    process by the zoo cache), so they are not counted."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, torch.nn.Parameter):
        return 0
    if type(value).__name__ == "ndarray":  # numpy (images, curves), counted like a tensor
        return value.nbytes if value.base is None else tensor_bytes(value.base, seen)
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(value, dict):
        return sum(tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(tensor_bytes(v, seen) for v in value)
    if isinstance(value, torch.nn.Module):
        return 0  # models are shared by the zoo cache, never owned by a cached result
    if hasattr(value, "__dict__"):
        return tensor_bytes(vars(value), seen)
    return 0


class TensorCache:
    """A thread-safe LRU bounded by the total bytes of the tensors it holds (tensors, or any objects holding
    tensors: their size is measured with tensor_bytes)."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._sizes: dict = {}
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key):
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key, value) -> None:
        size = value.numel() * value.element_size() if isinstance(value, torch.Tensor) else tensor_bytes(value)
        with self._lock:
            self.misses += 1
            if size > self.max_bytes or key in self._items:
                return
            self._items[key] = value
            self._sizes[key] = size
            self.bytes += size
            while self.bytes > self.max_bytes:
                evicted, _ = self._items.popitem(last=False)
                self.bytes -= self._sizes.pop(evicted)

    def make_room(self, incoming: int) -> None:
        """Evict least recently used entries until `incoming` more bytes fit the bound (all, if they never fit):
        tensors about to be built count against the bound while they are built, not only once they are kept."""
        with self._lock:
            while self._items and self.bytes + incoming > self.max_bytes:
                evicted, _ = self._items.popitem(last=False)
                self.bytes -= self._sizes.pop(evicted)

    def get_or_compute(self, key, compute):
        value = self.get(key)
        if value is None:
            value = compute()
            self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._sizes.clear()
            self.bytes = 0


TENSORS = TensorCache()
# A server with only small models loaded gets a smaller bound: the loaded weights' bytes, at least this much.
MIN_CACHE_BYTES = 128 * 2**20


def fit_bound_to_models(loaded_weight_bytes: int, cache: TensorCache = TENSORS) -> int:
    """Bound the cache by the weights a process has loaded (at least MIN_CACHE_BYTES, at most CACHE_BYTES): the
    memory goal is 2x the loaded weights + 1 GiB, and a classroom on three small models cannot spend 640 MiB on
    other sessions' transformed copies. Returns the bound; entries over it go at the next put."""
    cache.max_bytes = min(CACHE_BYTES, max(MIN_CACHE_BYTES, loaded_weight_bytes))
    cache.make_room(0)
    return cache.max_bytes


def transformed_params(subject, scramble: Scramble, keys_by_symmetry: dict[str, int], scope: tuple,
                       cache: TensorCache = TENSORS, names=None) -> dict[str, torch.Tensor]:
    """The scrambled parameter dict, tensor by tensor from the cache where the keys that reach it match.

    scope: what else identifies the model's weights and this element (model id, dtype, n_tokens, control).
    Tensors nothing acts on are the model's own, shared and never copied. names: only these parameters (a page
    that shows one weight matrix), each the same tensor the whole dict would hold.
    """
    params, missing, set_bytes = {}, {}, 0
    # Intermediates pay only where a transformed model and its intermediates take at most half the bound; beyond
    # it they evict the transformed tensors a repeated key needs (and every other model's): dinov2-s's 165 MiB
    # filled a classroom's 170 MiB bound alone, so each run rebuilt what the one before had kept.
    weight_bytes = sum(t.numel() * t.element_size() for t in subject.params.values())
    keep_intermediates = 4 * weight_bytes <= cache.max_bytes
    for name, tensor in subject.params.items():
        claim = subject.claims[name]
        roles = roles_of(claim.rule.axes)
        reaching = tuple(sorted((s, keys_by_symmetry[s]) for role in roles
                                for s in SYMMETRIES_OF_ROLE.get(role, ()) if s in keys_by_symmetry))
        moved = reaching and claim.rule.tag not in scramble.skip_tags
        set_bytes += tensor.numel() * tensor.element_size() if moved else 0
        if names is not None and name not in names:
            continue
        if not moved:
            params[name] = tensor
            continue
        key = (scope, name, reaching)
        params[name] = cache.get(key)
        if params[name] is None:
            missing[name] = key
    # What is about to be built counts against the bound now: a gemma3-270m set (1 GiB) is not built on top of
    # a full cache of other models' tensors.
    cache.make_room(sum(subject.params[n].numel() * subject.params[n].element_size() for n in missing))
    # A set larger than the bound is never kept whole, and a kept part saves little: the next element needs the
    # rest, and gemma3-270m's 1.07 GiB set left 383 MiB of fragments beside the next session's whole new set.
    keep = set_bytes <= cache.max_bytes
    for name, key in missing.items():
        tensor, claim = subject.params[name], subject.claims[name]
        params[name] = (_transform(tensor, claim, scramble, keys_by_symmetry, (scope, name), cache)
                        if keep_intermediates else apply_axes(tensor, claim.rule.axes, scramble, claim.layer))
        if keep:
            cache.put(key, params[name])
    return params


def _transform(tensor, claim, scramble: Scramble, keys_by_symmetry: dict[str, int], where: tuple,
               cache: TensorCache) -> torch.Tensor:
    """The residual-stream axes first, kept under the channels key alone, then the other axes: changing the MLP
    or a head key re-gathers only its own axes. Gathers commute exactly, so this is done only where every axis
    is permuted (a rotation's arithmetic stays in the engine's order); the result is contiguous, as
    index_select's is."""
    axes = claim.rule.axes
    if not isinstance(axes, tuple) or "channels" not in keys_by_symmetry or "resid" not in axes:
        return apply_axes(tensor, axes, scramble, claim.layer)
    others = tuple(None if role == "resid" else role for role in axes)
    if not roles_of(others) or not _only_permutations(tensor, axes, scramble, claim.layer):
        return apply_axes(tensor, axes, scramble, claim.layer)
    resid_only = tuple(role if role == "resid" else None for role in axes)
    base = cache.get_or_compute((*where, "resid", keys_by_symmetry["channels"]),
                                lambda: apply_axes(tensor, resid_only, scramble, claim.layer))
    return apply_axes(base, others, scramble, claim.layer)


def _only_permutations(tensor, axes, scramble: Scramble, layer) -> bool:
    for role in axes:
        for part in (p for p, _ in role.parts) if isinstance(role, Concat) else (role,) if role else ():
            name, at = part if isinstance(part, tuple) else (part, layer)
            if not all(isinstance(t, Permutation) for t in scramble.chain(name, at)):
                return False
    return True
