"""The MLP-neuron view: the activations the MLP symmetry moves, found through the spec in every family."""

import pytest
import torch

from perm_core.explore.exploration import Exploration
from perm_core.explore.mlp_view import mlp_view, output_projection
from perm_core.families import family_by_name, family_names
from perm_core.models.random_models import build_random_model, random_config, random_inputs

# A mixture of experts has no dense MLP activation to view (capture.output_projection)
DENSE = [family for family in family_names() if not family_by_name(family).geometry(random_config(family)).n_experts]


def explored(family: str):
    model, _ = build_random_model(family, dtype=torch.float64, seed=3)
    return Exploration(model, random_inputs(family, model, seed=3))


@pytest.mark.parametrize("family", DENSE)
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


def test_the_original_activation_is_computed_once_and_every_forward_stops_at_the_shown_block(monkeypatch):
    """Every key change of every session needs the same original activation; and a forward that reached the
    shown block has computed everything shown. The values are those of a full forward."""
    from perm_core.run import capture as view_module  # the stopped forward of the MLP view

    explorer = explored("gpt2")
    model = explorer.subject.model
    reached = []
    handles = [block.register_forward_pre_hook(lambda _m, _a, i=i: reached.append(i))
               for i, block in enumerate(model.transformer.h)]
    calls = []
    real_call = view_module.functional_call
    monkeypatch.setattr(view_module, "functional_call", lambda *a, **k: calls.append(1) or real_call(*a, **k))
    try:
        views = []
        for key, forwards in ((7, 2), (8, 1)):  # the second key change reuses the original activation
            keys = {"mlp": key, "channels": 3}
            result = explorer.run(keys)
            params, _ = explorer.params_for(result.scramble, keys, None)
            reached.clear()
            views.append(mlp_view(explorer, result, params, 0))
            assert reached == [0] * forwards  # block 0 shown: no forward went on to block 1
    finally:
        for handle in handles:
            handle.remove()
    assert len(calls) == 3 and len(model.transformer.h) > 1

    captured = []
    handle = model.transformer.h[0].mlp.c_proj.register_forward_pre_hook(lambda _m, a: captured.append(a[0]))
    try:
        with torch.no_grad():
            model(**explorer.subject.inputs)  # a full forward of the original model
    finally:
        handle.remove()
    assert torch.equal(views[0].original, captured[0][0]) and torch.equal(views[1].original, captured[0][0])
    assert views[0].max_rel_error <= 1e-12 and views[1].max_rel_error <= 1e-12
    assert not torch.equal(views[0].scrambled, views[1].scrambled)


@pytest.mark.parametrize("family", DENSE)
def test_the_run_records_the_shown_block_as_its_own_forward_would(family):
    """Explore names the MLP view's block before its run: the traced forward records the activation, and the view
    built from it equals the one a forward of its own gives, bit for bit."""
    explorer = explored(family)
    keys = {"mlp": 7, "channels": 3}
    layer = explorer.geometry.n_layers - 1
    recorded = explorer.run(keys, mlp_layer=layer)
    assert set(recorded.mlp_inputs) == {layer}
    from_run = mlp_view(explorer, recorded, None, layer)
    plain = explorer.run(keys)
    assert plain.mlp_inputs == {}
    own_forward = mlp_view(explorer, plain, explorer.params_for(plain.scramble, keys, None)[0], layer)
    for field in ("original", "scrambled", "restored"):
        assert torch.equal(getattr(from_run, field), getattr(own_forward, field)), field
    assert from_run.max_rel_error == own_forward.max_rel_error <= 1e-12
    with pytest.raises(ValueError, match="not recorded"):
        mlp_view(explorer, recorded, None, 0)


def test_a_capture_sees_its_own_thread_only():
    """The hook stays on the shared model; a forward in another thread, while this thread captures, leaves the
    capture alone and is itself unchanged."""
    import threading

    from perm_core.run.capture import capturing

    explorer = explored("gpt2")
    model, inputs = explorer.subject.model, explorer.subject.inputs
    with torch.no_grad():
        expected = model(**inputs).logits
    module = output_projection(explorer, 0)
    other = {}

    def forward_elsewhere():
        with torch.no_grad():
            other["logits"] = model(**inputs).logits

    with capturing(model, module) as box:
        thread = threading.Thread(target=forward_elsewhere)
        thread.start()
        thread.join()
        assert "input" not in box  # the other thread's forward passed the hook unrecorded
        with torch.no_grad():
            mine = model(**inputs).logits
    assert box["input"].shape[-1] == explorer.geometry.d_mlp
    assert torch.equal(other["logits"], expected) and torch.equal(mine, expected)
    with torch.no_grad():
        model(**inputs)  # after the capture, nothing records
    assert len(model.get_submodule(module)._forward_pre_hooks) == 1
