"""The small public API in perm_core/__init__.py: load a model, check it, scramble its weights, compare two models;
and `import perm_core` alone imports neither torch nor transformers."""

import subprocess
import sys

import pytest
import torch

import perm_core


def test_import_is_light():
    code = "import sys, perm_core; print('torch' in sys.modules, 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "False", "False"]


def test_load_check_scramble_compare():
    loaded = perm_core.load_model("random:gpt2", torch.float64)
    inputs = perm_core.default_inputs(loaded)
    report = perm_core.check(loaded.model, inputs, ["channels", "mlp"], key=7)
    assert report.passed and report.oracle.passed and {c.symmetry for c in report.checks} == {"channels", "mlp", "all"}
    weights = perm_core.scramble(loaded.model, ["channels", "mlp"], key=7)
    original = dict(loaded.model.named_parameters())
    assert weights.keys() == original.keys()
    assert any(not torch.equal(weights[n], p) for n, p in original.items())  # the weights moved
    other = perm_core.load_model("random:gpt2", torch.float64)
    with torch.no_grad():
        for name, parameter in other.model.named_parameters():
            parameter.copy_(weights[name])
    comparison = perm_core.compare(loaded.model, other.model, [inputs])
    assert comparison.same_function and comparison.element_recovered
    with pytest.raises(ValueError, match="tokens permute the input"):
        perm_core.scramble(loaded.model, ["tokens"], key=7)
    with pytest.raises(AttributeError):
        perm_core.no_such_thing  # noqa: B018
    assert set(perm_core.__all__) <= set(dir(perm_core))
