"""A negative control is first measured at block 1's MLP activation and runs in full only where that shows no
break. The early measure must itself be able to fail: a true symmetry measured the same way is at round-off, and
a model too shallow for it, or a control that does not break early, falls back to the full traced run."""

from __future__ import annotations

import pytest
import torch
import transformers

from perm_core.engine import symmetries
from perm_core.engine.symmetries import Control
from perm_core.models.random_models import DEFAULT_CLASSES, build_random_model, random_config, random_inputs, randomize_
from perm_core.run import vocabulary
from perm_core.run.numerics import use_exact_numerics
from perm_core.verify import controls as controls_module
from perm_core.verify import tolerances
from perm_core.verify.controls import run_control
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT

FAMILIES = ("vit", "bert", "gpt2", "llama", "dinov2", "gemma3", "t5")


def subject_of(family: str) -> Subject:
    model, _ = build_random_model(family, dtype=torch.float64, seed=4)
    return Subject(model, random_inputs(family, model, seed=4))


def full_run(subject: Subject, control: Control, original) -> float:
    restored = subject.unscramble(subject.trace(control.scramble), control.scramble)
    return tolerances.worst_rel(tolerances.tensor_errors(original, restored, subject.floor_reasons))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_control_breaks_early_and_the_full_run_agrees(family):
    subject = subject_of(family)
    original = subject.trace()
    names = [n for n in symmetries.SYMMETRIES if n not in subject.geometry.not_holding()]
    controls = [c for n in names for c in symmetries.controls(n, 21, subject.geometry, subject.n_tokens)]
    assert len(controls) >= 5
    for control in controls:
        result = run_control(subject, control, original)
        # on these random weights every control already breaks at block 1, so the early path is what runs here
        assert result.broken and result.measured_on == "block 1's MLP activation", (control.name, result)
        assert result.max_rel_error > BROKEN_AT
        assert full_run(subject, control, original) > BROKEN_AT, control.name  # the full run breaks too


@pytest.mark.parametrize("family", ("gpt2", "llama", "t5"))
def test_a_true_symmetry_measured_early_is_at_round_off(family):
    """The negative control of the early measure: the intended element applied as intended is not a break."""
    subject = subject_of(family)
    for name in ("channels", "heads", "mlp"):
        element = subject.build({name: 21})
        amount, where = controls_module._early_break(subject, Control(name, "intended", "the symmetry itself",
                                                              lambda e=element: e))
        assert where == "block 1's MLP activation"
        assert amount < 1e-12, (name, amount)


def test_a_control_that_does_not_break_early_is_decided_by_the_full_run(monkeypatch):
    subject = subject_of("llama")
    original = subject.trace()
    control = next(c for c in symmetries.controls("mlp", 21, subject.geometry) if c.name == "output_not_permuted")
    monkeypatch.setattr(controls_module, "_early_break", lambda *_: (0.0, "block 1's MLP activation"))
    result = run_control(subject, control, original)
    assert result.measured_on == "every traced tensor"
    assert result.broken and result.max_rel_error == pytest.approx(full_run(subject, control, original))


def test_a_one_block_model_runs_its_controls_in_full():
    config = random_config("gpt2")
    config.n_layer = 1
    model = randomize_(getattr(transformers, DEFAULT_CLASSES["gpt2"])(config).to(torch.float64), seed=4).eval()
    use_exact_numerics(model)
    subject = Subject(model, random_inputs("gpt2", model, seed=4))
    original = subject.trace()
    control = symmetries.controls("mlp", 3, subject.geometry)[0]
    assert controls_module._early_break(subject, control) is None
    result = run_control(subject, control, original)
    assert result.measured_on == "every traced tensor" and result.broken


def early_error_without_the_cut(monkeypatch, subject: Subject, control: Control) -> float:
    with monkeypatch.context() as patch:
        patch.setattr(controls_module, "cut_to_rows_read", lambda model, geometry, inputs, params, claims:
                      (params, inputs))
        return controls_module._early_break(subject, control)[0]


@pytest.mark.parametrize("family", ("bert", "gpt2", "llama", "gemma3"))
def test_the_early_measure_reads_only_the_inputs_rows_of_the_vocabulary_and_gives_the_same_error(
        family, monkeypatch):
    """The early measure transforms the vocabulary table cut to the rows the input reads (perm_core.run.vocabulary):
    every control's error is the very number the whole table gives, and the cut is what runs."""
    subject = subject_of(family)
    ids = subject.inputs["input_ids"]
    name, _ = vocabulary.input_table(subject.model)
    params, inputs = vocabulary.cut_to_rows_read(subject.model, subject.geometry, subject.inputs, subject.params,
                                                 subject.claims)
    assert params[name].shape[0] == len(ids.unique()) < subject.params[name].shape[0]
    assert torch.equal(params[name][inputs["input_ids"]], subject.params[name][ids])  # the same rows, renumbered
    names = [n for n in symmetries.SYMMETRIES if n not in subject.geometry.not_holding()]
    for control in [c for n in names for c in symmetries.controls(n, 21, subject.geometry, subject.n_tokens)]:
        assert controls_module._early_break(subject, control)[0] == early_error_without_the_cut(
            monkeypatch, subject, control), control.name


def test_a_wrong_renumbering_of_the_cut_table_is_seen(monkeypatch):
    """The negative control of the cut: ids that point at the wrong rows change the early input."""
    subject = subject_of("gpt2")
    control = next(c for c in symmetries.controls("channels", 21, subject.geometry) if c.name == "residual_rotation")
    right = controls_module._early_break(subject, control)[0]
    cut = vocabulary.cut_to_rows_read

    def shifted(*args):
        params, inputs = cut(*args)
        return params, {**inputs, "input_ids": (inputs["input_ids"] + 1) % inputs["input_ids"].max()}

    monkeypatch.setattr(controls_module, "cut_to_rows_read", shifted)
    assert controls_module._early_break(subject, control)[0] != right


def test_the_cut_keeps_a_padding_row_the_lookup_needs_and_leaves_other_inputs_alone():
    config = random_config("bert")
    config.pad_token_id = config.vocab_size - 1  # beyond the rows the input reads: the lookup asks for it
    model = randomize_(getattr(transformers, DEFAULT_CLASSES["bert"])(config).to(torch.float64), seed=4).eval()
    use_exact_numerics(model)
    subject = Subject(model, random_inputs("bert", model, seed=4))
    name, _ = vocabulary.input_table(model)
    params, inputs = vocabulary.cut_to_rows_read(model, subject.geometry, subject.inputs, subject.params,
                                                 subject.claims)
    assert params[name].shape[0] == config.pad_token_id + 1
    for element in (subject.build({"channels": 21}), subject.build({"heads": 21})):
        intended = Control("channels", "intended", "", lambda e=element: e)
        assert controls_module._early_break(subject, intended)[0] < 1e-12
    for family in ("t5", "vit", "roberta"):  # decoder ids, pixels, position ids counted from the ids
        other = subject_of(family)
        params, inputs = vocabulary.cut_to_rows_read(other.model, other.geometry, other.inputs, other.params,
                                                     other.claims)
        assert params is other.params and inputs is other.inputs, family
