"""Gradients and SGD steps commute with every symmetry, to the perm_core tolerances; controls break."""

import pytest
import torch

from perm_core.apps import backward as bw
from perm_core.digits import digits_split
from perm_core.random_models import random_inputs
from perm_core.zoo import load_model

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
def test_sgd_lockstep_negative_controls_break(vit64, batch, control):
    x, y = batch
    result = bw.sgd_lockstep(vit64, {"pixel_values": x.double()}, bw.Loss("class", y), {"channels": 7},
                             steps=2, lr=0.05, control=control)
    assert not result.passed
    assert result.steps[-1].max_rel_error > 1e-2


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
