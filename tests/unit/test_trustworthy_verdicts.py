"""Verdicts a researcher can trust on any checkpoint: no false FAIL at Hugging Face's init, movement judged per
tensor from the element, controls that cannot bite said so (never failing a symmetry that holds), honest headline
errors, where a failing check first breaks, and an oracle row tying the original run to the stock forward."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import transformers as hf

from perm_core.cli.check import format_report
from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble
from perm_core.engine.transforms import Permutation
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.models.registry import finish
from perm_core.verify import controls as controls_module
from perm_core.verify import oracle
from perm_core.verify import subject as subject_module
from perm_core.verify.check import check
from perm_core.verify.controls import run_control
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT

pytestmark = pytest.mark.usefixtures("one_thread")


def hf_init_bert_classifier():
    torch.manual_seed(0)
    config = hf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, num_labels=3,
                           attn_implementation="eager")
    return finish(hf.BertForSequenceClassification(config), torch.float64)  # HF's init, as loaded here


def hf_init_vit_classifier():
    torch.manual_seed(0)
    config = hf.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, num_labels=3, attn_implementation="eager")
    return finish(hf.ViTForImageClassification(config), torch.float64)


def text_input(n_tokens=12, seed=0):
    ids = torch.randint(5, 100, (1, n_tokens), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def image_input(seed=0):
    return {"pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))}


# --- movement: decided from the element, per tensor on its own scale ---

def test_tokens_backward_on_an_hf_init_classifier_passes():
    """Only [CLS] reaches the classifier, so at init the activation gradients barely move under a token
    permutation; the element still moves every movable token, and that is what decides."""
    report = check(hf_init_bert_classifier(), text_input(), ["tokens", "channels", "heads"], key=3)
    assert report.passed, [(c.symmetry, c.direction, c.note) for c in report.checks if not c.passed]
    tokens = [c for c in report.checks if c.symmetry == "tokens"]
    assert [c.direction for c in tokens] == ["forward", "backward"]
    assert tokens[0].moved == tokens[1].moved >= 0.5 and "movable" in tokens[1].moved_what


def test_the_movement_measure_is_per_tensor_and_per_element():
    model, _ = build_random_model("bert", dtype=torch.float64, seed=2)
    subject = Subject(model, random_inputs("bert", model, seed=2))
    movable = subject.movable_tokens
    swap = torch.arange(subject.n_tokens)
    swap[[1, 2]] = swap[[2, 1]]
    amount, what = subject.element_movement(Scramble(tokens=Permutation(swap)))
    assert amount == pytest.approx(2 / movable) and what.startswith("tokens: 2 of")
    assert subject.element_movement(Scramble(tokens=Permutation(torch.arange(subject.n_tokens)))) == (0.0, "")
    assert subject.element_movement(Scramble()) == (0.0, "")
    # One huge weight does not hide another's movement: each is measured against its own size.
    norm = next(n for n, c in subject.claims.items() if c.rule.tag == "norm")
    huge = {n: p * 1e8 if n != norm else p for n, p in subject.params.items()}
    scaled = subject.with_params(huge)
    moved = scaled.weight_movement(subject_module.TransformedOnDemand(scaled, scaled.build({"channels": 4})),
                                   enough=math.inf)
    assert moved[f"weight {norm}"] >= 0.1
    uniform = subject.with_params({**subject.params, norm: torch.ones_like(subject.params[norm])})
    moved = uniform.weight_movement(subject_module.TransformedOnDemand(uniform, uniform.build({"channels": 4})),
                                    enough=math.inf)
    assert moved[f"weight {norm}"] == 0.0


def test_an_identity_element_still_fails_on_an_hf_init_classifier(monkeypatch):
    monkeypatch.setattr(Subject, "build", lambda self, keys: Scramble(
        tokens=Permutation(torch.arange(self.n_tokens)) if "tokens" in keys else None))
    report = check(hf_init_bert_classifier(), text_input(), ["tokens", "channels"], key=3)
    assert not report.passed
    assert all(not c.passed and "moved nothing" in c.note for c in report.checks)


# --- controls that cannot bite on this checkpoint ---

def test_a_control_without_bite_at_init_is_not_informative_and_does_not_fail_the_symmetry():
    report = check(hf_init_vit_classifier(), image_input(), ["channels"], key=3)
    assert report.passed
    norms = next(c for c in report.controls if c.name == "norms_not_permuted")
    assert not norms.broken and not norms.informative and norms.max_rel_error < 1e-12
    assert "uniform" in norms.note and "layernorm" in norms.note
    broken_elsewhere = float(norms.note.rsplit("breaks by ", 1)[1])
    assert broken_elsewhere > BROKEN_AT  # shown on a copy with the uniform tensors randomized, not assumed
    assert report.to_json()["controls"][0]["informative"] is False
    assert "not informative" in format_report(report) and "NOT BROKEN" not in format_report(report)


def test_the_true_element_as_a_control_is_not_broken_and_fails_the_report(monkeypatch):
    """A control is broken only above BROKEN_AT (1e-3), not above 0; and a control that could bite but did not
    (no uniform tensor explains it) fails the report."""
    model, _ = build_random_model("vit", dtype=torch.float64, seed=3)
    inputs = random_inputs("vit", model, seed=3)
    subject = Subject(model, inputs)
    original = subject.trace()
    true_element = symmetries.Control("channels", "true_element", "the symmetry itself",
                                      lambda: subject.build({"channels": 3}))
    result = run_control(subject, true_element, original)
    assert not result.broken and 0 < result.max_rel_error < 1e-12
    assert not controls_module.uniform_tensors(subject.params)
    real = symmetries.controls
    monkeypatch.setattr(symmetries, "controls", lambda name, key, g, n=None: real(name, key, g, n) + [
        symmetries.Control(name, "true_element", "the symmetry itself", lambda: symmetries.build(name, key, g, n))])
    report = check(model, inputs, ["channels"], key=3)
    assert all(c.passed for c in report.checks) and not report.passed
    planted = next(c for c in report.controls if c.name == "true_element")
    assert not planted.broken and planted.informative and not planted.holds


# --- honest headline numbers ---

def test_headline_errors_leave_out_tensors_zero_in_exact_arithmetic():
    model, _ = build_random_model("vit", dtype=torch.float64, seed=3)
    report = check(model, random_inputs("vit", model, seed=3), ["tokens", "channels"], key=3)
    assert report.passed
    backward = [c for c in report.checks if c.direction == "backward"]
    assert all(c.floored for c in backward)
    for c in backward:
        judged = [t for t in c.tensors if not t.floor_reason]
        assert c.max_rel_error == max(t.max_rel_error for t in judged) < 1e-13
        assert c.floored_max_abs_error == max(t.max_abs_error for t in c.tensors if t.floor_reason)
        assert c.max_rel_error_eps == pytest.approx(c.max_rel_error / 2.0**-52)
    # the control: the floored tensors alone carry errors far above the headline
    assert max(t.max_rel_error for c in backward for t in c.tensors) > 1e3 * max(c.max_rel_error for c in backward)


def test_a_nan_in_a_floored_tensor_still_makes_the_headline_inf():
    from perm_core.verify.tolerances import TensorError, worst_rel

    errors = [TensorError("a", 1e-16, 1e-16, 1e-9), TensorError("grad.param.k.bias", math.inf, math.inf, 1e-9,
                                                                 "exact zero", finite=False)]
    assert worst_rel(errors) == math.inf


# --- where it first breaks ---

def test_a_bug_planted_in_a_middle_block_is_named_first(monkeypatch):
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=5)
    inputs = random_inputs("gpt2", model, seed=5)
    subject = Subject(model, inputs)
    assert subject.geometry.n_layers >= 2
    middle = subject.geometry.n_layers - 1
    real = Subject.transformed_params
    target = next(n for n, c in subject.claims.items() if c.layer == middle and c.rule.tag == "mlp.out"
                  and n.endswith("weight"))

    def with_bug(self, scramble):
        params = dict(real(self, scramble))
        params[target] = params[target].flip(0)  # the output projection's rows out of order in that block only
        return params

    monkeypatch.setattr(Subject, "transformed_params", with_bug)
    report = check(model, inputs, ["mlp"], key=3)
    forward, backward = report.checks[0], report.checks[1]
    assert not forward.passed and forward.first_break == f"blocks.{middle}.hidden"
    before = [s for s in forward.stages if s.where in ("embeddings", *(f"block {i}" for i in range(middle)))]
    assert before and all(s.error_over_tolerance <= 1 for s in before)
    assert next(s for s in forward.stages if s.where == f"block {middle}").error_over_tolerance > 1
    assert not backward.passed and backward.first_break
    assert report.to_json()["checks"][0]["first_break"] == f"blocks.{middle}.hidden"
    text = format_report(report)
    assert f"first breaks at blocks.{middle}.hidden" in text and f"block {middle}" in text and "FAILED" in text
    # the control: without the bug nothing is named
    monkeypatch.setattr(Subject, "transformed_params", real)
    clean = check(model, inputs, ["mlp"], key=3)
    assert clean.passed and all(c.first_break == "" for c in clean.checks)


# --- the oracle row ---

@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2", "llama", "mistral", "t5", "vit"])
def test_the_original_run_equals_the_stock_forward(family):
    model, _ = build_random_model(family, dtype=torch.float64, seed=1)
    subject = Subject(model, random_inputs(family, model, seed=1))
    found = oracle.consult(subject, subject.trace())
    assert found.passed and found.max_rel_error < 1e-5 and found.attention in ("sdpa", "eager")
    if family in ("bert", "roberta", "gpt2", "vit"):  # the stock code computes all in float64: no allowance
        assert found.tolerance == 1e-9
    else:  # RMSNorm (and T5's layer norm) in float32: the output's measured float32 round-off x 8, capped
        assert 1e-9 < found.tolerance <= 1e-3
    assert model.config._attn_implementation == "perm_core_eager"  # the model is left as it was


@pytest.mark.parametrize("family, bug", [("roberta", "position_offset"), ("mistral", "sliding_window")])
def test_a_tracing_bug_both_runs_share_fails_the_report(monkeypatch, family, bug):
    model, _ = build_random_model(family, dtype=torch.float64, seed=1)
    inputs = random_inputs(family, model, seed=1)
    real = subject_module.Subject.__init__

    def with_bug(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.geometry = dataclasses.replace(self.geometry, **{bug: getattr(self.geometry, bug) - 1})

    monkeypatch.setattr(subject_module.Subject, "__init__", with_bug)
    report = check(model, inputs, ["mlp"], key=3)
    assert all(c.passed for c in report.checks)  # the symmetry holds on the buggy trace too
    assert not report.oracle.passed and report.oracle.max_rel_error > 1e-2 and not report.passed
    assert report.to_json()["oracle"]["passed"] is False
