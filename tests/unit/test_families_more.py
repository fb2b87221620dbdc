"""Mistral, Qwen2, Qwen3, DistilBERT, RoBERTa, DeiT: every symmetry forward and backward in float64 and float32,
every negative control breaks, every space moves, every parameter is claimed; the CLI check and an outside
oracle (plain transformers reloading a scrambled checkpoint). What each family adds, with its deliberate bug:
tests/unit/test_families_more_bugs.py.

The tiny random models are far from Hugging Face's init (random_models.randomize_): non-trivial norm gains,
biases and positions; Mistral/Qwen2/Qwen3 have three key/value groups of two query heads.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from perm_core import symmetries
from perm_core.__main__ import main
from perm_core.families import UnsupportedModelError, family_by_name, family_of
from perm_core.random_models import build_random_model, random_config, random_inputs
from perm_core.verify import Subject, check
from tests.unit.scrambled_checkpoints import save_and_scramble
from tests.unit.symmetry_asserts import assert_every_control_breaks, assert_symmetry_holds
from tests.unit.test_engine import unmoved_spaces

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = {
    "mistral": ["MistralForCausalLM"],
    "qwen2": ["Qwen2ForCausalLM", "Qwen2ForTokenClassification"],
    "qwen3": ["Qwen3ForCausalLM"],
    "distilbert": ["DistilBertForMaskedLM", "DistilBertForSequenceClassification"],
    "roberta": ["RobertaForMaskedLM", "RobertaForSequenceClassification"],
    "deit": ["DeiTForImageClassificationWithTeacher", "DeiTModel"],
}
CASES = [(family, cls, dtype) for family, classes in CLASSES.items() for cls in classes
         for dtype in (torch.float64, torch.float32)]
KEYS = (12345, 7)
# The control each family adds to the common ones (symmetries.controls), which must be among its controls.
OWN_CONTROLS = {"mistral": "window_not_moved", "qwen2": "window_not_moved", "qwen3": "plane_rotation_with_qk_norm",
                "distilbert": "qk_across_heads", "roberta": "qk_across_heads", "deit": "qk_across_heads"}
# Heads these families leave out, each for a reason given in its family module.
# Every head class of these families is supported now (tests/unit/test_head_classes.py); GPT-2's double-heads
# model and the vision families' masked-image-modeling heads are refused with a reason.
REFUSED = {"deit": "DeiTForMaskedImageModeling"}
_reports = {}


def report_for(family, cls, dtype, key):
    if (family, cls, dtype, key) not in _reports:
        model, _ = build_random_model(family, model_class=cls, dtype=dtype, seed=3)
        _reports[family, cls, dtype, key] = check(model, random_inputs(family, model, seed=3), key=key)
    return _reports[family, cls, dtype, key]


@pytest.mark.parametrize("family,cls,dtype", CASES, ids=[f"{c}-{str(d)[6:]}" for _, c, d in CASES])
@pytest.mark.parametrize("symmetry", [*symmetries.SYMMETRIES, "all"])
@pytest.mark.parametrize("key", KEYS)
def test_symmetry_holds_forward_and_backward(family, cls, dtype, symmetry, key):
    report = report_for(family, cls, dtype, key)
    assert report.family == family
    assert_symmetry_holds(report, symmetry, dtype)


@pytest.mark.parametrize("family,cls,dtype", CASES, ids=[f"{c}-{str(d)[6:]}" for _, c, d in CASES])
@pytest.mark.parametrize("key", KEYS)
def test_every_negative_control_breaks(family, cls, dtype, key):
    report = report_for(family, cls, dtype, key)
    assert_every_control_breaks(report)
    assert OWN_CONTROLS[family] in {c.name for c in report.controls}


@pytest.mark.parametrize("family", sorted(CLASSES))
@pytest.mark.parametrize("key", KEYS)
def test_every_space_moves_for_every_test_key(family, key):
    model, _ = build_random_model(family, seed=3)
    subject = Subject(model, random_inputs(family, model, seed=3))
    g = subject.geometry
    for name in symmetries.SYMMETRIES:
        element = subject.build({name: key})
        assert not unmoved_spaces(element), (name, unmoved_spaces(element))
        if name == "tokens":
            index = element.tokens.index
            assert torch.equal(index[:g.fixed_tokens], torch.arange(g.fixed_tokens))
            assert not torch.equal(index, torch.arange(subject.n_tokens))
    if g.n_kv_heads > 1:  # the key/value groups themselves move, in every layer
        element = subject.build({"heads": key})
        for layer in range(g.n_layers):
            groups = element.spaces[("k", layer)][0].index.view(g.n_kv_heads, g.head_dim)[:, 0] // g.head_dim
            assert not torch.equal(groups, torch.arange(g.n_kv_heads)), layer


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_every_listed_class_is_claimed_whole_and_the_left_out_heads_are_refused(family):
    config = random_config(family)
    for cls in family_by_name(family).classes:
        model = getattr(hf, cls)(config)
        assert family_of(model).name == family
        assert family_of(model).spec(config).unclaimed(dict(model.named_parameters())) == [], cls
    if family in REFUSED:
        with pytest.raises(UnsupportedModelError):
            family_of(getattr(hf, REFUSED[family])(config))


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_cli_check_passes_in_float64(family, capsys):
    assert main(["check", f"random:{family}", "--dtype", "float64"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASSED")


# Stock RMSNorm (Mistral, Qwen2, Qwen3, q_norm/k_norm included) normalizes in float32 even in a float64
# model, so permuting the channels it sums over moves its result by float32 round-off (tests/unit/test_oracle.py).
FLOAT32_NORMS = {"mistral", "qwen2", "qwen3"}
NORMS = {"mistral": "model.layers.0.input_layernorm.weight", "qwen2": "model.layers.0.input_layernorm.weight",
         "qwen3": "model.layers.0.input_layernorm.weight",
         "distilbert": "distilbert.transformer.layer.0.sa_layer_norm.weight",
         "roberta": "roberta.encoder.layer.0.output.LayerNorm.weight", "deit": "deit.layers.0.layernorm_before.weight"}


@pytest.mark.parametrize("family", sorted(CLASSES))
def test_scrambled_checkpoint_reloaded_by_plain_transformers_gives_the_same_logits(tmp_path, family):
    cls = CLASSES[family][0]
    model, _ = build_random_model(family, model_class=cls, dtype=torch.float64, seed=4)
    assert save_and_scramble(model, tmp_path)["dtype"] == "float64"

    def plain(directory):
        return getattr(hf, cls).from_pretrained(directory, dtype=torch.float64, attn_implementation="sdpa").eval()

    original, scrambled = plain(tmp_path / "original"), plain(tmp_path / "scrambled")
    inputs = random_inputs(family, model, seed=4)
    inputs = {k: v.to(torch.float64) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        want, got = original(**inputs).logits, scrambled(**inputs).logits
    error = ((got - want).abs().max() / want.abs().max()).item()
    assert error < (1e-5 if family in FLOAT32_NORMS else 1e-12), error
    moved = max(((a - b).abs().max() / a.abs().max()).item()
                for (name, a), b in zip(original.named_parameters(), scrambled.parameters(), strict=True)
                if a.shape == b.shape and "norm" not in name.lower())
    assert moved > 0.1  # the checkpoint really is scrambled

    with torch.no_grad():  # negative control: one gain left in the original channel order
        dict(scrambled.named_parameters())[NORMS[family]].copy_(dict(original.named_parameters())[NORMS[family]])
        broken = scrambled(**inputs).logits
    assert ((broken - want).abs().max() / want.abs().max()).item() > 1e-3
