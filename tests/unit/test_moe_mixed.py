"""Mixtures of experts whose config keeps some blocks dense (issue 48): Qwen2-MoE's and Qwen3-MoE's mlp_only_layers
and decoder_sparse_step, as transformers builds them (block i is sparse unless i is in mlp_only_layers or
(i + 1) % decoder_sparse_step != 0). A dense block's MLP is a plain MLP of config.intermediate_size neurons with no
router: mlp permutes it, experts and router_shift leave it alone (Geometry.dense_layers, moe_layers).

Each mixed model: every symmetry holds forward and backward at float64 round-off and every control breaks, the
elements act on each block as its kind says, a scramble reloads in plain transformers (eager experts) as the same
function, compare recovers the element, and the streamed check agrees with the whole-model check.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from perm_core.engine import symmetries
from perm_core.families import family_by_name
from perm_core.families.base import UnsupportedModelError
from perm_core.models.random_models import random_config, random_inputs, randomize_
from perm_core.run.numerics import use_exact_numerics
from perm_core.stream.check import stream_check
from perm_core.verify.check import check
from perm_core.verify.subject import Subject
from tests.unit.scrambled_checkpoints import reloaded_in_transformers, save_and_scramble
from tests.unit.symmetry_asserts import assert_every_control_breaks, assert_symmetry_holds

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

# family -> (config changes, the dense blocks they make), three blocks each
MIXED = {
    "qwen2_moe": ({"mlp_only_layers": [1]}, (1,)),
    "qwen3_moe": ({"decoder_sparse_step": 2}, (0, 2)),
}
CLASSES = {"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def mixed_config(family: str, **changes):
    config = random_config(family)
    config.num_hidden_layers = 3
    config.layer_types = ["full_attention"] * 3
    for name, value in {**MIXED[family][0], **changes}.items():
        setattr(config, name, value)
    return config


def mixed_model(family: str, dtype=torch.float64, seed: int = 3):
    """The family's random model (every gain, bias and router far from init) with some blocks dense."""
    torch.manual_seed(seed)
    model = randomize_(getattr(hf, CLASSES[family])(mixed_config(family)).to(dtype), seed).eval()
    use_exact_numerics(model)
    return model


@pytest.mark.parametrize("family", MIXED)
def test_the_geometry_names_the_dense_blocks(family):
    config = mixed_config(family)
    g = family_by_name(family).geometry(config)
    dense = MIXED[family][1]
    assert g.dense_layers == dense and g.d_dense == config.intermediate_size
    assert g.moe_layers == tuple(i for i in range(3) if i not in dense)
    model = getattr(hf, CLASSES[family])(config)
    names = dict(model.named_parameters())
    for layer in range(3):  # transformers' own layout: a dense MLP exactly where the geometry says
        assert (f"model.layers.{layer}.mlp.gate_proj.weight" in names) == (layer in dense)
        assert (f"model.layers.{layer}.mlp.gate.weight" in names) == (layer not in dense)
        width = names[f"model.layers.{layer}.mlp.gate_proj.weight"].shape[0] if layer in dense else g.d_mlp
        assert g.mlp_width(layer) == width
    assert family_by_name(family).spec(config).unclaimed(names) == []
    with pytest.raises(UnsupportedModelError, match="every block's MLP dense"):  # no mixture of experts left
        family_by_name(family).geometry(mixed_config(family, mlp_only_layers=[0, 1, 2]))


@pytest.mark.parametrize("family", MIXED)
def test_the_elements_act_on_each_block_as_its_kind_says(family):
    g = family_by_name(family).geometry(mixed_config(family))
    key = 5
    for name in ("experts", "router_shift"):
        element = symmetries.build(name, key, g)
        assert {layer for (_, layer) in element.spaces} == set(g.moe_layers), name
    mlp = symmetries.build("mlp", key, g)
    for layer in range(3):
        dense = mlp.spaces.get(("mlp", layer), ())
        assert (dense[0].size if dense else 0) == g.mlp_width(layer)
        assert (("expert_mlp", layer) in mlp.spaces) == (layer in g.moe_layers)
    bits = symmetries.key_space_bits("experts", g)
    assert bits == pytest.approx(len(g.moe_layers) * symmetries.keys.permutation_bits(g.n_experts))


@pytest.mark.parametrize("family", MIXED)
def test_every_symmetry_holds_and_every_control_breaks(family):
    model = mixed_model(family)
    report = check(model, random_inputs(family, model, seed=3), key=9)
    for symmetry in (*symmetries.SYMMETRIES, "all"):
        assert_symmetry_holds(report, symmetry, torch.float64)
    assert max(c.max_rel_error for c in report.checks) < 1e-12
    assert_every_control_breaks(report)
    names = {c.name for c in report.controls}  # the dense blocks' MLP and the experts each have theirs
    assert {"output_not_permuted", "expert_down_not_permuted", "router_not_permuted", "one_row_shifted"} <= names
    assert report.oracle.passed


@pytest.mark.parametrize("family", MIXED)
def test_a_scramble_reloads_as_the_same_function_and_compare_recovers_it(family, tmp_path):
    from perm_core.engine.transforms import composed
    from perm_core.verify.same_function import compare_models

    model = mixed_model(family)
    names = ("experts", "mlp", "channels", "heads", "rotation", "router_shift")
    save_and_scramble(model, tmp_path, key=5, symmetries=names)
    original, scrambled = reloaded_in_transformers(tmp_path)
    ids = random_inputs(family, model, seed=3)["input_ids"]
    with torch.no_grad():
        expected, got = original(ids).logits, scrambled(ids).logits
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-5  # the stock float32 router
        dense = MIXED[family][1][0]
        down = f"model.layers.{dense}.mlp.down_proj.weight"  # the control: a dense block's neurons not matched
        dict(scrambled.named_parameters())[down].copy_(dict(original.named_parameters())[down])
        broken = scrambled(ids).logits
    assert ((broken - expected).abs().max() / expected.abs().max()).item() > 1e-2
    subject = Subject(model)
    key = symmetries.build_many({name: 5 for name in symmetries.WEIGHT_SYMMETRIES}, subject.geometry)
    b = mixed_model(family)
    with torch.no_grad():
        for name, tensor in subject.transformed_params(key).items():
            dict(b.named_parameters())[name].copy_(tensor)
    result = compare_models(model, b, [random_inputs(family, model, seed=3)], "A", "B")
    assert result.verdict == "same function" and result.residual < 1e-12
    found = result.recovered.element
    for layer in range(3):
        roles = ("experts", "expert_mlp", "mlp") if layer in subject.geometry.moe_layers else ("mlp",)
        for role in roles:
            if (role, layer) not in key.spaces:
                continue
            (mine,), (theirs,) = composed(found.spaces[(role, layer)]), composed(key.spaces[(role, layer)])
            assert torch.equal(mine.index, theirs.index), (role, layer)
    assert result.recovered.summary()["router_shift"] == {"shifted": len(subject.geometry.moe_layers),
                                                          "of": len(subject.geometry.moe_layers)}


@pytest.mark.parametrize("family", MIXED)
def test_the_streamed_check_agrees(family, tmp_path):
    model = mixed_model(family, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    model = model.to(torch.float64)
    inputs = random_inputs(family, model, seed=3)
    whole, streamed = check(model, inputs, key=4), stream_check(tmp_path, inputs, key=4)
    assert whole.passed and streamed.passed
    assert [(c.symmetry, c.direction, c.passed, c.first_break) for c in streamed.checks] == [
        (c.symmetry, c.direction, c.passed, c.first_break) for c in whole.checks]
    assert all(c.max_rel_error < 1e-11 for c in streamed.checks)
    assert [(c.name, c.broken) for c in streamed.controls] == [(c.name, c.broken) for c in whole.controls]
