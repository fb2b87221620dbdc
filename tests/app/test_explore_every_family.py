"""AppTest: Explore works on a random model of every supported family, every symmetry on, in float64 (the
symmetry matrix links every cell here), and the proof chart shows what the family has."""

import pytest

from perm_core.families import family_names
from perm_core.symmetries import SYMMETRIES
from tests.app.test_explore import charts, explore, proof_errors, title

ALL_ON = {f"on_{name}": "1" for name in SYMMETRIES}


@pytest.mark.parametrize("family", family_names())
def test_every_family_explores_exactly_with_every_symmetry(family):
    from perm_core.families import geometry_of
    from perm_core.random_models import build_random_model

    missing = geometry_of(build_random_model(family)[0]).not_holding()
    on = {**ALL_ON, **{f"on_{name}": "0" for name in missing}}
    at = explore(model=f"random:{family}", dtype="float64", **on)
    assert at.sidebar.selectbox(key="model").value == f"random:{family}"
    assert at.success and not at.error, [e.value for e in at.error]
    assert "un-scrambled tensors match" in at.success[0].value
    errors = proof_errors(at)
    assert errors and max(errors.values()) <= 1e-9
    assert all(title(c) or c["data"] for c in charts(at))
