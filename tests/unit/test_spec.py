"""The spec engine: every parameter claimed, transforms invert and compose, the model is never mutated."""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from perm_core.engine.spec import Scramble, UnclaimedParameterError, transform_params
from perm_core.engine.transforms import BlockOrthogonal, Permutation
from perm_core.families import UnsupportedModelError, family_of
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify.subject import Subject


def test_unclaimed_parameter_is_an_error():
    model, _ = build_random_model("vit")
    model.register_parameter("mystery_scale", torch.nn.Parameter(torch.ones(32)))
    with pytest.raises(UnclaimedParameterError, match="mystery_scale"):
        Subject(model)


@pytest.mark.parametrize("config", [
    hf.DebertaV2Config(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                       intermediate_size=64),
    hf.FNetConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, intermediate_size=64),  # (T5 is supported now)
])
def test_other_architectures_are_refused_by_name(config):
    model = hf.AutoModel.from_config(config)
    with pytest.raises(UnsupportedModelError, match=r"not supported\. Supported: vit .*bert .*gpt2 .*llama"):
        family_of(model)


def test_supported_family_with_unsupported_head_is_refused():
    # Every BERT head is supported now (tests/unit/test_head_classes.py); ViT's masked-image-modeling head is not.
    model = hf.ViTForMaskedImageModeling(hf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                      intermediate_size=64, image_size=8, patch_size=4,
                                                      encoder_stride=4))
    with pytest.raises(UnsupportedModelError, match="ViTForMaskedImageModeling is not supported: a masked-image"):
        family_of(model)


def test_permutation_and_rotation_invert_and_compose():
    torch.manual_seed(0)
    x = torch.randn(3, 12, dtype=torch.float64)
    p = Permutation(torch.randperm(12))
    q, _ = torch.linalg.qr(torch.randn(3, 4, 4, dtype=torch.float64))
    r = BlockOrthogonal(q)
    assert torch.equal(p.inverse().apply(p.apply(x, 1), 1), x)
    assert torch.allclose(r.inverse().apply(r.apply(x, 1), 1), x, atol=1e-14)
    assert torch.allclose(r.apply(x, 1), x @ r.matrix().T, atol=1e-14)
    assert torch.equal(p.apply(x, 1), x @ p.matrix().T)
    a, b = Scramble({("resid", None): (p,)}), Scramble({("resid", None): (r,)})
    both = a.then(b)
    assert len(both.chain("resid")) == 2
    expected = r.apply(p.apply(x, 1), 1)
    from perm_core.engine.spec import apply_axes
    assert torch.allclose(apply_axes(x, (None, "resid"), both), expected)
    assert torch.allclose(apply_axes(expected, (None, "resid"), both.inverse()), x, atol=1e-14)


def test_composed_token_permutations():
    a = Scramble(tokens=Permutation(torch.tensor([2, 0, 1])))
    b = Scramble(tokens=Permutation(torch.tensor([1, 2, 0])))
    x = torch.tensor([[10, 11, 12]])
    from perm_core.engine.spec import apply_axes
    step = apply_axes(apply_axes(x, (None, "tokens"), a), (None, "tokens"), b)
    assert torch.equal(apply_axes(x, (None, "tokens"), a.then(b)), step)


def test_original_model_is_never_modified():
    model, _ = build_random_model("llama", dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    subject = Subject(model, random_inputs("llama", model))
    scramble = subject.build({"channels": 5, "heads": 5, "rotation": 5, "tokens": 5})
    subject.trace(scramble, backward=True)
    transform_params(subject.params, subject.spec, scramble)
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), name
        assert param.grad is None
