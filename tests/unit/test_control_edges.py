"""Negative controls at the edges of their rules, on Hugging Face's init, where norms are ones and biases zeros
(uniform tensors). Every branch of check.explain_unbroken is reached there: a broken control, one unbroken by more
than round-off, one on a checkpoint without uniform tensors, a true symmetry planted as a control (its randomized
copy does not break either: it stays NOT BROKEN and fails the report), and one hidden only by the uniform tensors
(not informative, with the note). Each threshold (the tolerance, BROKEN_AT, the early measure's) is crossed from
just below and just above, by crafted results and by a control's real error set by a deliberate perturbation."""

from __future__ import annotations

import math
import re

import pytest
import torch
import transformers as hf

from perm_core.cli.check import format_report
from perm_core.engine import symmetries
from perm_core.models.registry import finish
from perm_core.verify import controls as controls_module
from perm_core.verify.check import check
from perm_core.verify.controls import explain_unbroken, run_control
from perm_core.verify.results import ControlResult
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT, TOLERANCE

pytestmark = pytest.mark.usefixtures("one_thread")
NORM = "vit.layers.0.layernorm_before.weight"  # norms_not_permuted leaves it in place: its error follows its spread


def hf_init(family: str, dtype=torch.float64):
    """A tiny classifier as transformers initializes it (norm gains 1, biases 0) and an input for it."""
    torch.manual_seed(0)
    if family == "vit":
        config = hf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64, num_labels=3, attn_implementation="eager")
        inputs = {"pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
        return finish(hf.ViTForImageClassification(config), dtype), inputs
    config = hf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, num_labels=3, attn_implementation="eager")
    ids = torch.randint(5, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    return finish(hf.BertForSequenceClassification(config), dtype), {"input_ids": ids,
                                                                      "attention_mask": torch.ones_like(ids)}


def control_named(subject: Subject, name: str, symmetry: str = "channels") -> symmetries.Control:
    return next(c for c in symmetries.controls(symmetry, 3, subject.geometry, subject.n_tokens) if c.name == name)


def true_element(subject: Subject) -> symmetries.Control:
    return symmetries.Control("channels", "true_element", "the symmetry itself", lambda: subject.build({"channels": 3}))


def crafted(control: symmetries.Control, error: float, broken: bool = False) -> ControlResult:
    return ControlResult(control.symmetry, control.name, control.description, broken, error)


def counting_scans(monkeypatch) -> list:
    scans = []
    real = controls_module.uniform_tensors
    monkeypatch.setattr(controls_module, "uniform_tensors", lambda params: scans.append(1) or real(params))
    return scans


# --- every branch of explain_unbroken on Hugging Face's init ---

@pytest.mark.parametrize("family", ["vit", "bert"])
def test_a_true_symmetry_planted_as_a_control_at_init_stays_not_broken_and_fails_the_report(monkeypatch, family):
    model, inputs = hf_init(family)
    assert len(controls_module.uniform_tensors(Subject(model, inputs).params)) >= 20  # the uniform branch is reached
    real = symmetries.controls
    monkeypatch.setattr(symmetries, "controls", lambda name, key, g, n=None: real(name, key, g, n) + [
        symmetries.Control(name, "true_element", "the symmetry itself", lambda: symmetries.build(name, key, g, n))])
    report = check(model, inputs, ["channels"], key=3)
    planted = next(c for c in report.controls if c.name == "true_element")
    assert not planted.broken and planted.max_rel_error < 1e-12
    assert planted.informative and not planted.holds and planted.note == ""
    assert all(c.passed for c in report.checks) and not report.passed
    assert next(c for c in report.to_json()["controls"] if c["name"] == "true_element")["informative"] is True
    assert "NOT BROKEN" in format_report(report) and format_report(report).endswith("FAILED")
    # the other side, in the same report: the control that only the uniform tensors hide is not informative
    hidden = next(c for c in report.controls if c.name == "norms_not_permuted")
    assert not hidden.broken and not hidden.informative and hidden.holds


@pytest.mark.parametrize("family", ["vit", "bert"])
def test_a_control_hidden_only_by_uniform_tensors_is_not_informative_and_says_why(family):
    model, inputs = hf_init(family)
    subject = Subject(model, inputs)
    control = control_named(subject, "norms_not_permuted")
    result = run_control(subject, control, subject.trace())
    explained = explain_unbroken(subject, control, result)
    uniform = controls_module.uniform_tensors(subject.params)
    varied = subject.with_params({**subject.params, **controls_module.randomized(subject.params, uniform)})
    elsewhere = run_control(varied, control, varied.trace()).max_rel_error
    assert not result.broken and result.max_rel_error <= subject.tolerance and elsewhere > BROKEN_AT
    assert (explained.broken, explained.max_rel_error, explained.informative) == (False, result.max_rel_error, False)
    example, value = re.search(r"uniform here \((\S+) is (\S+) everywhere\)", explained.note).groups()
    assert subject.claims[example].rule.tag == "norm" and example in uniform  # a norm named first, not a bias
    assert float(value) == subject.params[example].reshape(-1)[0].item() in (0.0, 1.0)
    assert f"{len(uniform)} tensor(s) are uniform" in explained.note
    # what it broke by on its own randomized copy (drawn in its own order): a break, as on this one
    assert float(explained.note.rsplit("breaks by ", 1)[1]) == pytest.approx(elsewhere, rel=0.5)


def test_a_broken_control_at_init_is_returned_as_it_is_without_a_scan(monkeypatch):
    model, inputs = hf_init("vit")
    subject = Subject(model, inputs)
    scans = counting_scans(monkeypatch)
    control = control_named(subject, "residual_rotation")
    result = run_control(subject, control, subject.trace())
    assert result.broken and result.max_rel_error > BROKEN_AT
    assert explain_unbroken(subject, control, result) is result and not scans
    # a broken result is final whatever its number: broken by a NaN, or (crafted) by nothing measured
    for error in (math.nan, 0.0):
        assert explain_unbroken(subject, control, crafted(control, error, broken=True)).informative and not scans


def test_without_uniform_tensors_an_unbroken_control_stays_not_broken(monkeypatch):
    """The init checkpoint with its uniform tensors given distinct values: nothing left to explain the control."""
    model, inputs = hf_init("vit")
    at_init = Subject(model, inputs)
    uniform = controls_module.uniform_tensors(at_init.params)
    subject = at_init.with_params({**at_init.params, **controls_module.randomized(at_init.params, uniform)})
    assert not controls_module.uniform_tensors(subject.params)
    runs = []
    monkeypatch.setattr(controls_module, "run_control", lambda *a: runs.append(a) or run_control(*a))
    control = true_element(subject)
    result = run_control(subject, control, subject.trace())
    assert not result.broken and result.max_rel_error <= subject.tolerance
    assert explain_unbroken(subject, control, result) is result and not runs  # no randomized copy was run


# --- the thresholds, from just below and just above ---

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_only_an_error_within_the_tolerance_is_explained_away(dtype):
    """The round-off condition is the dtype's tolerance, not BROKEN_AT: an unbroken control whose error lies
    between the two could bite here and did not, whatever the uniform tensors."""
    model, inputs = hf_init("vit", dtype)
    subject = Subject(model, inputs)
    control = control_named(subject, "norms_not_permuted")
    tolerance = subject.tolerance
    assert tolerance == TOLERANCE[dtype] < BROKEN_AT
    for error in (tolerance, math.nextafter(tolerance, 0)):
        explained = explain_unbroken(subject, control, crafted(control, error))
        assert not explained.informative and explained.holds and "not informative" in explained.note, error
    for error in (math.nextafter(tolerance, math.inf), math.sqrt(tolerance * BROKEN_AT),
                  math.nextafter(BROKEN_AT, 0), BROKEN_AT, math.nan, math.inf):
        kept = explain_unbroken(subject, control, crafted(control, error))
        assert kept.informative and not kept.holds and kept.note == "", error


def perturbed_norm_gain(model, subject: Subject, target: float) -> None:
    """Spread the layer-0 norm gain (in place) so that norms_not_permuted's error is `target`: its error is linear in
    the spread (first order), measured at a spread of 1e-6."""
    direction = torch.randn(subject.params[NORM].shape, generator=torch.Generator().manual_seed(1), dtype=model.dtype)
    probe = subject.with_params({**subject.params, NORM: subject.params[NORM] + 1e-6 * direction})
    slope = run_control(probe, control_named(probe, "norms_not_permuted"), probe.trace()).max_rel_error / 1e-6
    with torch.no_grad():
        model.get_parameter(NORM).add_(target / slope * direction)


@pytest.mark.parametrize("target, tolerances, verdict", [
    (0.98, "tolerance", "not informative"), (1.02, "tolerance", "NOT BROKEN"),
    (0.98, "BROKEN_AT", "NOT BROKEN"), (1.02, "BROKEN_AT", "broken")])
def test_a_real_control_error_just_below_and_above_each_threshold(target, tolerances, verdict):
    """The control's error set by a deliberate spread of one norm gain (the other norms stay uniform, so a randomized
    copy always breaks it): only under the tolerance is it explained; between the tolerance and BROKEN_AT it
    stays NOT BROKEN and fails the report; above BROKEN_AT it is broken."""
    model, inputs = hf_init("vit")
    threshold = TOLERANCE[torch.float64] if tolerances == "tolerance" else BROKEN_AT
    perturbed_norm_gain(model, Subject(model, inputs), target * threshold)
    report = check(model, inputs, ["channels"], key=3)
    control = next(c for c in report.controls if c.name == "norms_not_permuted")
    assert control.max_rel_error == pytest.approx(target * threshold, rel=5e-3)  # on the intended side
    assert (control.max_rel_error > threshold) == (target > 1)
    assert all(c.passed for c in report.checks)
    assert control.broken == (verdict == "broken") and control.informative == (verdict != "not informative")
    assert report.passed == (verdict != "NOT BROKEN")
    assert verdict in format_report(report)


def test_the_early_measure_decides_only_above_broken_at(monkeypatch):
    """A control's early measure returns a break only over BROKEN_AT; at BROKEN_AT the full run decides (here the
    true element: not broken)."""
    model, inputs = hf_init("vit")
    subject = Subject(model, inputs)
    original = subject.trace()
    control = true_element(subject)
    for early, broken in ((BROKEN_AT, False), (math.nextafter(BROKEN_AT, math.inf), True)):
        monkeypatch.setattr(controls_module, "_early_break", lambda *_, e=early: (e, "block 1's MLP activation"))
        result = run_control(subject, control, original)
        assert result.broken == broken
        if broken:
            assert result.max_rel_error == early and result.measured_on == "block 1's MLP activation"
        else:
            assert result.max_rel_error < 1e-12 and result.measured_on == "every traced tensor"
