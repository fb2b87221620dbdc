"""`check` passes on every offline zoo model, with real weights and real inputs."""

from __future__ import annotations

import pytest
import torch

from perm_core.models import registry
from perm_core.models.defaults import default_inputs
from perm_core.verify.check import check


@pytest.mark.parametrize("name", ["digits-vit", "minilm"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_check_passes_on_shipped_and_wheel_models(name, dtype):
    loaded = registry.load_model(name, dtype=dtype)
    report = check(loaded.model, default_inputs(loaded), key=2024, model_name=name)
    failing = [(c.symmetry, c.direction, c.max_rel_error) for c in report.checks if not c.passed]
    assert not failing
    assert all(c.broken for c in report.controls), [(c.name, c.max_rel_error) for c in report.controls]
    assert report.passed
    bound = 1e-11 if dtype == torch.float64 else 1e-5
    assert max(c.max_rel_error for c in report.checks if c.direction == "forward") < bound


@pytest.mark.slow
@pytest.mark.parametrize("key", [1, 3])  # both failed float32 at a fixed 1e-4 (a layer-norm gradient at 1.1e-4)
def test_check_passes_on_smollm2_in_float32(smollm, key):
    loaded = registry.load_model("smollm2-135m", dtype=torch.float32)
    report = check(loaded.model, default_inputs(loaded), key=key, model_name="smollm2-135m")
    assert report.family == "llama"
    assert report.passed, [(c.symmetry, c.direction, c.max_rel_error) for c in report.checks if not c.passed] + [
        (c.name, c.max_rel_error) for c in report.controls if not c.broken]
