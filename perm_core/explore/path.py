"""Where the keys send one token, channel or MLP neuron: the path a highlight follows across Explore's three
columns (original | scrambled | un-scrambled).

Every position is computed by the element itself: the scramble's own transform of the space (the one that moves
the tensors) is applied to the item numbers 0..n-1, so scrambled position i holds the original item the result
says; the inverse's transform, applied the same way, says where the un-scrambled column puts each scrambled
position back. Nothing here re-derives a permutation from a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from perm_core.engine.spec import Concat, Gain, Merged, Scramble, apply_axes

# The spaces a student can follow, by the role that names them in an axis spec
ITEMS = {"tokens": "token", "resid": "channel", "mlp": "neuron", "heads": "head"}


@dataclass(frozen=True)
class AxisPath:
    """One axis of a shown tensor: which item it holds (token, channel, neuron; None for an axis no path follows)
    and where the element put each of them."""

    item: str | None
    size: int
    held: tuple[int, ...] | None  # scrambled position i holds original item held[i]; None: the element mixes items
    back: tuple[int, ...] | None  # un-scrambled position j holds scrambled position back[j] (the inverse's gather)

    def path(self, original: int) -> tuple[int, int | None, int | None]:
        """(where `original` is in the original, in the scrambled, in the un-scrambled column); None where the
        element does not move it as a whole (a rotation mixes it with its neighbours)."""
        if not 0 <= original < self.size:
            raise ValueError(f"{self.item} {original} is not one of the {self.size} on this axis")
        if self.held is None or self.back is None:
            return original, None, None
        scrambled = self.held.index(original)
        return original, scrambled, self.back.index(scrambled)


def _role_name(role) -> tuple[str | None, int | None]:
    """An axis role as (name, its own layer or None)."""
    if isinstance(role, tuple):
        return role[0], role[1]
    if isinstance(role, str):
        return role, None
    return None, None


def _held(role, size: int, scramble: Scramble, layer: int | None) -> tuple[int, ...] | None:
    """The element's transform of this space applied to the item numbers: a permutation gives them back
    reordered (new position i holds item held[i]); anything else (a rotation) mixes them and gives None."""
    numbers = torch.arange(size, dtype=torch.float64)
    moved = apply_axes(numbers, (role,), scramble, layer)
    whole = moved.round()
    if not torch.equal(whole, moved) or not torch.equal(whole.sort().values, numbers):
        return None
    return tuple(int(i) for i in whole.tolist())


def axis_path(role, size: int, scramble: Scramble, layer: int | None = None) -> AxisPath:
    """The path of every item along one axis whose role is `role` (an axis spec's entry): what the element and its
    inverse do to that space."""
    if role is None or isinstance(role, (Concat, Merged, Gain)):  # a fused axis (q|k|v) is no one item's
        return AxisPath(None, size, tuple(range(size)), tuple(range(size)))
    name, own_layer = _role_name(role)
    layer = own_layer if own_layer is not None else layer
    return AxisPath(ITEMS.get(name), size, _held(role, size, scramble, layer),
                    _held(role, size, scramble.inverse(), layer))


def tensor_paths(axes, shape, scramble: Scramble, layer: int | None = None) -> tuple[AxisPath, ...]:
    """An AxisPath for every axis of a tensor with these axis roles (a trace record's, a weight rule's)."""
    return tuple(axis_path(role, size, scramble, layer) for role, size in zip(axes, shape, strict=True))


def _first_moved(ranked, moves: AxisPath | None) -> int:
    """The first of the ranked items that the element moves (a highlight that stays put shows nothing), else the
    first of them."""
    ranked = [int(i) for i in ranked]
    if moves is not None:
        for item in ranked:
            if moves.path(item)[1] not in (item, None):
                return item
    return ranked[0]


def default_token(n_tokens: int, fixed_tokens: int, class_attention=None, moves: AxisPath | None = None) -> int:
    """The token a page follows unless a student picks one: of the tokens that move (moves: the input's token path),
    the patch the class token attends to most (an image model's class-attention grid, rows x cols, the original's),
    else the first one."""
    if class_attention is not None:
        grid = np.asarray(class_attention, dtype=np.float64).ravel()
        return _first_moved(fixed_tokens + np.argsort(-grid, kind="stable"), moves)
    return _first_moved(range(min(fixed_tokens, max(n_tokens - 1, 0)), n_tokens), moves)


def default_head(n_heads: int, moves: AxisPath | None = None) -> int:
    """The attention head a page follows unless a student picks one: the first that the element moves (moves: one
    layer's head path)."""
    return _first_moved(range(n_heads), moves)


def default_column(values, moves: AxisPath | None = None) -> int:
    """The channel (or neuron) a page follows unless a student picks one: of the columns that move, the one with the
    largest mean |value| in the original (a [tokens, columns] activation), the stripe that stands out wherever it
    moves."""
    array = values.detach().double().cpu().numpy() if hasattr(values, "detach") else np.asarray(values, float)
    loudness = np.abs(array.reshape(-1, array.shape[-1])).mean(axis=0)
    return _first_moved(np.argsort(-loudness, kind="stable"), moves)


def column_order(values) -> tuple[int, ...]:
    """Columns of a [tokens, columns] activation sorted by their mean over the tokens, smallest first: drawn in this
    order, random-looking channels become a ramp, and a permuted copy sorted by its own means draws the same ramp."""
    array = values.detach().double().cpu().numpy() if hasattr(values, "detach") else np.asarray(values, float)
    means = array.reshape(-1, array.shape[-1]).mean(axis=0)
    return tuple(int(i) for i in np.argsort(means, kind="stable"))
