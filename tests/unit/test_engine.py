"""Every symmetry x family x direction, in float64 and float32; every negative control breaks."""

from __future__ import annotations

import pytest
import torch

from perm_core import symmetries
from perm_core.random_models import build_random_model, random_inputs
from perm_core.verify import TOLERANCE, check

CLASSES = {
    "vit": ["ViTModel", "ViTForImageClassification"],
    "bert": ["BertModel", "BertForMaskedLM", "BertForSequenceClassification"],
    "gpt2": ["GPT2Model", "GPT2LMHeadModel"],
    "llama": ["LlamaModel", "LlamaForCausalLM"],
}
CASES = [(family, cls, dtype) for family, classes in CLASSES.items() for cls in classes
         for dtype in (torch.float64, torch.float32)]
_reports = {}


def report_for(family, cls, dtype):
    if (family, cls, dtype) not in _reports:
        model, _ = build_random_model(family, model_class=cls, dtype=dtype, seed=3)
        _reports[family, cls, dtype] = check(model, random_inputs(family, model, seed=3), key=12345)
    return _reports[family, cls, dtype]


@pytest.mark.parametrize("family,cls,dtype", CASES, ids=[f"{c}-{str(d)[6:]}" for _, c, d in CASES])
@pytest.mark.parametrize("symmetry", [*symmetries.SYMMETRIES, "all"])
def test_symmetry_holds_forward_and_backward(family, cls, dtype, symmetry):
    report = report_for(family, cls, dtype)
    results = {c.direction: c for c in report.checks if c.symmetry == symmetry}
    assert set(results) == {"forward", "backward"}
    for direction, result in results.items():
        assert result.tolerance == TOLERANCE[dtype]
        assert result.passed, (direction, [(t.name, t.max_rel_error) for t in result.tensors
                                           if t.max_rel_error > result.tolerance])
        assert result.max_rel_error <= TOLERANCE[dtype]
    names = {t.name for t in results["forward"].tensors}
    assert "blocks.0.attn" in names and "blocks.1.hidden" in names and "embed" in names
    grads = {t.name for t in results["backward"].tensors}
    assert "grad.input" in grads and any(n.startswith("grad.param.") for n in grads)


@pytest.mark.parametrize("family,cls,dtype", CASES, ids=[f"{c}-{str(d)[6:]}" for _, c, d in CASES])
def test_every_negative_control_breaks(family, cls, dtype):
    report = report_for(family, cls, dtype)
    assert report.controls, "each symmetry needs negative controls"
    for control in report.controls:
        assert control.broken, (control.symmetry, control.name, control.max_rel_error)
        assert control.max_rel_error > 1e-2
    covered = {c.symmetry for c in report.controls}
    assert covered == set(symmetries.SYMMETRIES)
    assert report.passed


def test_rope_controls_are_specific_to_llama():
    names = {c.name for c in report_for("llama", "LlamaModel", torch.float64).controls}
    assert {"general_rotation_with_rope", "qk_channels_with_rope"} <= names
    assert "general_rotation_with_rope" not in {c.name for c in report_for("gpt2", "GPT2Model",
                                                                               torch.float64).controls}


def test_errors_are_at_float64_roundoff_not_just_below_tolerance():
    report = report_for("bert", "BertForMaskedLM", torch.float64)
    assert max(c.max_rel_error for c in report.checks if c.direction == "forward") < 1e-12
    # gradients too, apart from the key biases whose exact gradient is zero (pure round-off)
    grads = [t for c in report.checks if c.direction == "backward" for t in c.tensors if "key.bias" not in t.name]
    assert max(t.max_rel_error for t in grads) < 1e-12


def test_scrambled_model_really_differs():
    """The transformed weights and the scrambled activations are far from the originals."""
    from perm_core.verify import Subject

    model, _ = build_random_model("gpt2", dtype=torch.float64)
    subject = Subject(model, random_inputs("gpt2", model))
    scramble = subject.build({"channels": 1, "tokens": 1})
    params = subject.transformed_params(scramble)
    name = "transformer.h.0.ln_1.weight"
    assert not torch.equal(params[name], subject.params[name])
    scrambled = subject.trace(scramble)["blocks.0.hidden"].tensor
    original = subject.trace()["blocks.0.hidden"].tensor
    assert (scrambled - original).abs().max() > 0.1
