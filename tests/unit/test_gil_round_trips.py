"""A key change makes few torch calls that let the GIL go: under a classroom's load each such call waits to win
the GIL back from the sessions drawing charts. Small tensors are compared in batches (the same numbers as one
by one) and gather indices are compared as bytes."""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from perm_core import compare
from perm_core.param_cache import _same_index

METADATA = {"__get__", "numel", "dim", "element_size", "is_contiguous", "numpy", "__getitem__", "size"}


class Calls(TorchFunctionMode):
    """Counts the torch calls that do work (metadata reads hold the GIL)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") not in METADATA:
            self.count += 1
        return func(*args, **(kwargs or {}))


def pairs():
    torch.manual_seed(0)
    reference = {f"small{i}": torch.randn(7, 5) for i in range(40)}
    reference |= {"double": torch.randn(9, dtype=torch.float64), "nan": torch.tensor([1.0, 2.0]),
                  "inf": torch.tensor([math.inf, 1.0]), "empty": torch.zeros(0),
                  "large": torch.randn(compare.BATCH_ELEMENTS + 5), "reshaped": torch.randn(6)}
    other = {name: tensor + 1e-3 * torch.randn_like(tensor) for name, tensor in reference.items()}
    other["nan"] = torch.tensor([1.0, math.nan])
    other["inf"] = torch.tensor([math.inf, 1.0])  # inf - inf is NaN: not finite
    other["reshaped"] = torch.randn(2, 3)  # another shape: left out
    scale = {name: compare.largest_magnitude(tensor) for name, tensor in reference.items()}
    return reference, other, scale


def test_batched_differences_are_the_one_by_one_numbers():
    reference, other, scale = pairs()
    found = compare.relative_differences(reference, other, scale)
    assert list(found) == [name for name in reference if name != "reshaped"]
    for name, (diff, rel, finite) in found.items():
        alone = compare._max_abs_difference(reference[name], other[name])
        if name in ("nan", "inf"):
            assert not finite and math.isnan(alone)
            continue
        assert finite and diff == alone and rel == (diff / scale[name] if scale[name] else 0.0)
    assert found["small3"][0] > 0 and found["empty"] == (0.0, 0.0, True)


def test_small_tensors_are_compared_in_a_few_calls():
    reference, other, scale = pairs()
    small = {name: reference[name] for name in reference if name.startswith("small")}
    with Calls() as calls:
        compare.relative_differences(small, other, scale)
    assert calls.count <= 4  # one batch; one by one took four calls per tensor (160 here)
    with Calls() as one_by_one:
        for name in small:
            compare._max_abs_difference(small[name], other[name])
    assert one_by_one.count >= 4 * len(small)


def test_gather_indices_compare_by_value_without_torch_work():
    index = torch.randperm(50, generator=torch.Generator().manual_seed(1))
    same, flipped, shorter, wide, tall = index.clone(), index.flip(0), index[:49], index.view(5, 10), index.view(10, 5)
    with Calls() as calls:
        assert _same_index(index, same) and _same_index(None, None) and _same_index(index, index)
        assert not _same_index(index, flipped) and not _same_index(index, None)
        assert not _same_index(index, shorter) and not _same_index(wide, tall)
    assert calls.count == 0  # torch.equal was one call each, letting the GIL go
