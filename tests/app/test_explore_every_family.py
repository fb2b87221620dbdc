"""AppTest: Explore works on a random model of every supported family, every symmetry on, in float64 (the
symmetry matrix links every cell here), and the proof chart shows what the family has."""

import pytest

from perm_core.engine.symmetries import SYMMETRIES
from perm_core.families import family_names
from tests.app.test_explore import block_views, charts, explore, in_each_view, proof_errors, title

ALL_ON = {f"on_{name}": "1" for name in SYMMETRIES}


@pytest.mark.parametrize("family", family_names())
def test_every_family_explores_exactly_with_every_symmetry(family):
    from perm_core.families import geometry_of
    from perm_core.models.random_models import build_random_model

    geometry = geometry_of(build_random_model(family)[0])
    missing = {**geometry.not_holding(), **geometry.not_applicable()}  # experts: on mixtures of experts only
    on = {**ALL_ON, **{f"on_{name}": "0" for name in missing}}
    at = explore(model=f"random:{family}", dtype="float64", **on)
    assert at.sidebar.selectbox(key="model").value == f"random:{family}"
    assert at.success and not at.error, [e.value for e in at.error]
    assert "un-scrambled tensors match" in at.success[0].value
    errors = proof_errors(at)
    assert errors and max(errors.values()) <= 1e-9
    drawn = [c for shown in in_each_view(at, charts).values() for c in shown]  # the block's views, one by one
    assert all(title(c) or c["data"] for c in drawn)
    # a mixture of experts has no dense MLP activation to view (capture.output_projection), its routing instead
    assert sum("MLP neurons of block" in title(c) for c in drawn) == (0 if geometry.n_experts else 3)
    assert ("experts" in block_views(at)) == bool(geometry.n_experts)


def test_the_mlp_caption_counts_the_neurons_its_own_run_moved():
    import re

    import torch

    from perm_core.explore.exploration import Exploration
    from perm_core.explore.mlp_view import mlp_view
    from perm_core.models.input_spec import inputs_from_spec
    from perm_core.models.registry import load_model

    at = explore(model="digits-vit", dtype="float64", on_mlp="1", k_mlp="21", on_tokens="0", on_channels="0",
                 layer="1", block_view="mlp")
    caption = next(c.value for c in at.caption if "The MLP key moved" in c.value)
    moved, total = map(int, re.search(r"moved (\d+) of (\d+) neurons", caption).groups())
    loaded = load_model("digits-vit", dtype=torch.float64)
    explorer = Exploration(loaded.model, inputs_from_spec(loaded, "digit:0"))  # the sidebar's default input
    result = explorer.run({"mlp": 21})
    view = mlp_view(explorer, result, explorer.params_for(result.scramble, {"mlp": 21}, None)[0], 1)
    assert (moved, total) == (int((view.held != torch.arange(total)).sum()), explorer.geometry.d_mlp)
    assert f"{view.max_rel_error:.1e}" in caption


def test_t5_with_the_default_keys_says_tokens_is_not_its_symmetry():
    """T5 with the sidebar's defaults (tokens on): the verdict is a warning that says why, beside the sidebar's
    note under the tokens switch; with tokens off the note is gone and the verdict passes."""
    at = explore(model="random:t5", dtype="float64")
    assert not at.success and not at.error, [e.value for e in at.error]
    verdict = at.warning[0].value
    assert "NOT identical" in verdict and "tokens is not a symmetry of this model" in verdict
    notes = [c.value for c in at.sidebar.caption if "Not a symmetry of this model" in c.value]
    assert len(notes) == 1 and "relative position bias" in notes[0]

    at = explore(model="random:t5", dtype="float64", on_tokens="0")
    assert at.success and "un-scrambled tensors match" in at.success[0].value
    assert not [c for c in at.sidebar.caption if "Not a symmetry" in c.value]
    assert not [w for w in at.warning if "not a symmetry" in w.value]
