"""`check` with a key per symmetry equals the checks of each symmetry with its own key, and records the keys."""

import torch

from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify.check import check


def test_a_key_per_symmetry_is_each_symmetry_checked_with_its_own_key():
    model, _ = build_random_model("llama", dtype=torch.float64, seed=2)
    inputs = random_inputs("llama", model, seed=2)
    both = check(model, inputs, ["heads", "mlp"], {"heads": 5, "mlp": 9}, include_combined=False)
    heads, mlp = check(model, inputs, ["heads"], 5), check(model, inputs, ["mlp"], 9)
    assert both.keys == {"heads": 5, "mlp": 9} and both.to_json()["keys"] == {"heads": 5, "mlp": 9}
    assert [c.max_rel_error for c in both.controls] == [c.max_rel_error for c in heads.controls + mlp.controls]
    assert [c.moved for c in both.checks] == [c.moved for c in heads.checks + mlp.checks]
    other = check(model, inputs, ["heads"], 6)  # another key moves the weights differently
    assert [c.moved for c in other.checks] != [c.moved for c in heads.checks]
