"""`not_symmetries`: a symmetry an architecture lacks is reported with a measured break, never skipped, and a
claim that it does not hold fails the report when the measurement shows it does hold."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from perm_core.families import gpt2 as gpt2_family
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify.check import check
from perm_core.verify.tolerances import BROKEN_AT
from tests.unit.json_schema import validated


def _claiming_relative_bias(monkeypatch):
    """GPT-2 whose geometry (wrongly) says it has a relative position bias: tokens would not hold."""
    def geometry(config):
        return dataclasses.replace(gpt2_family.geometry(config), relative_position_bias=True)

    monkeypatch.setattr(gpt2_family, "FAMILY", dataclasses.replace(gpt2_family.FAMILY, geometry=geometry))


def test_every_symmetry_lands_in_checks_or_not_symmetries(monkeypatch):
    _claiming_relative_bias(monkeypatch)
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=3)
    report = check(model, random_inputs("gpt2", model, seed=3), ["tokens", "channels"], key=7, backward=False)
    assert {c.symmetry for c in report.checks} == {"channels"}  # no "all": one symmetry left to compose
    assert [n.symmetry for n in report.not_symmetries] == ["tokens"]
    assert "relative position bias" in report.not_symmetries[0].reason


def test_a_false_does_not_hold_claim_fails_the_report(monkeypatch):
    """GPT-2 moves positions with their tokens, so the tokens symmetry holds: the measured 'break' is round-off,
    and the claim that it does not hold is refuted by the evidence."""
    _claiming_relative_bias(monkeypatch)
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=3)
    report = check(model, random_inputs("gpt2", model, seed=3), ["tokens", "channels"], key=7, backward=False)
    claim = report.not_symmetries[0]
    assert claim.max_rel_error < 1e-12 and not claim.broken
    assert not report.passed
    document = validated("check", report.to_json())
    assert document["not_symmetries"] == [{"symmetry": "tokens", "reason": claim.reason,
                                           "max_rel_error": claim.max_rel_error, "broken": False}]


def test_a_real_break_is_the_evidence(monkeypatch):
    """The same claim with positions left where they were (what a relative bias does): the break is measured."""
    from perm_core.engine import tokens as tokens_module

    _claiming_relative_bias(monkeypatch)
    real = tokens_module.model_inputs

    def positions_stay(inputs, g, scramble, dtype):
        return real(inputs, g, scramble.with_controls(positions_follow_tokens=False), dtype)

    monkeypatch.setattr("perm_core.verify.subject.model_inputs", positions_stay)
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=3)
    report = check(model, random_inputs("gpt2", model, seed=3), ["tokens", "channels"], key=7, backward=False)
    claim = report.not_symmetries[0]
    assert claim.broken and claim.max_rel_error > BROKEN_AT
    assert report.passed


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_restricted_forms_are_named_in_the_report(family):
    model, _ = build_random_model(family, dtype=torch.float64, seed=3)
    report = check(model, random_inputs(family, model, seed=3), ["head_channels", "mlp"], key=7, backward=False)
    assert set(report.restricted) == {"head_channels"}
    assert "V/O" in report.restricted["head_channels"]
    assert report.to_json()["restricted"] == report.restricted and report.to_json()["not_symmetries"] == []

