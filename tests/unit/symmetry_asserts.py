"""What every family's check report must show, asserted the same way for every family's tests."""

from __future__ import annotations

import torch

from perm_core.engine import symmetries
from perm_core.verify.check import TOLERANCE


def assert_symmetry_holds(report, symmetry: str, dtype: torch.dtype) -> None:
    """Forward and backward both pass, moved something, within float64's tolerance in float64, and compared the
    embedding, attention, hidden states, the input gradient and parameter gradients."""
    results = {c.direction: c for c in report.checks if c.symmetry == symmetry}
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
    assert {c.symmetry for c in report.controls} == set(symmetries.SYMMETRIES)
    assert report.passed
