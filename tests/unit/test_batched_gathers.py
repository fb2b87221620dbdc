"""Gathers and un-scramble-and-compare steps a batch per torch call (perm_core.fast.batched_gathers): the very values of
Permutation.apply and of compare's one-pair reduction, a handful of calls for a whole key change, and the
same verdicts as the one-by-one path, which a wrong inverse still fails."""

from __future__ import annotations

import math

import torch

from perm_core.engine.transforms import Permutation
from perm_core.explore.exploration import Exploration
from perm_core.fast.batched_gathers import gather_many, gathered_difference_by_rows, gathered_differences
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.run.threads import TorchWorkCalls
from perm_core.verify import tolerances


def one_by_one(tensor, steps):
    for axis, index in steps:
        tensor = Permutation(index).apply(tensor, axis)
    return tensor


def test_gathers_are_permutation_apply_exactly_on_every_layout():
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(6, 5, generator=generator, dtype=torch.float64)
    strided = torch.randn(4, 3, 6, generator=generator).transpose(0, 2)  # [6, 3, 4], not contiguous
    vector = torch.randn(5, generator=generator)
    p6, p5, p4 = (torch.randperm(n, generator=generator) for n in (6, 5, 4))
    tensors = [matrix, strided, vector, matrix]
    steps = [[(1, p5), (0, p6)], [(0, p6), (2, p4)], [(0, p5)], []]
    made = gather_many(tensors, steps)
    for tensor, chain, result in zip(tensors, steps, made, strict=True):
        expected = one_by_one(tensor, chain)
        assert torch.equal(result, expected) and result.dtype == expected.dtype and result.is_contiguous()
    assert made[3] is matrix  # nothing to gather: the tensor itself, as a chain without steps gives
    assert not torch.equal(made[0], one_by_one(matrix, [(1, p5)]))  # the second step mattered


def test_differences_are_compares_one_pair_numbers_nan_and_inf_included():
    generator = torch.Generator().manual_seed(1)
    base = torch.randn(7, 4, generator=generator)
    index = torch.randperm(7, generator=generator)
    restored = one_by_one(base, [(0, index)])
    references = [restored + 1e-3 * torch.randn(7, 4, generator=generator), restored.clone(),
                  torch.tensor([1.0, math.nan]), torch.tensor([math.inf, 2.0]), torch.zeros(0),
                  torch.randn(9, generator=generator, dtype=torch.float64)]
    tensors = [base, base, torch.tensor([1.0, 2.0]), torch.tensor([math.inf, 2.0]), torch.zeros(0),
               references[5] + 1e-12]
    steps = [[(0, index)], [(0, index)], [], [], [], []]
    found = gathered_differences(tensors, references, steps)
    expected = [tolerances._max_abs_difference(r, one_by_one(t, s)) for r, t, s in zip(references, tensors, steps,
                                                                                     strict=True)]
    assert found[0] == expected[0] > 0 and found[1] == expected[1] == 0.0 and found[5] == expected[5] > 0
    assert math.isnan(found[2]) and math.isnan(expected[2])
    assert math.isnan(found[3]) and math.isnan(expected[3])  # inf - inf is NaN: never a pass
    assert found[4] == expected[4] == 0.0


def test_a_large_pair_compared_by_rows_gives_the_whole_gathers_number():
    """Slices of rows gathered and compared one at a time (no whole un-scrambled copy): the very max |a - b| of
    gathering the whole tensor first, on weights gathered along either axis or both, a vector, a 3-D tensor and
    slices of one row or less; NaN propagates; a wrong index (the negative control) gives another number."""
    generator = torch.Generator().manual_seed(2)
    cases = [((300, 70), (0, 1)), ((70, 300), (1,)), ((500, 9), (0,)), ((4000,), (0,)), ((6, 30, 40), (0, 2))]
    for shape, axes in cases:
        tensor = torch.randn(shape, generator=generator, dtype=torch.float64)
        steps = [(axis, torch.randperm(shape[axis], generator=generator)) for axis in axes]
        reference = one_by_one(tensor, steps) + 1e-12 * torch.randn(shape, generator=generator, dtype=torch.float64)
        whole = tolerances._max_abs_difference(reference, one_by_one(tensor, steps))
        assert whole > 0
        for slice_elements in (1 << 19, 1000, 1):
            assert gathered_difference_by_rows(tensor, reference, steps, slice_elements) == whole, (shape, axes)
        with_nan = reference.clone()
        with_nan.view(-1)[-1] = math.nan
        assert math.isnan(gathered_difference_by_rows(tensor, with_nan, steps, 1000))
        wrong = [(axis, index.roll(1)) for axis, index in steps]
        assert gathered_difference_by_rows(tensor, reference, wrong, 1000) > 1e3 * whole


def test_relative_differences_compare_a_large_unscrambled_tensor_by_rows(monkeypatch):
    """compare's path for a large tensor that un-scrambles by gathers: it never asks for the whole un-scrambled
    tensor, and gives the numbers of un-scrambling it whole."""
    explorer = explored()
    result = explorer.run({"tokens": 3, "channels": 5, "mlp": 2})
    restored = explorer.subject.unscramble_lazily(result.scrambled, result.scramble)
    reference = {n: r.tensor for n, r in explorer.original.items()}
    scale = {n: 1.0 for n in reference}
    monkeypatch.setattr(tolerances, "BATCH_ELEMENTS", 64)  # this small ViT's activations count as large here
    monkeypatch.setattr(tolerances, "CHUNK", 64)
    whole = {n: restored[n] for n in reference if n in restored}
    asked = []
    monkeypatch.setattr(type(restored), "__getitem__", lambda self, name: asked.append(name))
    by_rows = tolerances.relative_differences(reference, restored, scale)
    assert asked == [] and by_rows.keys() == whole.keys()
    assert by_rows == {n: (d, d, True) for n, d in ((n, tolerances._max_abs_difference(reference[n], t))
                                                    for n, t in whole.items())}


def explored():
    model, _ = build_random_model("vit", seed=6)
    return Exploration(model, random_inputs("vit", model, seed=6))


def test_a_key_change_makes_a_handful_of_torch_calls():
    """Each torch call made from Python waits for the GIL once under a classroom's load (benchmarks/
    gil_contention.py has the seconds); gathering, the forward and comparing are a call or two each. This run
    made 166 calls before they were batched, 26 after."""
    explorer = explored()
    for key in (1, 2):  # the forward's signature seen, then traced
        explorer.run({"tokens": 3, "channels": key, "mlp": 2})
    with TorchWorkCalls() as calls:
        result = explorer.run({"tokens": 3, "channels": 5, "mlp": 2})
    assert result.passed and len(result.errors) >= 6
    assert calls.count <= 30, calls.count


def test_batched_and_one_by_one_comparisons_give_the_same_errors_and_a_wrong_inverse_fails():
    explorer = explored()
    keys = {"tokens": 3, "channels": 5, "heads": 1}
    result = explorer.run(keys)
    subject = explorer.subject
    whole = subject.unscramble(result.scrambled, result.scramble)  # a dict: compared in one call too
    one_pair = {e.name: tolerances._max_abs_difference(explorer.original[e.name].tensor, whole[e.name])
                for e in result.errors}
    assert {e.name: e.max_abs_error for e in result.errors} == one_pair
    wrong = subject.unscramble_lazily(result.scrambled, subject.build({"tokens": 3, "channels": 6, "heads": 1}))
    errors = subject.errors(explorer.original, wrong, result.scramble)
    assert max(e.max_rel_error for e in errors if e.name.endswith(".hidden")) > 0.1


def test_off_the_cpu_each_step_is_a_permutation_apply(monkeypatch):
    """The meta device stands in for an accelerator: shapes and devices only, one Permutation.apply per step."""
    applied = []
    apply = Permutation.apply
    monkeypatch.setattr(Permutation, "apply", lambda self, t, axis: applied.append(axis) or apply(self, t, axis))
    tensor = torch.empty(4, 3, device="meta")
    made = gather_many([tensor], [[(0, torch.randperm(4)), (1, torch.randperm(3))]])[0]
    assert applied == [0, 1] and made.device.type == "meta" and made.shape == (4, 3)
    gather_many([torch.zeros(4, 3)], [[(0, torch.randperm(4))]])
    assert applied == [0, 1]  # on the CPU: the one TorchScript call
