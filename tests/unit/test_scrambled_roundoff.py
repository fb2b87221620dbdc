"""A float32 tensor above 1e-4 is held to 8x its measured round-off: the original run's, and then the scrambled
run's own (a permutation reorders sums; smollm2's key 1 put a layer-norm gradient at 1.1e-4 whose original
round-off allowed 1e-4 only). A wrong transform still fails."""

from __future__ import annotations

import torch

from perm_core.engine import symmetries
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify.subject import Subject


def scrambled_world():
    model, _ = build_random_model("llama", seed=5)
    subject = Subject(model, random_inputs("llama", model, seed=5))
    original = subject.trace()
    scramble = subject.build({"channels": 9, "mlp": 4})
    restored = subject.unscramble(subject.trace(scramble), scramble)
    return subject, original, scramble, restored


def perturbed(restored: dict, name: str, relative: float) -> dict:
    tensor = restored[name].clone()
    tensor.view(-1)[0] += relative * tensor.abs().max()
    return {**restored, name: tensor}


def test_the_scrambled_runs_round_off_raises_the_tolerance(monkeypatch):
    subject, original, scramble, restored = scrambled_world()
    name = "blocks.1.hidden"
    asked = []
    monkeypatch.setattr(Subject, "_scrambled_roundoff", lambda self, r, s: asked.append(s) or {name: 5e-5})
    bumped = perturbed(restored, name, 2e-4)
    assert not next(e for e in subject.errors(original, bumped) if e.name == name).passed  # original's only
    error = next(e for e in subject.errors(original, bumped, scramble) if e.name == name)
    assert asked == [scramble] and error.passed and abs(error.tolerance - 4e-4) < 1e-12


def test_a_wrong_transform_is_not_round_off():
    """A control's run is as wrong in float64 as in float32: its own round-off stays small and it fails."""
    subject, original, scramble, restored = scrambled_world()
    assert all(e.passed for e in subject.errors(original, restored, scramble))
    control = next(c for c in symmetries.controls("channels", 9, subject.geometry) if c.name == "norms_not_permuted")
    wrong = subject.unscramble(subject.trace(control.scramble), control.scramble)
    errors = {e.name: e for e in subject.errors(original, wrong, control.scramble)}
    assert not errors["blocks.1.hidden"].passed and errors["blocks.1.hidden"].max_rel_error > 1e-2
    assert errors["blocks.1.hidden"].tolerance < 1e-3  # raised at most by round-off, never to the cap


def test_nothing_is_rerun_when_every_tensor_is_within_1e_4(monkeypatch):
    subject, original, scramble, restored = scrambled_world()
    monkeypatch.setattr(Subject, "_scrambled_roundoff", lambda *a: (_ for _ in ()).throw(AssertionError("rerun")))
    monkeypatch.setattr(Subject, "roundoff", lambda *a: (_ for _ in ()).throw(AssertionError("rerun")))
    assert all(e.passed for e in subject.errors(original, restored, scramble))
    assert torch.is_tensor(restored["blocks.1.hidden"])
