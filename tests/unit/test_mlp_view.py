"""The MLP-neuron view: the activations the MLP symmetry moves, found through the spec in every family."""

import pytest
import torch

from perm_core.explore import Exploration
from perm_core.families import family_names
from perm_core.mlp_view import mlp_view, output_projection
from perm_core.random_models import build_random_model, random_inputs


def explored(family: str):
    model, _ = build_random_model(family, dtype=torch.float64, seed=3)
    return Exploration(model, random_inputs(family, model, seed=3))


@pytest.mark.parametrize("family", family_names())
def test_neurons_move_as_the_key_says_and_come_back(family):
    explorer = explored(family)
    keys = {"mlp": 7, "channels": 3}
    result = explorer.run(keys)
    params, _ = explorer.params_for(result.scramble, keys, None)
    layer = explorer.geometry.n_layers - 1
    view = mlp_view(explorer, result, params, layer)
    assert view.original.shape[-1] == explorer.geometry.d_mlp
    assert view.max_rel_error <= 1e-12
    # Column i of the scrambled activations is neuron held[i] of the original: the permutation itself.
    assert torch.allclose(view.scrambled, view.original[:, view.held], rtol=0, atol=1e-12 * view.original.abs().max())
    assert not torch.equal(view.held, torch.arange(len(view.held)))


def test_a_broken_mlp_shows_in_the_view():
    """The negative control (down projection not permuted) still moves the neurons, but the block's output
    no longer matches: the view's activations match, the proof does not."""
    explorer = explored("gpt2")
    result = explorer.run({"mlp": 7}, control="mlp/output_not_permuted")
    assert result.worst_rel > 1e-3
    params, _ = explorer.params_for(result.scramble, {"mlp": 7}, "mlp/output_not_permuted")
    first = mlp_view(explorer, result, params, 0)
    assert first.max_rel_error <= 1e-12  # block 0's neurons themselves are exact ...
    last = mlp_view(explorer, result, params, 1)
    assert last.max_rel_error > 1e-3  # ... but block 1 sees block 0's wrong output


def test_the_output_projection_is_named_by_the_spec():
    assert output_projection(explored("llama"), 1) == "model.layers.1.mlp.down_proj"
    assert output_projection(explored("bert"), 0) == "bert.encoder.layer.0.output.dense"
