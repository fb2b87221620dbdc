"""float32 over several keys on every random family: exact symmetries pass, every control breaks.
The full sweep (20 keys, every zoo model) is benchmarks/float32_sweep.py."""

from __future__ import annotations

import pytest
import torch

from perm_core.families import _registry
from perm_core.models.random_models import CONFIGS, build_random_model, random_inputs
from perm_core.verify.check import check
from perm_core.verify.tolerances import ROUNDOFF_CAP, TOLERANCE

pytestmark = pytest.mark.usefixtures("one_thread")
FAMILIES = sorted(f for f in _registry() if (f, "tiny") in CONFIGS)


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_passes_for_every_key_and_controls_break(family):
    model, _ = build_random_model(family, dtype=torch.float32, seed=5)
    inputs = random_inputs(family, model, seed=5)
    for key in range(1, 6):
        report = check(model, inputs, key=key)
        failing = [(c.symmetry, c.direction, c.max_rel_error, c.note) for c in report.checks if not c.passed]
        assert not failing, (key, failing)
        assert all(c.broken for c in report.controls), key
        for c in report.checks:
            assert all(TOLERANCE[torch.float32] <= t.tolerance <= ROUNDOFF_CAP for t in c.tensors)


def test_a_raised_tolerance_never_hides_a_real_break():
    """A control is judged by BROKEN_AT, and even the loosest float32 tolerance sits at or below it."""
    model, _ = build_random_model("llama", dtype=torch.float32, seed=5)
    report = check(model, random_inputs("llama", model, seed=5), ["channels"], key=1)
    assert all(c.max_rel_error > 10 * ROUNDOFF_CAP for c in report.controls)
