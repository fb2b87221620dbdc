"""Every tolerance rule at its edges: the oracle's min(max(base, ROUNDOFF_SAFETY x round-off), ROUNDOFF_CAP), a
tensor's raised tolerance and its caps (ROUNDOFF_CAP in float32, FLOAT64_ROUNDOFF_CAP in float64), a tensor's pass
at its tolerance, a check's movement at MOVED_AT and a does-not-hold claim's break at BROKEN_AT, each from just
below and just above."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest
import torch

from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify import oracle
from perm_core.verify.check import check, summarize
from perm_core.verify.results import NotSymmetry
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import (
    BROKEN_AT,
    FLOAT64_ROUNDOFF_CAP,
    MOVED_AT,
    ROUNDOFF_CAP,
    ROUNDOFF_SAFETY,
    TOLERANCE,
    UNIT_ROUNDOFF_RATIO,
    TensorError,
    judged,
)

pytestmark = pytest.mark.usefixtures("one_thread")
OTHER = {torch.float64: torch.float32, torch.float32: torch.float64}


def above(x: float) -> float:
    return math.nextafter(x, math.inf)


def below(x: float) -> float:
    return math.nextafter(x, 0.0)


def output(value: float, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {"output.logits": torch.tensor([value, 1.0], dtype=dtype)}


def oracle_tolerance(dtype: torch.dtype, error: float, roundoff: float | None) -> float:
    """The tolerance verify.oracle.judged gives the traced logits against stock ones off by `error` (relative to the
    stock's largest value, up to one rounding), where the run in the other dtype is off by exactly `roundoff` (a
    power of two: the float64 run gives [2, 1], the float32 run [2 + 2 x roundoff, 1]). roundoff None: nothing may
    be rerun."""
    def rerun(other, name):
        assert roundoff is not None, f"{name} was rerun, but nothing needed its round-off"
        assert other == OTHER[dtype], "the round-off is measured in the other dtype"
        return output(2.0 + 2 * roundoff if other == torch.float32 else 2.0, other)[name]

    traced = output(2.0 + 2 * roundoff if dtype == torch.float32 and roundoff is not None else 2.0, dtype)
    offset = 2 * error / (1 - error) if math.isfinite(error) else math.inf
    return oracle.judged(output(traced["output.logits"][0].item() + offset, dtype), traced, dtype, "sdpa",
                         rerun).tolerance


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_oracles_tolerance_is_the_safety_times_round_off_between_base_and_cap(dtype):
    base = TOLERANCE[dtype]
    cases = [(2.0**-40, base),  # 8 x round-off under the base: the base
             (2.0**-13, ROUNDOFF_SAFETY * 2.0**-13),  # 8 x 2^-13 = 9.8e-4, just under the cap: itself
             (2.0**-12, ROUNDOFF_CAP),  # 8 x 2^-12 = 2.0e-3, just over: the cap
             (0.5, ROUNDOFF_CAP)]  # a huge round-off: the cap
    for roundoff, expected in cases:
        assert oracle_tolerance(dtype, 4 * base, roundoff) == expected, roundoff
    for error in (base / 2, 0.0, math.inf):  # nothing is rerun at or under the base, or for a non-finite error
        assert oracle_tolerance(dtype, error, None) == base


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_output_just_over_the_cap_fails_the_oracle_and_just_under_passes(dtype):
    """The traced logits moved by a known amount against the stock forward: their float32 rerun is then off by as
    much (a round-off 8x of which is far over the cap), so the tolerance is the cap, and the cap decides."""
    model, _ = build_random_model("gpt2", dtype=dtype, seed=5)
    subject = Subject(model, random_inputs("gpt2", model, seed=5))
    original = subject.trace()
    assert oracle.consult(subject, original).passed
    logits = original["output.logits"].tensor
    for factor, passed in ((0.99, True), (1.01, False)):
        moved = logits.clone()
        moved.view(-1)[0] += factor * ROUNDOFF_CAP * logits.abs().max()
        found = oracle.consult(subject, {**original, "output.logits": dataclasses.replace(original["output.logits"],
                                                                                          tensor=moved)})
        assert found.tolerance == ROUNDOFF_CAP and found.output == "output.logits"
        assert found.max_rel_error == pytest.approx(factor * ROUNDOFF_CAP, rel=1e-3)
        assert found.passed == passed


@pytest.mark.parametrize("dtype, cap, scale", [(torch.float32, ROUNDOFF_CAP, 1.0),
                                               (torch.float64, FLOAT64_ROUNDOFF_CAP, UNIT_ROUNDOFF_RATIO)])
def test_a_tensors_raised_tolerance_is_capped_and_the_cap_decides(dtype, cap, scale):
    base = TOLERANCE[dtype]
    just_under_cap = below(cap) / (ROUNDOFF_SAFETY * scale)  # the round-off whose allowance is just under the cap
    roundoff = {"tiny": 1e-30, "between": just_under_cap, "huge": 1e3, "inf": math.inf}
    names = [*roundoff, "unmeasured"]
    tolerances = {e.name: e.tolerance for e in judged({n: (0.0, 0.0, True) for n in names}, dtype, {}, roundoff)}
    assert tolerances["tiny"] == tolerances["unmeasured"] == base
    assert base < tolerances["between"] == pytest.approx(ROUNDOFF_SAFETY * scale * just_under_cap, rel=1e-15)
    assert tolerances["between"] < cap
    assert tolerances["huge"] == tolerances["inf"] == cap
    for error, passed in ((cap, True), (above(cap), False)):
        (found,) = judged({"huge": (error, error, True)}, dtype, {}, roundoff)
        assert found.passed == passed, error
    assert judged({"x": (0.0, 0.0, True)}, dtype, {})[0].tolerance == base  # no round-off measured: the base


def test_a_tensor_passes_at_its_tolerance_and_fails_just_over_or_non_finite():
    assert TensorError("t", 1.0, 1e-9, 1e-9).passed and TensorError("t", 1.0, below(1e-9), 1e-9).passed
    assert not TensorError("t", 1.0, above(1e-9), 1e-9).passed
    assert not TensorError("t", 0.0, 0.0, 1e-9, finite=False).passed
    assert not TensorError("t", 1.0, math.nan, 1e-9).passed and not TensorError("t", 1.0, 0.0).passed  # NaN tolerance


def test_a_check_moves_enough_at_moved_at_and_not_just_under():
    subject = types.SimpleNamespace(tolerance=1e-9, dtype=torch.float64, places={"n_layers": 2})
    errors = [TensorError("embed", 1e-16, 1e-16, 1e-9)]
    assert summarize(subject, "channels", "forward", errors, MOVED_AT, "weight w").passed
    for moved in (below(MOVED_AT), 0.0, math.nan):
        result = summarize(subject, "channels", "forward", errors, moved, "weight w")
        assert not result.passed and "moved nothing" in result.note, moved


def test_a_does_not_hold_claim_is_proven_only_above_broken_at():
    assert NotSymmetry("tokens", "reason", above(BROKEN_AT)).broken
    for error in (BROKEN_AT, below(BROKEN_AT), 0.0):
        assert not NotSymmetry("tokens", "reason", error).broken


def test_the_reports_timings_cover_its_parts_and_stay_out_of_its_verdict_and_json():
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=5)
    report = check(model, random_inputs("gpt2", model, seed=5), ["channels", "mlp"], key=3)
    assert report.passed and set(report.seconds) == {"original", "oracle", "checks", "controls"}
    assert all(0 < s < 60 for s in report.seconds.values())
    assert "seconds" not in report.to_json()
    report.seconds["checks"] = math.nan
    assert report.passed


@pytest.mark.parametrize("moved", ["output.last_hidden", "output.pooler"])
def test_the_oracle_reports_the_worst_output_wherever_it_is_in_the_run(moved):
    """A headless BERT's run has two outputs, its pooled one and its last hidden state: either, moved alone, is the
    oracle's verdict, not whichever output the run traced first or last."""
    model, _ = build_random_model("bert", dtype=torch.float64, seed=2, model_class="BertModel")
    subject = Subject(model, random_inputs("bert", model, seed=2))
    original = subject.trace()
    outputs = [n for n in original if n.startswith("output.")]
    assert sorted(outputs) == ["output.last_hidden", "output.pooler"] and oracle.consult(subject, original).passed
    tensor = original[moved].tensor.clone()
    tensor.view(-1)[0] += 0.5 * tensor.abs().max()
    found = oracle.consult(subject, {**original, moved: dataclasses.replace(original[moved], tensor=tensor)})
    assert found.output == moved and not found.passed and found.max_rel_error == pytest.approx(0.5, rel=1e-6)
