"""What every family's check report must show, asserted the same way for every family's tests."""

from __future__ import annotations

import pytest
import torch

from perm_core.engine import symmetries
from perm_core.verify.tolerances import TOLERANCE


def assert_symmetry_holds(report, symmetry: str, dtype: torch.dtype) -> None:
    """Forward and backward both pass, moved something, within float64's tolerance in float64, and compared the
    embedding, attention, hidden states, the input gradient and parameter gradients."""
    results = {c.direction: c for c in report.checks if c.symmetry == symmetry}
    if symmetry in report.not_applicable:  # experts on a dense model: named with why, nothing checked
        assert not results and report.not_applicable[symmetry]
        return
    assert set(results) == {"forward", "backward"}
    for direction, result in results.items():
        assert result.tolerance == TOLERANCE[dtype]
        assert result.passed, (direction, [(t.name, t.max_rel_error) for t in result.tensors if not t.passed])
        assert result.moved >= 0.1 and result.note == ""
        if dtype == torch.float64:
            assert result.max_rel_error <= TOLERANCE[dtype]
    names = {t.name for t in results["forward"].tensors}
    assert {"embed", "blocks.0.attn", "blocks.1.hidden"} <= names
    grads = {t.name for t in results["backward"].tensors}
    assert "grad.input" in grads and any(n.startswith("grad.param.") for n in grads)


def assert_every_control_breaks(report) -> None:
    """Every symmetry has negative controls, each breaks by more than 1e-2, and the report passes."""
    assert report.controls, "each symmetry needs negative controls"
    for control in report.controls:
        assert control.broken and control.max_rel_error > 1e-2, (control.symmetry, control.name,
                                                                  control.max_rel_error)
    assert {c.symmetry for c in report.controls} == set(symmetries.SYMMETRIES) - set(report.not_applicable)
    assert report.passed


# Both paths of a float64 check reach round-off by different sums, and how far below the tolerance (1e-9) depends on
# the CPU's kernels, not on the code: a T5 key-weight gradient's error is 1.1e-13 whole and 3.1e-15 streamed with
# MKL's AVX2 kernels on an AMD EPYC, a few eps apart elsewhere. A transform bug moves a tensor by 1e-6 or more.
ROUNDOFF_NOISE = 1e-11


def by_name(result) -> dict:
    return {t.name: t for t in result.tensors}


def assert_same_errors(streamed, whole) -> None:
    """The same checks, each with every traced tensor (parameter gradients included), passing in both, with the
    same floor reasons, every error at round-off in both and each check's worst above zero (something compared)."""
    assert [(c.symmetry, c.direction) for c in streamed.checks] == [(c.symmetry, c.direction) for c in whole.checks]
    for mine, theirs in zip(streamed.checks, whole.checks, strict=True):
        assert by_name(mine).keys() == by_name(theirs).keys()
        assert mine.moved == pytest.approx(theirs.moved) and mine.moved_what == theirs.moved_what
        assert mine.first_break == theirs.first_break == ""
        for name, error in by_name(mine).items():
            theirs_error = by_name(theirs)[name]
            assert error.passed and theirs_error.passed and error.floor_reason == theirs_error.floor_reason, name
            # an exact zero (BERT's, ViT's key-bias gradient) is judged on a floor, absolute: compare what is left
            measure = "max_abs_error" if error.floor_reason else "max_rel_error"
            assert max(getattr(error, measure), getattr(theirs_error, measure)) < ROUNDOFF_NOISE, name
            # a mixture of experts' tensor with experts on axis 0: an error per expert in both, the same count, each
            # at round-off, their largest the tensor's own (verify.experts)
            assert (error.expert_errors is None) == (theirs_error.expert_errors is None), name
            if error.expert_errors is not None:
                assert len(error.expert_errors) == len(theirs_error.expert_errors) > 1, name
                assert max(error.expert_errors) == pytest.approx(error.max_rel_error, rel=1e-12, abs=0), name
                assert max(*error.expert_errors, *theirs_error.expert_errors) < ROUNDOFF_NOISE, name
        assert mine.max_rel_error < ROUNDOFF_NOISE and theirs.max_rel_error < ROUNDOFF_NOISE
        # something compared: each worst above zero, or exactly zero in both where the element moved what it acts
        # on (gpt-oss's experts reordered: its loop over experts adds each token's two in the same order, bit exact)
        assert (0 < mine.max_rel_error and 0 < theirs.max_rel_error) or (
            mine.max_rel_error == theirs.max_rel_error == 0 and mine.moved >= 0.1 and len(by_name(mine)) > 3)


def assert_streamed_report_agrees(streamed, whole) -> None:
    """A streamed report and the whole-model report of the same checkpoint and input: both pass, with the same errors
    (assert_same_errors), the same controls each broken by more than round-off, the same oracle and restricted
    forms."""
    assert whole.passed and streamed.passed
    assert_same_errors(streamed, whole)
    assert [(c.symmetry, c.name, c.broken) for c in streamed.controls] == [
        (c.symmetry, c.name, c.broken) for c in whole.controls]
    assert all(c.broken and c.max_rel_error > 1e-3 for c in streamed.controls)
    assert streamed.oracle.passed and streamed.oracle.max_rel_error == pytest.approx(whole.oracle.max_rel_error)
    assert streamed.restricted == whole.restricted
