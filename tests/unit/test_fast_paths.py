"""The fast paths (merged permutation chains, gathers on the storage beneath a strided view, the per-tensor
cache, a changed key's tensors derived from a kept sibling, the partial inverse of un-scrambling) give bit-identical
parameters, traces, gradients and un-scrambled tensors to the straightforward engine: one index_select per
permutation, one rotation per BlockOrthogonal, axis by axis, and the full inverse. Every registered family,
every symmetry, all of them together, and every negative control."""

from __future__ import annotations

import pytest
import torch

from perm_core.engine import symmetries
from perm_core.engine.patches import shuffle_patches
from perm_core.engine.spec import PIXELS, Concat, Gain, Merged, Scramble, parts_of
from perm_core.engine.transforms import BlockOrthogonal, Permutation
from perm_core.explore.exploration import Exploration, control_options
from perm_core.families import family_names
from perm_core.fast import param_cache
from perm_core.fast.batched_gathers import gather_many
from perm_core.models.random_models import build_random_model, random_inputs

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
        if isinstance(role, Merged) and not any(scramble.chain(part, layer) for part in parts_of(role)):
            continue  # nothing acts on the merged space: the tensor as it is, as the engine leaves it
        if isinstance(role, Merged):  # the two axes as one, outer major: a fused expert tensor's experts x neurons
            moved = tensor.movedim((role.outer, axis), (0, 1))
            flat = stepwise_axes(moved.reshape(-1, *moved.shape[2:]), (role.inner,) + (None,) * (moved.dim() - 2),
                                 scramble, layer)
            # laid out as the parameter was (a strided weight takes other, float32-rounded BLAS paths)
            tensor = flat.reshape(moved.shape).movedim((0, 1), (role.outer, axis)).contiguous()
        elif isinstance(role, Gain):  # a diagonal conjugated: gathered, signs dropped (|M|)
            chain = tuple(BlockOrthogonal(t.blocks.abs()) if isinstance(t, BlockOrthogonal) else t
                          for t in scramble.chain(role.role, layer))
            tensor = stepwise_chain(chain, tensor, axis)
        elif isinstance(role, Concat):
            if role.whole:
                tensor = stepwise_chain(scramble.chain(role.whole, layer), tensor, axis)
            pieces = [stepwise_chain(scramble.chain(part, layer), piece, axis)
                      for piece, (part, _) in zip(role.split(tensor, axis), role.parts, strict=True)]
            tensor = role.join(pieces, axis)
        elif role is not None:
            name, at = role if isinstance(role, tuple) else (role, layer)
            tensor = stepwise_chain(scramble.chain(name, at), tensor, axis)
    return tensor


def stepwise_params(subject, scramble: Scramble) -> dict[str, torch.Tensor]:
    """Each parameter's axes transformed step by step, then a router's translation added (router_shift)."""
    def transformed(name, tensor):
        claim = subject.claims[name]
        tensor = stepwise_axes(tensor, claim.rule.axes, scramble, claim.layer)
        for translation in scramble.chain(claim.rule.shift, claim.layer) if claim.rule.shift else ():
            tensor = tensor + torch.outer(translation.rows, translation.vector).to(tensor.dtype) if tensor.dim() == 2 \
                else tensor + (translation.rows * translation.offset).to(tensor.dtype)
        return tensor

    return {name: tensor if subject.claims[name].rule.tag in scramble.skip_tags else transformed(name, tensor)
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
    # One key changed while the others stay: the tensors it reaches are derived from the kept ones.
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
            from perm_core.engine.transforms import apply_chain

            assert torch.equal(apply_chain((first, second), view, axis), expected)
            assert not torch.equal(expected, view)


MOE_WITHOUT_DENSE = ("mixtral", "qwen3_moe", "olmoe", "gpt_oss")  # under mlp, only fused expert tensors move
# every weight a pure gather: no rotation, no router translation (router_shift adds: built whole, as a rotation is)
PERMUTATIONS = {name: key for name, key in KEYS.items() if name not in ("rotation", "router_shift")}


@pytest.mark.parametrize("family", family_names())
def test_a_changed_key_is_derived_from_a_kept_sibling_bit_identically(family, explorers, monkeypatch, one_thread):
    """With one key changed, a tensor it reaches is gathered from the kept one of the previous element along the
    changed axes only; it is built from the original only where every axis it gathers changed (a bias, an
    embedding under a new channels key: no gather to save). Each equals the straightforward engine's."""
    subject = explorers[family].subject
    cache = param_cache.TensorCache(max_bytes=1 << 40)
    previous = subject.build(PERMUTATIONS)
    param_cache.transformed_params(subject, previous, PERMUTATIONS, ("derive",), cache)
    built = []
    engine = param_cache.apply_axes
    monkeypatch.setattr(param_cache, "apply_axes", lambda t, axes, s, layer: built.append((t, axes, layer))
                        or engine(t, axes, s, layer))
    for name in ("mlp", "heads", "head_channels", "tokens", "channels"):
        if name == "tokens" and not subject.n_tokens:
            continue
        keys = {**PERMUTATIONS, name: 90}
        before, built[:] = cache.misses, []
        scramble = subject.build(keys)
        params = param_cache.transformed_params(subject, scramble, keys, ("derive",), cache)
        assert_identical(params, stepwise_params(subject, scramble), f"{family} {name} changed")
        for tensor, axes, layer in built:
            if any(isinstance(a, Merged) for a in axes):  # a fused expert tensor: no index per axis, built whole
                assert param_cache.gather_indices(axes, scramble, layer, tuple(tensor.shape)) is None
                continue
            new, old = (param_cache.gather_indices(axes, s, layer, tuple(tensor.shape)) for s in (scramble, previous))
            gathered = [axis for axis, index in enumerate(new) if index is not None]
            kept = [axis for axis in gathered if old[axis] is not None and torch.equal(new[axis], old[axis])]
            assert not kept, f"{family} {name}: a {tuple(tensor.shape)} tensor built whole, axes {kept} unchanged"
        if name in ("mlp", "channels"):  # every family has MLP neurons and a residual stream
            assert cache.misses > before, f"{family} {name}: nothing was rebuilt"
        # A fused expert tensor (spec.Merged) is built whole: its gather is not one index per axis.
        reached_2d = [n for n in params if params[n].dim() >= 2 and params[n] is not subject.params[n]
                      and not any(isinstance(a, Merged) for a in subject.claims[n].rule.axes)]
        built_2d = [t for t, axes, _ in built if t.dim() >= 2 and not any(isinstance(a, Merged) for a in axes)]
        assert reached_2d or (family in MOE_WITHOUT_DENSE and name == "mlp"), f"{family} {name}"
        if reached_2d:
            assert len(built_2d) < len(reached_2d), f"{family} {name}: nothing derived"
        previous = scramble


def test_a_derived_tensor_gathers_only_the_changed_axis_and_a_wrong_step_would_differ():
    generator = torch.Generator().manual_seed(3)
    original = torch.randn(6, 5, generator=generator)
    rows, cols, new_rows = (torch.randperm(n, generator=generator) for n in (6, 5, 6))
    kept = original[rows][:, cols]
    source, steps = param_cache._derive([(kept, (rows, cols))], (new_rows, cols))
    derived = gather_many([source], [steps])[0]
    assert source is kept and [axis for axis, _ in steps] == [0]
    assert torch.equal(derived, original[new_rows][:, cols])
    # Pretending the kept tensor came from other indices gives other values: the equality above is not automatic.
    source, steps = param_cache._derive([(kept, (new_rows, cols))], (rows, cols))
    wrong = gather_many([source], [steps])[0]
    assert not torch.equal(wrong, original[rows][:, cols])
    # Every axis changed: nothing to save, built from the original instead.
    assert param_cache._derive([(kept, (rows, cols))], (new_rows, torch.randperm(5, generator=generator))) is None


def test_a_missing_tensor_is_compared_with_the_few_siblings_put_last():
    cache = param_cache.TensorCache(max_bytes=1 << 30)
    for i in range(param_cache.KIN_LOOKED_AT + 3):
        cache.put(("w", i), torch.full((2,), float(i)), group="w", indices=(torch.arange(2),))
    cache.put("no group", torch.zeros(2))
    found = cache.kin("w", param_cache.KIN_LOOKED_AT)
    assert [int(value[0]) for value, _ in found] == list(range(param_cache.KIN_LOOKED_AT + 2, 2, -1))
    cache.make_room(cache.max_bytes)  # evicting every entry forgets its kin too
    assert cache.kin("w", param_cache.KIN_LOOKED_AT) == [] and not cache._kin and not cache._group_of


def test_fused_axis_index_equals_the_engine_gather():
    """GPT-2's q|k|v and GPT-NeoX's per-head q|k|v: the one index along a fused axis is what the engine does."""
    for family in ("gpt2", "gpt_neox", "phi3"):
        model, _ = build_random_model(family, seed=1)
        subject = Exploration(model, random_inputs(family, model, seed=1)).subject
        scramble = subject.build(PERMUTATIONS)
        fused = [n for n, c in subject.claims.items()
                 if any(isinstance(role, Concat) for role in c.rule.axes or ())]
        assert fused, family
        for name in fused:
            claim, tensor = subject.claims[name], subject.params[name]
            indices = param_cache.gather_indices(claim.rule.axes, scramble, claim.layer, tuple(tensor.shape))
            gathered = tensor
            for axis, index in enumerate(indices):
                gathered = gathered if index is None else gathered.index_select(axis, index)
            assert torch.equal(gathered, stepwise_axes(tensor, claim.rule.axes, scramble, claim.layer)), name
        rotated = subject.build(KEYS)
        claim = subject.claims[fused[0]]
        assert param_cache.gather_indices(claim.rule.axes, rotated, claim.layer, (0,) * 2) is None


def test_cached_original_scales_give_the_same_errors_and_movement(explorers, one_thread):
    from perm_core.verify.tolerances import relative_differences, scales, tensor_errors

    explorer = explorers["bert"]
    subject, original = explorer.subject, explorer.original
    for keys in (KEYS, {**KEYS, "mlp": 99}, {"heads": 3}):
        result = explorer.run(keys)
        assert result.errors == tensor_errors(original, result.restored, subject.floor_reasons)
        reference = {n: r.tensor for n, r in original.items()}
        fresh = relative_differences(reference, {n: r.tensor for n, r in result.scrambled.items()},
                                     scales(reference, subject.floor_reasons, subject.dtype))
        assert result.moved == max(rel for _, rel, _ in fresh.values()) and result.moved >= 0.1


def test_a_set_over_the_bound_keeps_a_part_and_derives_from_it_bit_identically(explorers, one_thread):
    subject = explorers["gpt2"].subject
    weight_bytes = sum(t.numel() * t.element_size() for t in subject.params.values())
    small = param_cache.TensorCache(max_bytes=weight_bytes // 2)
    for keys in (PERMUTATIONS, {**PERMUTATIONS, "mlp": 99}, {**PERMUTATIONS, "channels": 98}):
        scramble = subject.build(keys)
        params = param_cache.transformed_params(subject, scramble, keys, ("small",), small)
        assert 0 < small.bytes <= small.max_bytes
        assert_identical(params, stepwise_params(subject, scramble), "gpt2 in a small cache")


def test_block_rotation_on_any_axis_equals_the_dense_block_diagonal_matrix():
    """The batched-matmul paths (first axis, last axis) and the einsum path (a middle axis), on contiguous and
    strided tensors: new[..., i, ...] = sum_j M[i, j] old[..., j, ...] with M the block-diagonal matrix."""
    from perm_core.engine.transforms import BlockOrthogonal

    generator = torch.Generator().manual_seed(4)
    rotation = BlockOrthogonal(torch.linalg.qr(torch.randn(3, 4, 4, generator=generator, dtype=torch.float64))[0])
    dense = rotation.matrix()
    base = torch.randn(12, 5, 12, generator=generator, dtype=torch.float64)
    for tensor in (base, base.transpose(0, 2), base[:, ::2]):
        for axis in (a for a in range(3) if tensor.shape[a] == 12):
            got = rotation.apply(tensor, axis)
            want = torch.movedim(torch.tensordot(dense, tensor.movedim(axis, 0), dims=1), 0, axis)
            assert got.shape == tensor.shape and torch.allclose(got, want, rtol=0, atol=1e-13), axis
            assert not torch.allclose(got, tensor, atol=1e-3)
            back = rotation.inverse().apply(got, axis)
            assert torch.allclose(back, tensor, rtol=0, atol=1e-13)
