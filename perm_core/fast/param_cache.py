"""Transformed parameters, cached per tensor and bounded by bytes, so a key change rebuilds only what it moves.

A parameter's transformed value depends only on the keys of the symmetries that act on its axes'
roles: the MLP key never touches an attention weight, the tokens key only a learned position table.
So each transformed tensor is cached under (model, dtype, parameter, the keys that reach it). Changing
one key then recomputes just the tensors that key reaches and shares every other tensor; a fresh set of
keys costs one pass over the weights, as before.

A changed key's tensor that is a pure gather of its original (no rotation acts on it) is derived from the kept
tensor of the previous element, gathered along only the axes whose index changed: the MLP key re-gathers an MLP
weight along its MLP axis alone, one pass instead of two, and the values are the very same (a gather of a gather
is a gather). Nothing extra is kept for it (the residual-first intermediates this replaced took up to a model's
weights more).

The cache holds at most CACHE_BYTES of tensors (env TSE_PARAMS_CACHE_MB, default 640 MiB; the app lowers it to
the bytes of the models it has loaded, at least 128 MiB: fit_bound_to_models), evicting the least recently used;
one tensor larger than the bound is computed and not kept, and of a model's set larger than the bound only the
smaller tensors that fit are kept (the largest, a vocabulary table, are rebuilt per run). The default is meant to
keep a server with every zoo model loaded within 2x their float32 weights + 1 GiB (benchmarks/memory_tour.py
measures it).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

import torch

from perm_core import limits
from perm_core.engine.spec import Concat, Gain, Merged, Scramble, apply_axes, parts_of, shifts
from perm_core.engine.transforms import Permutation, composed
from perm_core.fast.batched_gathers import gather_many, steps_of

CACHE_BYTES = limits.current().params_cache_bytes

# Kept siblings a missing tensor is compared with (the most recent first; each comparison is torch calls on the key
# change's path): a classroom's sessions keep dozens of one weight's transformed copies under their own keys.
KIN_LOOKED_AT = 4

# Which symmetries act on a space of each role (see perm_core.engine.symmetries).
SYMMETRIES_OF_ROLE = {
    "positions": ("tokens",),
    "resid": ("channels",),
    "q": ("heads", "head_channels", "rotation"),
    "k": ("heads", "head_channels", "rotation"),
    "v": ("heads", "head_channels", "rotation"),
    "o": ("heads", "head_channels", "rotation"),
    "heads": ("heads",),
    "mlp": ("mlp",),
    "experts": ("experts",),
    "expert_mlp": ("experts", "mlp"),
    "expert_gate_up": (),  # only a negative control transforms it (Concat.whole)
    "router_shift": ("router_shift",),  # a rule's `shift`: added to its values (a router's)
}


def roles_of(axes) -> set[str]:
    found = set()
    for role in axes if isinstance(axes, tuple) else ():
        found.update(part[0] if isinstance(part, tuple) else part for part in parts_of(role))
    return found


def tensor_bytes(value, seen: set | None = None) -> int:
    """The bytes of every tensor reachable from value (dicts, sequences, dataclasses, objects), each storage
    counted once: what keeping value alive costs. A model's parameters belong to the model (loaded once per
    process by the zoo cache), so they are not counted."""
    return sum(_storage_sizes(value, set() if seen is None else seen))


def holds_more_than(value, limit: int) -> bool:
    """Whether the tensors reachable from value (as tensor_bytes counts them) hold more than `limit` bytes. The walk
    stops once they do: each tensor looked at is a few torch calls, and an Explore result holds hundreds."""
    total = 0
    for size in _storage_sizes(value, set()):
        total += size
        if total > limit:
            return True
    return False


def _storage_sizes(value, seen: set):
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.nn.Parameter):
        return
    if type(value).__name__ == "ndarray":  # numpy (images, curves), counted like a tensor
        if value.base is None:
            yield value.nbytes
        else:
            yield from _storage_sizes(value.base, seen)
    elif isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            yield storage.nbytes()
    elif isinstance(value, dict):
        for item in value.values():
            yield from _storage_sizes(item, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _storage_sizes(item, seen)
    elif isinstance(value, torch.nn.Module):
        return  # models are shared by the zoo cache, never owned by a cached result
    elif hasattr(value, "__dict__"):
        yield from _storage_sizes(vars(value), seen)


class TensorCache:
    """A thread-safe LRU bounded by the total bytes of the tensors it holds (tensors, or any objects holding
    tensors: their size is measured with tensor_bytes)."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._sizes: dict = {}
        # Kin: entries put with a group (one parameter of one model) and the gather indices that made them from
        # the original, so that a sibling can be derived from a kept one (see transformed_params).
        self._kin: dict = {}  # group -> {key: indices}, most recent last
        self._group_of: dict = {}  # key -> group
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        """Whether key is kept now (not a use: it neither moves it nor counts a hit)."""
        with self._lock:
            return key in self._items

    def get(self, key):
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key, value, group=None, indices=None) -> None:
        """group, indices: value is the original of `group` gathered by `indices` (see kin)."""
        size = _bytes(value) if isinstance(value, torch.Tensor) else tensor_bytes(value)
        with self._lock:
            self.misses += 1
            if size > self.max_bytes or key in self._items:
                return
            self._items[key] = value
            self._sizes[key] = size
            self.bytes += size
            if group is not None and indices is not None:
                self._kin.setdefault(group, {})[key] = indices
                self._group_of[key] = group
            self._evict_over(0)

    def kin(self, group, most: int) -> list[tuple]:
        """(value, indices) of the `most` entries of `group` put last, most recent first."""
        with self._lock:
            return [(self._items[key], indices)
                    for key, indices in itertools.islice(reversed(self._kin.get(group, {}).items()), most)]

    def _evict_over(self, incoming: int) -> None:
        while self._items and self.bytes + incoming > self.max_bytes:
            evicted, _ = self._items.popitem(last=False)
            self.bytes -= self._sizes.pop(evicted)
            group = self._group_of.pop(evicted, None)
            if group is not None:
                del self._kin[group][evicted]
                if not self._kin[group]:
                    del self._kin[group]

    def make_room(self, incoming: int) -> None:
        """Evict least recently used entries until `incoming` more bytes fit the bound (all, if they never fit):
        tensors about to be built count against the bound while they are built, not only once they are kept."""
        with self._lock:
            self._evict_over(incoming)

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
            self._kin.clear()
            self._group_of.clear()
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
    that shows one weight matrix), each the same tensor the whole dict would hold. A missing tensor that is a
    pure gather of its original is derived, where it can be, from a kept one of the same parameter
    (`_derive`): a changed MLP key re-gathers the MLP weights along their MLP axis alone.
    """
    params, missing, moved_keys = {}, {}, {}
    for name, tensor in subject.params.items():
        claim = subject.claims[name]
        roles = roles_of(claim.rule.axes) | ({claim.rule.shift} if claim.rule.shift else set())
        reaching = tuple(sorted((s, keys_by_symmetry[s]) for role in roles
                                for s in SYMMETRIES_OF_ROLE.get(role, ()) if s in keys_by_symmetry))
        if reaching and claim.rule.tag not in scramble.skip_tags:
            moved_keys[name] = (scope, name, reaching)
        if names is not None and name not in names:
            continue
        if name not in moved_keys:
            params[name] = tensor
            continue
        params[name] = cache.get(moved_keys[name])
        if params[name] is None:
            missing[name] = moved_keys[name]
    # What is about to be built counts against the bound now: a gemma3-270m set (1 GiB) is not built on top of
    # a full cache of other models' tensors (this run holds the tensors it found, evicted or not).
    cache.make_room(sum(_bytes(subject.params[n]) for n in missing))
    kept = _kept_part(subject, moved_keys, cache.max_bytes)
    gathers: dict[str, tuple] = {}  # name -> (source, steps, indices): pure gathers, made in one batch
    for name in missing:
        tensor, claim = subject.params[name], subject.claims[name]
        indices = _gathered_by(claim, scramble, tuple(tensor.shape))
        if indices is None:  # a rotation acts on some axis, or a translation adds: arithmetic, not a gather
            params[name] = apply_axes(tensor, claim.rule.axes, scramble, claim.layer)
            for translation in shifts(claim, scramble):  # after the axes, as spec.transform_param adds them
                params[name] = translation.add_to(params[name])
            continue
        source, steps = _derive(cache.kin((scope, name), KIN_LOOKED_AT), indices) or (tensor, steps_of(indices))
        gathers[name] = (source, steps, indices)
    made = gather_many([source for source, _, _ in gathers.values()], [steps for _, steps, _ in gathers.values()])
    params.update(zip(gathers, made, strict=True))
    for name, key in missing.items():
        if name in kept:
            indices = gathers[name][2] if name in gathers else None
            cache.put(key, params[name], group=(scope, name), indices=indices)
    if len(kept) < len(moved_keys):  # what make_room let go of the kept part goes back
        for name in kept.keys() & params.keys() - missing.keys():
            claim = subject.claims[name]
            indices = _gathered_by(claim, scramble, tuple(params[name].shape))
            cache.put(kept[name], params[name], group=(scope, name), indices=indices)
    return params


def _gathered_by(claim, scramble: Scramble, shape: tuple) -> tuple | None:
    """gather_indices of a parameter, None where a translation is added to it too (not a pure gather)."""
    return None if shifts(claim, scramble) else gather_indices(claim.rule.axes, scramble, claim.layer, shape)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _kept_part(subject, moved_keys: dict, bound: int) -> dict:
    """The transformed tensors to keep: all of a set within the bound; of a larger set (gemma3-270m's 1.07 GiB
    over 640 MiB) the smaller tensors that fit, the largest left out. Its largest are the vocabulary table (671
    MB, reached by the channels key alone) and the like: left out, each run rebuilds them, and a tokens or MLP key
    change of such a model finds everything else kept instead of rebuilding all of it."""
    sizes = {name: _bytes(subject.params[name]) for name in moved_keys}
    if sum(sizes.values()) <= bound:
        return moved_keys
    kept, room = {}, bound
    for name in sorted(sizes, key=sizes.get):
        if sizes[name] > room:
            break
        kept[name], room = moved_keys[name], room - sizes[name]
    return kept


def gather_indices(axes, scramble: Scramble, layer, shape: tuple) -> tuple | None:
    """Per axis, the one index that the element gathers it by (None where nothing acts on it): transformed =
    original gathered by these, axis by axis. None when a rotation acts on some axis (arithmetic, not a gather), or
    when two axes are one space (Merged: its gather is not one index per axis)."""
    if not isinstance(axes, tuple) or any(isinstance(role, Merged) for role in axes):
        return None
    found = []
    for axis, role in enumerate(axes):
        if role is None:
            found.append(None)
            continue
        role = role.role if isinstance(role, Gain) else role  # a gain is gathered as its space is
        if isinstance(role, Concat) and role.whole and scramble.chain(role.whole, layer):
            return None  # the whole fused axis gathered, then each part: not one index per part
        parts = role.parts if isinstance(role, Concat) else ((role, None),)
        chains = []
        for part, _ in parts:
            name, at = part if isinstance(part, tuple) else (part, layer)
            chains.append(composed(scramble.chain(name, at)))
        if any(not isinstance(t, Permutation) for chain in chains for t in chain):
            return None
        if not any(chains):
            found.append(None)
        elif isinstance(role, Concat):  # each part's own index, laid back along the fused axis
            pieces = role.split(torch.arange(shape[axis]), 0)
            found.append(role.join([piece[chain[0].index] if chain else piece
                                    for piece, chain in zip(pieces, chains, strict=True)], 0))
        else:
            found.append(chains[0][0].index)
    return tuple(found)


def _derive(kin: list[tuple], indices: tuple) -> tuple[torch.Tensor, list] | None:
    """(a kept sibling, the gathers that turn it into the tensor the original gathers to by `indices`): along
    only the axes where the two differ, from the sibling with fewest such axes. A gather of a gather is a gather,
    so the values are the very same. None when every axis differs from every sibling's (nothing to save) or none
    is kept."""
    best = None
    for value, theirs in kin:
        differ = [axis for axis, (mine, other) in enumerate(zip(indices, theirs, strict=True))
                  if not _same_index(mine, other)]
        if best is None or len(differ) < len(best[2]):
            best = (value, theirs, differ)
    if best is None or len(best[2]) >= sum(index is not None for index in indices):
        return None
    tensor, theirs, differ = best
    steps = []
    for axis in differ:
        mine, other = indices[axis], theirs[axis]
        # theirs[j] = original[other[j]], wanted[i] = original[mine[i]]: wanted = theirs gathered by other^-1[mine]
        steps.append((axis, mine if other is None else (torch.argsort(other) if mine is None
                                                         else torch.argsort(other)[mine])))
    return tensor, steps


def _same_index(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is b:
        return True
    if a is None or b is None or a.shape != b.shape:
        return False
    if a.device.type != "cpu":
        return torch.equal(a, b)
    # Compared as bytes, holding the GIL: torch.equal lets it go, and a key change compares hundreds of indices,
    # each of which had to win the GIL back from a classroom's sessions drawing charts.
    return _fingerprint(a) == _fingerprint(b)


# An index's bytes, read once: one run's element shares each index tensor among all the parameters it gathers.
# Keyed by id and holding the tensor (so the id stays its own); a few hundred small indices at most.
_fingerprints: dict[int, tuple[torch.Tensor, bytes]] = {}
FINGERPRINTS_KEPT = 512


def _fingerprint(index: torch.Tensor) -> bytes:
    found = _fingerprints.get(id(index))
    if found is None:  # an entry holds its tensor, so no other tensor can have that id meanwhile
        if len(_fingerprints) >= FINGERPRINTS_KEPT:
            _fingerprints.clear()
        found = _fingerprints[id(index)] = (index, index.numpy().tobytes())
    return found[1]
