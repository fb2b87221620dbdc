"""Rotation demos: Q/K/V change completely, scores / head outputs / outputs do not; residual and RoPE near misses."""

import pytest
import torch

from perm_core.applications import rotation
from perm_core.applications.fusion import one_thread
from perm_core.models.defaults import default_inputs
from perm_core.models.registry import load_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def digits64():
    loaded = load_model("digits-vit", dtype=torch.float64)
    return loaded.model, default_inputs(loaded)


def test_queries_keys_values_change_but_scores_and_outputs_do_not(digits64):
    demo = rotation.rotation_demo(*digits64, key=5, layer=1, head=2)
    by_name = {(q.layer, q.name): q for q in demo.quantities}
    for layer in range(3):
        for name in ("queries", "keys", "values", "head values (before W_O)"):
            q = by_name[(layer, name)]
            assert q.changed > 0.3  # changed completely ...
            assert q.restored < 1e-9  # ... and exactly by the rotation
        for name in ("attention probabilities", "head outputs (W_O z, per head)"):
            assert by_name[(layer, name)].changed < 1e-9
    assert by_name[(2, "model output")].changed < 1e-9
    assert demo.passed and demo.tolerance == 1e-9
    assert demo.control_broken and max(e.max_rel_error for e in demo.control) > 1e-2
    original, rotated = demo.examples["q"]
    assert original.shape == rotated.shape == (17, 16)
    assert not torch.allclose(original, rotated, atol=1e-3)
    assert demo.examples["layer"] == 1 and demo.examples["head"] == 2


def test_residual_permutation_is_a_symmetry_and_a_rotation_is_not(digits64):
    comparison = rotation.residual_rotation(*digits64, key=3)
    assert max(e.max_rel_error for e in comparison.symmetry) < 1e-9
    assert max(e.max_rel_error for e in comparison.broken) > 1e-2
    notes = comparison.notes
    assert "LayerNorm" in notes["kind"]
    # LayerNorm with gain 1, bias 0 still breaks under a rotation (the mean direction is not kept).
    assert notes["gain 1, bias 0"]["rotation"] > 1e-2 and notes["gain 1, bias 0"]["permutation"] < 1e-12


def test_rope_keeps_plane_rotations_only():
    loaded = load_model("random:llama", dtype=torch.float64)
    comparison = rotation.rope_rotations(loaded.model, default_inputs(loaded), key=4)
    assert max(e.max_rel_error for e in comparison.symmetry) < 1e-9
    assert max(e.max_rel_error for e in comparison.broken) > 1e-2
    demo = rotation.rotation_demo(loaded.model, default_inputs(loaded), key=4)
    assert demo.passed and demo.control_broken
    # RMSNorm with gain 1 commutes with every rotation: only its gain breaks the residual rotation.
    notes = rotation.residual_rotation(loaded.model, default_inputs(loaded), key=4).notes
    assert "RMSNorm" in notes["kind"] and notes["gain 1, bias 0"]["rotation"] < 1e-12
    assert notes["model's gain and bias"]["rotation"] > 1e-2


def test_rope_section_refuses_a_model_without_rope(digits64):
    with pytest.raises(ValueError, match="rotary"):
        rotation.rope_rotations(*digits64, key=1)
