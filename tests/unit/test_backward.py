"""Gradients and SGD steps commute with every symmetry, to the perm_core tolerances; controls break."""

import copy
import math

import pytest
import torch

from perm_core.applications import backward as bw
from perm_core.models.digits import digits_split
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.models.registry import load_model
from perm_core.verify.subject import Subject

ALL_KEYS = {"tokens": 3, "channels": 7, "heads": 1, "head_channels": 5, "mlp": 2, "rotation": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vit64():
    return load_model("digits-vit", dtype=torch.float64).model


@pytest.fixture(scope="module")
def batch():
    train_x, train_y, _, _ = digits_split()
    return train_x[:16], train_y[:16]


def test_classifier_gradients_unscramble_exactly_in_float64(vit64, batch):
    x, _ = batch
    loss = bw.Loss("class", torch.tensor([3]))
    names = ["vit.layers.0.attention.q_proj.weight", "vit.layers.2.mlp.fc1.weight"]
    result = bw.compare_gradients(vit64, {"pixel_values": x[:1].double()}, loss, ALL_KEYS, names)
    assert abs(result.loss_original - result.loss_scrambled) < 1e-12
    assert result.loss_original > 0.01  # a real loss with a real gradient
    assert set(result.original) == {"grad.input", *(f"grad.param.{n}" for n in names)}
    assert result.max_rel_error < 1e-9 and result.passed
    # The scrambled world's gradients really are moved (this is not a trivial comparison).
    moved = result.scrambled["grad.param.vit.layers.0.attention.q_proj.weight"]
    assert (moved - result.original["grad.param.vit.layers.0.attention.q_proj.weight"]).abs().max() > 1e-3


@pytest.mark.parametrize("family,kind", [("bert", "similarity"), ("llama", "next_token"), ("gpt2", "next_token")])
def test_text_losses_gradients_unscramble(family, kind):
    model = load_model(f"random:{family}", dtype=torch.float64).model
    inputs = random_inputs(family, model, 0)
    subject = bw.Subject(model, inputs)
    reference = torch.randn(subject.geometry.d_model, dtype=torch.float64)
    loss = bw.Loss(kind, reference=reference if kind == "similarity" else None)
    keys = {"tokens": 3, "channels": 7, "mlp": 2}
    result = bw.compare_gradients(model, inputs, loss, keys)
    assert abs(result.loss_original - result.loss_scrambled) < 1e-9
    assert result.max_rel_error < 1e-9
    assert result.original["grad.input"].abs().max() > 1e-6


def test_sgd_lockstep_float64_and_float32(vit64, batch):
    x, y = batch
    loss = bw.Loss("class", y)
    result = bw.sgd_lockstep(vit64, {"pixel_values": x.double()}, loss, {"channels": 7, "tokens": 3, "mlp": 2},
                             steps=3, lr=0.05)
    assert [s.step for s in result.steps] == [0, 1, 2, 3]
    assert result.max_rel_error < 1e-9 and result.passed
    losses = [s.loss_original for s in result.steps]
    assert losses[0] != losses[-1]  # the weights really moved
    assert all(abs(s.loss_original - s.loss_scrambled) < 1e-9 for s in result.steps)
    vit32 = load_model("digits-vit").model
    result32 = bw.sgd_lockstep(vit32, {"pixel_values": x}, loss, {"channels": 7}, steps=2, lr=0.05)
    assert 0 < result32.max_rel_error < 1e-4


@pytest.mark.parametrize("control", ["norms_not_permuted", "residual_rotation"])
def test_sgd_lockstep_negative_controls_break_after_training(vit64, batch, control):
    x, y = batch
    result = bw.sgd_lockstep(vit64, {"pixel_values": x.double()}, bw.Loss("class", y), {"channels": 7},
                             steps=2, lr=0.05, control=control)
    assert result.trained and result.broken and not result.passed and result.verdict == "broken"
    assert result.steps[0].update_rel_error == 0  # nothing trained yet: step 0 is never the evidence
    assert all(s.update_rel_error > 1e-2 for s in result.steps[1:])  # the trainings diverge from step 1
    assert result.max_rel_error > 1e-2


@pytest.mark.parametrize("lr,steps", [(0.0, 3), (0.05, 0)])
def test_control_without_training_is_not_broken(vit64, batch, lr, steps):
    """A control is judged on its training: with nothing trained there is nothing to break."""
    x, y = batch
    result = bw.sgd_lockstep(vit64, {"pixel_values": x.double()}, bw.Loss("class", y), {"channels": 7},
                             steps=steps, lr=lr, control="norms_not_permuted")
    assert len(result.steps) == steps + 1
    assert not result.trained and not result.broken and not result.passed
    assert result.verdict == "nothing was trained"
    assert result.max_rel_error == 0 and result.max_param_error == 0


def test_true_symmetry_passes_on_the_updates(vit64, batch):
    x, y = batch
    result = bw.sgd_lockstep(vit64, {"pixel_values": x.double()}, bw.Loss("class", y), {"channels": 7, "heads": 1},
                             steps=3, lr=0.0003)
    assert result.trained and result.passed and not result.broken and result.verdict == "passed"
    assert 0 < result.max_rel_error < 1e-9 and result.max_param_error < 1e-12


def test_nan_in_a_parameter_fails(vit64, batch):
    x, y = batch
    model = copy.deepcopy(vit64)
    with torch.no_grad():
        model.vit.layers[0].mlp.fc1.weight[0, 0] = float("nan")
    result = bw.sgd_lockstep(model, {"pixel_values": x.double()}, bw.Loss("class", y), {"channels": 7},
                             steps=1, lr=0.05)
    assert not result.passed and result.verdict == "failed"
    assert result.max_rel_error == math.inf and result.max_param_error == math.inf


def test_params_error_counts_a_nan_as_inf():
    expected = {"a": torch.ones(3, dtype=torch.float64), "b": torch.ones(2, dtype=torch.float64)}
    assert bw.params_error(expected, {n: t.clone() for n, t in expected.items()}) == (0.0, 0.0)
    broken = {"a": torch.tensor([1.0, float("nan"), 1.0], dtype=torch.float64), "b": expected["b"]}
    assert bw.params_error(expected, broken) == (math.inf, math.inf)
    assert bw.params_error(broken, expected) == (math.inf, math.inf)


def test_bad_control_name_is_refused(vit64, batch):
    x, y = batch
    with pytest.raises(ValueError, match="no negative control"):
        bw.sgd_lockstep(vit64, {"pixel_values": x.double()}, bw.Loss("class", y), {"channels": 7}, control="nope")


def test_losses_for_each_family(vit64):
    assert bw.losses_for(vit64) == ["class"]
    assert bw.losses_for(load_model("random:llama").model)[0] == "next_token"
    assert bw.losses_for(load_model("random:bert").model) == ["similarity"]


def test_text_input_gradient_with_only_one_weight_chosen():
    model = load_model("random:bert", dtype=torch.float64).model
    inputs = random_inputs("bert", model, 0)
    loss = bw.Loss("similarity", reference=torch.randn(model.config.hidden_size, dtype=torch.float64))
    weight = "bert.encoder.layer.0.attention.self.query.weight"
    result = bw.compare_gradients(model, inputs, loss, {"channels": 1}, [weight])
    assert set(result.original) == {"grad.input", "grad.param.bert.encoder.layer.0.attention.self.query.weight"}
    assert result.max_rel_error < 1e-9


def test_a_comparison_keeps_only_the_gradients_asked_for_and_still_compares_every_one():
    model, _ = build_random_model("bert", dtype=torch.float64, seed=3)
    inputs = random_inputs("bert", model, seed=3)
    subject = Subject(model, inputs)
    loss = bw.make_loss("similarity", subject, 0, inputs)
    kept = ["grad.input", "grad.param.bert.encoder.layer.0.attention.self.query.weight"]
    full = bw.compare_gradients(model, inputs, loss, {"channels": 5})
    lean = bw.compare_gradients(model, inputs, loss, {"channels": 5}, keep=kept)
    assert set(lean.original) == set(lean.scrambled) == set(lean.unscrambled) == set(kept)
    assert lean.errors == full.errors and len(lean.errors) == len(full.original) > len(kept)
    assert all(torch.equal(lean.unscrambled[n], full.unscrambled[n]) for n in kept)
