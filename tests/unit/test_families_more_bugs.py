"""What Mistral, Qwen2, Qwen3, DistilBERT, RoBERTa and DeiT add, each proved on a tiny random model: the masks,
positions and fixed tokens we feed are the model's own, and a deliberate bug in each must fail.

Mistral windows every layer (4 positions, under the 12-token input) from one mask; Qwen2 (window switched on in
random:qwen2) windows only its second layer; Qwen3 normalizes each query/key head with a per-channel gain;
RoBERTa counts positions from padding_idx + 1; DeiT's heads read its class and distillation tokens by index.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perm_core.engine import keys, symmetries
from perm_core.engine.patches import shuffle_patches
from perm_core.engine.spec import Rule, Scramble
from perm_core.engine.tokens import model_inputs
from perm_core.engine.transforms import Permutation
from perm_core.families import deit, llama, qwen3
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.run.trace import run
from perm_core.verify.check import check
from perm_core.verify.subject import Subject

pytestmark = pytest.mark.usefixtures("one_thread")
EXACT = 1e-9  # float64
BROKEN = 1e-2
_built = {}


def subject_of(family: str, cls: str | None = None) -> Subject:
    if (family, cls) not in _built:
        model, _ = build_random_model(family, model_class=cls, dtype=torch.float64, seed=3)
        _built[family, cls] = Subject(model, random_inputs(family, model, seed=3))
    return _built[family, cls]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def worst_after_undo(subject: Subject, scramble: Scramble, records=None) -> float:
    """Largest relative error (per tensor, against its own scale) after un-scrambling one forward run."""
    original = subject.trace()
    restored = subject.unscramble(records or subject.trace(scramble), scramble)
    return max(relative(tensor, original[name].tensor) for name, tensor in restored.items())


def logits_with(subject: Subject, kwargs: dict) -> torch.Tensor:
    with torch.no_grad():
        return subject.model(**kwargs).logits


def stock_logits(subject: Subject) -> torch.Tensor:
    """The model run its own way: it builds its own mask and position ids."""
    return logits_with(subject, {k: v for k, v in subject.inputs.items()})


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_our_masks_are_the_models_own_and_the_window_matters(family):
    subject = subject_of(family)
    g = subject.geometry
    assert g.sliding_window == 4 < subject.n_tokens
    kwargs = model_inputs(subject.inputs, g, Scramble(), torch.float64)
    if family == "mistral":  # one mask for every layer, all of them sliding
        assert g.window_in_every_layer and kwargs["attention_mask"].dim() == 4
        windowless = replace(g, sliding_window=None, window_in_every_layer=False)
    else:  # layer 0 full, layer 1 sliding: one mask per layer type
        assert subject.model.config.layer_types == ["full_attention", "sliding_attention"]
        assert set(kwargs["attention_mask"]) == {"full_attention", "sliding_attention"}
        windowless = replace(g, sliding_window=None)
    valid = subject.inputs["attention_mask"][0].bool()
    stock = stock_logits(subject)[:, valid]
    assert relative(logits_with(subject, kwargs)[:, valid], stock) <= 1e-12
    no_window = logits_with(subject, model_inputs(subject.inputs, windowless, Scramble(), torch.float64))
    assert relative(no_window[:, valid], stock) > BROKEN  # the stock model does use its window


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_tokens_need_the_window_moved_with_them(family):
    subject = subject_of(family)
    g = subject.geometry
    assert worst_after_undo(subject, symmetries.build("tokens", 9, g, subject.n_tokens)) <= EXACT
    control = next(c for c in symmetries.controls("tokens", 9, g, subject.n_tokens) if c.name == "window_not_moved")
    assert worst_after_undo(subject, control.scramble) > BROKEN


def test_qwen3_q_norm_claimed_as_a_residual_norm_fails(monkeypatch):
    subject = subject_of("qwen3")
    assert check(subject.model, subject.inputs, ["channels"], key=7, backward=False).passed
    bug = Rule(llama.L + r"self_attn\.[qk]_norm\.weight", ("resid",), "norm")  # claimed first
    monkeypatch.setattr(qwen3, "FAMILY", replace(qwen3.FAMILY, rules=lambda g: (bug, *qwen3.rules(g))))
    with pytest.raises(ValueError, match="cannot act on an axis of size 12"):  # head_dim 12, d_model 48
        check(subject.model, subject.inputs, ["channels"], key=7, backward=False)


def test_qwen3_without_the_qk_norm_restriction_fails(monkeypatch):
    """Plane rotations commute with RoPE but mix Q/K channels with different q_norm/k_norm gains."""
    subject = subject_of("qwen3")
    assert symmetries.default_qk_rotation(subject.geometry) == "half_turns"
    assert check(subject.model, subject.inputs, ["rotation"], key=7, backward=False).passed
    monkeypatch.setattr(qwen3, "FAMILY", replace(qwen3.FAMILY, geometry=lambda c: replace(qwen3.geometry(c),
                                                                                          qk_norm=False)))
    report = check(subject.model, subject.inputs, ["rotation"], key=7, backward=False)
    assert not report.checks[0].passed and report.checks[0].max_rel_error > BROKEN


def test_roberta_positions_start_after_the_padding_index_as_the_model_counts_them():
    subject = subject_of("roberta")
    g, ids = subject.geometry, subject.inputs["input_ids"][0]
    pad = subject.model.config.pad_token_id
    assert g.position_offset == pad + 1 == 2
    assert ids[-1] == pad and (ids[:-1] != pad).all()  # padded as a tokenizer pads
    kwargs = model_inputs(subject.inputs, g, Scramble(), torch.float64)
    assert kwargs["position_ids"][0, :3].tolist() == [2, 3, 4]
    valid = subject.inputs["attention_mask"][0].bool()
    stock = stock_logits(subject)[:, valid]
    assert relative(logits_with(subject, kwargs)[:, valid], stock) <= 1e-12
    no_offset = model_inputs(subject.inputs, replace(g, position_offset=0), Scramble(), torch.float64)
    assert relative(logits_with(subject, no_offset)[:, valid], stock) > BROKEN


def test_distilbert_reads_the_position_ids_it_is_given():
    subject = subject_of("distilbert")
    assert "token_type_ids" not in subject.inputs
    kwargs = model_inputs(subject.inputs, subject.geometry, Scramble(), torch.float64)
    stock = stock_logits(subject)
    assert relative(logits_with(subject, kwargs), stock) <= 1e-12
    reversed_positions = {**kwargs, "position_ids": kwargs["position_ids"].flip(1)}
    assert relative(logits_with(subject, reversed_positions), stock) > BROKEN


def test_deit_keeps_its_class_and_distillation_tokens_in_place():
    subject = subject_of("deit", "DeiTForImageClassificationWithTeacher")
    g = subject.geometry
    patches = (16 // 4) ** 2
    assert (g.fixed_tokens, subject.n_tokens, subject.movable_tokens) == (2, patches + 2, patches)
    assert symmetries.key_space_bits("tokens", g, subject.n_tokens) == keys.permutation_bits(patches)
    element = symmetries.build("tokens", 9, g, subject.n_tokens)
    assert element.tokens.index[:2].tolist() == [0, 1]
    assert worst_after_undo(subject, element) <= EXACT
    # The distillation token trading places with the class token (positions moved with them): the patches stay,
    # so the pixels do too, but the class and distillation embeddings are not interchangeable.
    swap = Scramble(tokens=Permutation(torch.tensor([1, 0, *range(2, subject.n_tokens)])))
    pixels = subject.inputs["pixel_values"].to(torch.float64)
    records = run(subject.model, subject.transformed_params(swap), {"pixel_values": pixels}, g)
    assert worst_after_undo(subject, swap, records) > BROKEN
    with pytest.raises(ValueError, match="leading non-patch tokens"):  # no pixels can move those tokens
        shuffle_patches(pixels, swap.tokens, g.patch_size)


def test_deit_treated_like_vit_with_one_fixed_token_fails(monkeypatch):
    subject = subject_of("deit", "DeiTForImageClassificationWithTeacher")
    monkeypatch.setattr(deit, "FAMILY", replace(deit.FAMILY, geometry=lambda c: replace(deit.geometry(c),
                                                                                        fixed_tokens=1)))
    with pytest.raises(ValueError, match="position table holds 18 tokens"):  # its 2 + 16 rows, not 1 + 16
        check(subject.model, subject.inputs, ["tokens"], key=7, backward=False)
