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


def transformers_loaded(family: str):
    """A model as a researcher's script holds it: built by transformers (its default sdpa attention, stock norms),
    weights far from init (perm_core's randomize_), never through perm_core's loader."""
    import transformers

    from perm_core.models.random_models import DEFAULT_CLASSES, random_config, randomize_

    config = random_config(family)
    config._attn_implementation = "sdpa"
    model = getattr(transformers, DEFAULT_CLASSES[family])(config).to(torch.float64)
    randomize_(model, 3)
    return model.eval()


def own_forwards(model) -> list[str]:
    return [name for name, module in model.named_modules() if "forward" in module.__dict__]


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_transformers_model_is_checked_on_exact_numerics_and_handed_back_as_it_came(family):
    from perm_core.models.random_models import random_inputs
    from perm_core.run.numerics import EXACT_EAGER

    model = transformers_loaded(family)
    inputs = random_inputs(family, model)
    assert model.config._attn_implementation == "sdpa" and own_forwards(model) == []
    before = model(**inputs)[0].detach().clone()
    report = perm_core.check(model, inputs, ["channels", "heads"], key=7, backward=False)
    assert report.passed and report.oracle.passed
    # back as it came: its own attention, no instance forwards left behind, the same outputs bit for bit
    assert model.config._attn_implementation == "sdpa" and own_forwards(model) == []
    assert torch.equal(model(**inputs)[0], before)
    # it was checked as perm_core's own model is: the same tensors (attention probabilities included) judged
    loaded = transformers_loaded(family)
    from perm_core.run.numerics import use_exact_numerics

    use_exact_numerics(loaded)
    reference = perm_core.check(loaded, inputs, ["channels", "heads"], key=7, backward=False)
    assert [sorted(t.name for t in c.tensors) for c in report.checks] == [
        sorted(t.name for t in c.tensors) for c in reference.checks]
    assert any("attn" in t.name for t in report.checks[0].tensors)
    assert [c.max_rel_error for c in report.checks] == [c.max_rel_error for c in reference.checks]
    assert loaded.config._attn_implementation == EXACT_EAGER  # a model on exact numerics stays on them
    comparison = perm_core.compare(model, model, [inputs])
    assert comparison.same_function and model.config._attn_implementation == "sdpa" and own_forwards(model) == []
