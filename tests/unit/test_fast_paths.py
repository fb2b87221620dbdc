"""The fast paths (merged permutation chains, gathers on the storage beneath a strided view, the per-tensor
cache with its residual-first intermediate, the partial inverse of un-scrambling) give bit-identical
parameters, traces, gradients and un-scrambled tensors to the straightforward engine: one index_select per
permutation, one rotation per BlockOrthogonal, axis by axis, and the full inverse. Every registered family,
every symmetry, all of them together, and every negative control."""

from __future__ import annotations

import pytest
import torch

from perm_core import param_cache, symmetries
from perm_core.explore import Exploration, control_options
from perm_core.families import family_names
from perm_core.random_models import build_random_model, random_inputs
from perm_core.spec import PIXELS, Concat, Scramble
from perm_core.tokens import shuffle_patches
from perm_core.transforms import Permutation

KEYS = {name: 11 + i for i, name in enumerate(symmetries.SYMMETRIES)}


def stepwise_chain(chain, tensor, axis):
    for transform in chain:
        if isinstance(transform, Permutation):
            tensor = tensor.index_select(axis, transform.index)
        else:
            tensor = transform.apply(tensor, axis)
    return tensor


def stepwise_axes(tensor, axes, scramble: Scramble, layer, patch_size=None):
    if axes == PIXELS:
        return shuffle_patches(tensor, scramble.tokens, patch_size) if scramble.tokens is not None else tensor
    for axis, role in enumerate(axes):
        if isinstance(role, Concat):
            pieces = [stepwise_chain(scramble.chain(part, layer), piece, axis)
                      for piece, (part, _) in zip(role.split(tensor, axis), role.parts, strict=True)]
            tensor = role.join(pieces, axis)
        elif role is not None:
            name, at = role if isinstance(role, tuple) else (role, layer)
            tensor = stepwise_chain(scramble.chain(name, at), tensor, axis)
    return tensor


def stepwise_params(subject, scramble: Scramble) -> dict[str, torch.Tensor]:
    return {name: tensor if subject.claims[name].rule.tag in scramble.skip_tags
            else stepwise_axes(tensor, subject.claims[name].rule.axes, scramble, subject.claims[name].layer)
            for name, tensor in subject.params.items()}


def stepwise_unscramble(subject, records, scramble: Scramble) -> dict[str, torch.Tensor]:
    inverse = scramble.inverse()
    return {name: stepwise_axes(r.tensor, r.axes, inverse, r.layer, subject.geometry.patch_size)
            for name, r in records.items()}


def assert_identical(fast: dict, reference: dict, what: str) -> None:
    assert fast.keys() == reference.keys(), what
    for name, tensor in reference.items():
        got = getattr(fast[name], "tensor", fast[name])
        want = getattr(tensor, "tensor", tensor)
        assert got.dtype == want.dtype and torch.equal(got, want), f"{what}: {name}"


def assert_run_identical(explorer: Exploration, keys: dict, control: str | None = None) -> None:
    """Explore's run (the element with a control in place of its symmetry, un-scrambled by that element's
    inverse), and check's control run (the control's own element through the engine)."""
    subject = explorer.subject
    result = explorer.run(keys, control)
    scramble, chosen = explorer.scramble_for(keys, control)
    what = f"{subject.family.name} {sorted(keys)} {control}"
    reference = stepwise_params(subject, scramble)
    assert_identical(explorer.params_for(scramble, keys, control)[0], reference, f"{what}: cached params")
    assert_identical(subject.transformed_params(scramble), reference, f"{what}: engine params")
    traced = subject.trace(scramble, params=reference)
    assert_identical(result.scrambled, traced, f"{what}: scrambled trace")
    assert_identical(result.restored, stepwise_unscramble(subject, traced, scramble), f"{what}: un-scrambled")
    if chosen is not None:
        alone = stepwise_params(subject, chosen.scramble)
        assert_identical(subject.transformed_params(chosen.scramble), alone, f"{what}: control's own params")
        traced = subject.trace(chosen.scramble, params=alone)
        assert_identical(subject.unscramble(subject.trace(chosen.scramble), chosen.scramble),
                         stepwise_unscramble(subject, traced, chosen.scramble), f"{what}: control un-scrambled")


@pytest.fixture(scope="module")
def explorers():
    found = {}
    for family in family_names():
        model, _ = build_random_model(family, seed=5)
        found[family] = Exploration(model, random_inputs(family, model, seed=5))
    return found


@pytest.mark.parametrize("family", family_names())
def test_every_symmetry_all_and_every_control_bit_identical(family, explorers, one_thread):
    explorer = explorers[family]
    for name in symmetries.SYMMETRIES:
        assert_run_identical(explorer, {name: KEYS[name]})
    assert_run_identical(explorer, KEYS)
    for control in control_options(explorer.subject, KEYS):
        assert_run_identical(explorer, KEYS, control)
    # One key changed while the others stay: the cached residual-first intermediates serve the new key.
    assert_run_identical(explorer, {**KEYS, "mlp": 99})
    assert_run_identical(explorer, {**KEYS, "heads": 98, "channels": 97})


@pytest.mark.parametrize("family", family_names())
def test_gradients_bit_identical(family, explorers, one_thread):
    subject = explorers[family].subject
    scramble = subject.build(KEYS)
    fast = subject.trace(scramble, backward=True)
    reference = subject.trace(scramble, backward=True, params=stepwise_params(subject, scramble))
    assert any(name.startswith("grad.param.") for name in reference)
    assert_identical(fast, reference, f"{family} gradients")
    assert_identical(subject.unscramble(fast, scramble), stepwise_unscramble(subject, reference, scramble),
                     f"{family} un-scrambled gradients")


def test_the_fast_paths_really_moved_and_a_wrong_element_differs(explorers, one_thread):
    """The comparisons above are not vacuous: the element moves the weights, and a different key gives
    different parameters, so torch.equal would catch a fast path that applied the wrong element."""
    subject = explorers["llama"].subject
    fast = subject.transformed_params(subject.build(KEYS))
    other = stepwise_params(subject, subject.build({**KEYS, "mlp": 99}))
    moved = [n for n in fast if not torch.equal(fast[n], subject.params[n])]
    differ = [n for n in fast if not torch.equal(fast[n], other[n])]
    assert len(moved) > len(subject.params) // 2
    assert differ and all(".mlp." in n for n in differ)


def test_strided_gather_and_merged_chain_equal_index_select():
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, 4, generator=generator)
    for view in (base, base.permute(2, 0, 1), base.transpose(0, 1), base[:, ::2]):
        for axis in range(view.dim()):
            first, second = (Permutation(torch.randperm(view.shape[axis], generator=generator)) for _ in range(2))
            expected = view.index_select(axis, first.index).index_select(axis, second.index)
            got = stepwise_chain((first,), view, axis)
            assert torch.equal(first.apply(view, axis), got) and first.apply(view, axis).is_contiguous()
            from perm_core.transforms import apply_chain

            assert torch.equal(apply_chain((first, second), view, axis), expected)
            assert not torch.equal(expected, view)


def test_residual_first_intermediate_is_cached_under_the_channels_key(explorers):
    explorer = explorers["gpt2"]
    cache = param_cache.TensorCache()
    scramble = explorer.subject.build(KEYS)
    scope = ("fast-path-test",)
    param_cache.transformed_params(explorer.subject, scramble, KEYS, scope, cache)
    intermediates = [key for key in cache._items if "resid" in key[2:3]]
    assert intermediates and all(key[3] == KEYS["channels"] for key in intermediates)
    assert cache.bytes <= cache.max_bytes


def test_cached_original_scales_give_the_same_errors_and_movement(explorers, one_thread):
    from perm_core.compare import relative_differences, scales, tensor_errors

    explorer = explorers["bert"]
    subject, original = explorer.subject, explorer.original
    for keys in (KEYS, {**KEYS, "mlp": 99}, {"heads": 3}):
        result = explorer.run(keys)
        assert result.errors == tensor_errors(original, result.restored, subject.floor_reasons)
        reference = {n: r.tensor for n, r in original.items()}
        fresh = relative_differences(reference, {n: r.tensor for n, r in result.scrambled.items()},
                                     scales(reference, subject.floor_reasons, subject.dtype))
        assert result.moved == max(rel for _, rel, _ in fresh.values()) and result.moved >= 0.1


def test_no_intermediates_where_a_transformed_model_and_its_intermediates_would_not_fit(explorers, one_thread):
    subject = explorers["gpt2"].subject
    weight_bytes = sum(t.numel() * t.element_size() for t in subject.params.values())
    scramble = subject.build(KEYS)
    small = param_cache.TensorCache(max_bytes=2 * weight_bytes - 1)
    params = param_cache.transformed_params(subject, scramble, KEYS, ("small",), small)
    assert not [key for key in small._items if "resid" in key[2:3]]
    assert small.bytes <= small.max_bytes
    assert_identical(params, stepwise_params(subject, scramble), "gpt2 without intermediates")
