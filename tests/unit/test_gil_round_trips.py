"""A key change makes few torch calls that let the GIL go: under a classroom's load each such call waits to win
the GIL back from the sessions drawing charts. Small tensors are compared in batches (the same numbers as one
by one) and gather indices are compared as bytes."""

from __future__ import annotations

import math

import numpy as np
import torch

from perm_core.fast.param_cache import _same_index
from perm_core.run.threads import TorchWorkCalls as Calls
from perm_core.verify import tolerances


def pairs():
    torch.manual_seed(0)
    reference = {f"small{i}": torch.randn(7, 5) for i in range(40)}
    reference |= {"double": torch.randn(9, dtype=torch.float64), "nan": torch.tensor([1.0, 2.0]),
                  "inf": torch.tensor([math.inf, 1.0]), "empty": torch.zeros(0),
                  "large": torch.randn(tolerances.BATCH_ELEMENTS + 5), "reshaped": torch.randn(6)}
    other = {name: tensor + 1e-3 * torch.randn_like(tensor) for name, tensor in reference.items()}
    other["nan"] = torch.tensor([1.0, math.nan])
    other["inf"] = torch.tensor([math.inf, 1.0])  # inf - inf is NaN: not finite
    other["reshaped"] = torch.randn(2, 3)  # another shape: left out
    scale = {name: tolerances.largest_magnitude(tensor) for name, tensor in reference.items()}
    return reference, other, scale


def test_batched_differences_are_the_one_by_one_numbers():
    reference, other, scale = pairs()
    found = tolerances.relative_differences(reference, other, scale)
    assert list(found) == [name for name in reference if name != "reshaped"]
    for name, (diff, rel, finite) in found.items():
        alone = tolerances._max_abs_difference(reference[name], other[name])
        if name in ("nan", "inf"):
            assert not finite and math.isnan(alone)
            continue
        assert finite and diff == alone and rel == (diff / scale[name] if scale[name] else 0.0)
    assert found["small3"][0] > 0 and found["empty"] == (0.0, 0.0, True)


def test_small_tensors_are_compared_in_a_few_calls():
    reference, other, scale = pairs()
    small = {name: reference[name] for name in reference if name.startswith("small")}
    with Calls() as calls:
        tolerances.relative_differences(small, other, scale)
    assert calls.count <= 5  # one batch; one by one took four calls per tensor (160 here)
    with Calls() as one_by_one:
        for name in small:
            tolerances._max_abs_difference(small[name], other[name])
    assert one_by_one.count >= 4 * len(small)


def test_gather_indices_compare_by_value_without_torch_work():
    index = torch.randperm(50, generator=torch.Generator().manual_seed(1))
    same, flipped, shorter, wide, tall = index.clone(), index.flip(0), index[:49], index.view(5, 10), index.view(10, 5)
    with Calls() as calls:
        assert _same_index(index, same) and _same_index(None, None) and _same_index(index, index)
        assert not _same_index(index, flipped) and not _same_index(index, None)
        assert not _same_index(index, shorter) and not _same_index(wide, tall)
    assert calls.count == 0  # torch.equal was one call each, letting the GIL go


def test_a_comparison_reuses_its_threads_scratch_and_gives_the_plain_numbers():
    """The single-slice path writes into a temporary the thread keeps (fresh memory per comparison was faulted
    in each time); each thread has its own, and the numbers are those of (a - b).abs().max()."""
    import threading

    torch.manual_seed(3)
    big = torch.randn(6, 257, 257)  # a dinov2-s attention map: one slice, bigger than a batch
    assert tolerances.BATCH_ELEMENTS < big.numel() <= tolerances.CHUNK
    shifted = big + 1e-3 * torch.randn_like(big)
    assert tolerances._max_abs_difference(big, shifted) == (big - shifted).abs().max().item() > 0
    first = tolerances._scratches.buffer.data_ptr()
    strided = big.transpose(1, 2)  # not contiguous: still the same numbers
    assert tolerances._max_abs_difference(strided, shifted.transpose(1, 2)) == (big - shifted).abs().max().item()
    assert tolerances._scratches.buffer.data_ptr() == first  # reused, not allocated again
    with_nan = shifted.clone()
    with_nan[0, 0, 0] = math.nan
    assert math.isnan(tolerances._max_abs_difference(big, with_nan))
    seen = []
    other = threading.Thread(target=lambda: (tolerances._max_abs_difference(big, shifted),
                                             seen.append(tolerances._scratches.buffer.data_ptr())))
    other.start()
    other.join()
    assert seen and seen[0] != first


def test_an_index_is_read_once_and_the_kept_fingerprints_are_bounded(monkeypatch):
    from perm_core.fast import param_cache

    monkeypatch.setattr(param_cache, "_fingerprints", {})
    monkeypatch.setattr(param_cache, "FINGERPRINTS_KEPT", 8)
    index = torch.randperm(20, generator=torch.Generator().manual_seed(2))
    siblings = [index.clone() for _ in range(5)]
    assert all(_same_index(index, sibling) for sibling in siblings)
    assert set(param_cache._fingerprints) == {id(t) for t in (index, *siblings)}  # one read per tensor
    assert not _same_index(index, siblings[0].flip(0))
    torch.manual_seed(4)
    many = [torch.randperm(20) for _ in range(20)]
    for other in many:
        _same_index(index, other)
    assert len(param_cache._fingerprints) <= 8
    assert _same_index(many[-1], many[-1].clone()) and not _same_index(many[-1], index.flip(0))


def test_tensors_that_require_grad_compare_too():
    """The scratch and the slices write with out=, which autograd refuses: such tensors are detached first."""
    torch.manual_seed(5)
    for shape in ((5, 4), (tolerances.CHUNK + 7,)):
        a = torch.randn(shape, requires_grad=True)
        b = a.detach() + 1e-3 * torch.randn(shape)
        assert tolerances._max_abs_difference(a, b) == (a - b).abs().max().item() > 0


def test_a_chart_reads_a_cpu_tensor_without_torch_calls_and_gets_the_same_numbers():
    """figures.to_numpy: numpy() holds the GIL, where detach/to/double were three waits for it under load."""
    from ui.charts.figures import to_numpy

    generator = torch.Generator().manual_seed(4)
    for tensor in (torch.randn(5, 3, generator=generator), torch.randn(4, dtype=torch.float64, generator=generator),
                   torch.tensor([1.0, math.nan, math.inf]), torch.arange(6).view(2, 3)):
        with Calls() as calls:
            array = to_numpy(tensor)
        assert calls.count == 0 and array.dtype == np.float64
        expected = tensor.detach().to("cpu").double().numpy()
        assert np.array_equal(array, expected, equal_nan=True)
    special = (torch.randn(3, generator=generator).bfloat16(), torch.randn(3, generator=generator, requires_grad=True))
    for tensor in special:  # no numpy dtype, or autograd's: the torch path, the same values
        assert np.array_equal(to_numpy(tensor), tensor.detach().double().numpy())
