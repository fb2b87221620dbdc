"""An assertion for a researcher's own test suite: their model, as they hold it, keeps its symmetries exactly.

    from perm_core.testing import assert_symmetric

    def test_my_steered_bert_keeps_its_symmetries():
        model = build_my_model()                      # a model of a supported family, with its forward hooks
        ids = torch.randint(0, model.config.vocab_size, (1, 12))
        assert_symmetric(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                         ["channels", "heads"], key=7, dtype=torch.float64)

It runs perm_core's check (perm_core.verify.check.check) and is silent when the report passes: every check within
its tolerance, every negative control broken, the oracle in agreement. Otherwise it raises AssertionError whose
message is the failing part of the report, one row per failing symmetry and direction with the first tensor over
its tolerance in the order the run computed it (a hook that breaks a symmetry is named there: a vector added after
block 1 first breaks blocks.1.hidden), then the controls that did not break and the oracle if it disagreed.

What is checked is a copy of the caller's model, never the model itself: the copy is cast to `dtype` (None keeps the
model's own dtype), put in eval mode (dropout would make any two runs differ) and given perm_core's exact numerics
(its eager attention, RMSNorm without a float32 downcast). The copy keeps the model's forward hooks: a hook is part
of the function checked. It costs one more model in memory.

A model whose hooks or buffers keep a dtype of their own (a float64 steering vector in a float32 check, or in the
float32 round-off rerun of a float64 check) cannot be run in the check's dtype: that is an AssertionError with one
sentence saying which tensors to cast, not a stack of torch frames.

A symmetry that the architecture does not have (tokens on T5's relative position bias) fails the assertion, with the
reason: the model is not symmetric under it, whatever the measured break.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch

from perm_core.engine.symmetries import SYMMETRIES
from perm_core.models.registry import DTYPES
from perm_core.run.numerics import use_exact_numerics
from perm_core.run.trace import MixedDtypeError
from perm_core.verify.check import check
from perm_core.verify.results import CheckResult, Report
from perm_core.verify.tolerances import worst

__all__ = ["assert_symmetric", "failure_table", "prepared_copy"]


def assert_symmetric(model, inputs: dict, symmetries: str | Iterable[str], key: int | Mapping[str, int] = 0,
                     dtype: torch.dtype | str | None = None, *, backward: bool = True,
                     include_combined: bool = True) -> Report:
    """Assert that `model` (a transformers model of a supported family) keeps each of `symmetries` (names from
    perm_core.SYMMETRIES, or one name) on `inputs` (the model's keyword inputs: input_ids and attention_mask, or
    pixel_values). key: one key for every symmetry or one per name; dtype: torch.float32 / torch.float64 (or their
    names) for the copy checked, None for the model's own; backward: the gradients too; include_combined: the
    composition of every symmetry named, as one more check. Returns the report when it passes."""
    __tracebackhide__ = True  # pytest shows the caller's line and the message, not this function's frames
    names = [symmetries] if isinstance(symmetries, str) else list(symmetries)
    unknown = [name for name in names if name not in SYMMETRIES]
    if unknown:
        raise ValueError(f"unknown symmetry {', '.join(map(repr, unknown))}: choose from {', '.join(SYMMETRIES)}")
    checked = prepared_copy(model, dtype)
    try:
        report = check(checked, inputs, names, key, model_name=type(model).__name__, backward=backward,
                       include_combined=include_combined)
    except MixedDtypeError as error:
        raise AssertionError(f"{type(model).__name__} cannot be checked in {_dtype_name(checked)}: {error}") from None
    if not (report.passed and not report.not_symmetries):
        raise AssertionError(failure_table(report))
    return report


def prepared_copy(model, dtype: torch.dtype | str | None = None):
    """A copy of `model` as a check runs it: cast to `dtype` (None: its own), in eval mode, with exact numerics.
    The caller's model, its mode and its attention setting are left as they were."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype is not None and dtype not in DTYPES.values():
        raise ValueError(f"a check runs in float32 or float64, not {dtype}")
    checked = copy.deepcopy(model)
    if dtype is not None:
        checked = checked.to(dtype)
    checked.eval()
    use_exact_numerics(checked)
    return checked


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def _margin(result: CheckResult) -> float:
    """The worst tensor's error over its own tolerance (a pass needs <= 1)."""
    return worst(t.max_rel_error / t.tolerance for t in result.tensors)


def failure_table(report: Report) -> str:
    """The failing part of a report: each failing symmetry and direction with its first broken tensor and its
    worst error against its tolerance, each control that did not break, each symmetry the architecture lacks,
    and the oracle when it disagreed."""
    failing = [c for c in report.checks if not c.passed]
    lines = [f"{report.model} ({report.family}, {report.dtype}) is not symmetric as asserted "
             f"(keys {', '.join(f'{name}={key}' for name, key in report.keys.items())})"]
    if failing:
        lines += ["", f"{'symmetry':<14} {'direction':<9} {'first broken tensor':<44} {'err/tol':>9} "
                      f"{'max rel err':>11} {'tolerance':>9}"]
    for c in failing:
        first = c.first_break or "-"
        lines.append(f"{c.symmetry:<14} {c.direction:<9} {first:<44} {_margin(c):>9.3g} {c.max_rel_error:>11.2e} "
                     f"{c.tolerance:>9.0e}")
        if c.note:
            lines.append(f"    {c.note}")
        if c.stages:
            lines.append("    worst error over tolerance by place, in the order the run computed them: "
                         + "; ".join(f"{s.where} {s.error_over_tolerance:.3g}" for s in c.stages))
    controls = [c for c in report.controls if not c.holds]
    if controls:
        lines += ["", "negative controls that did not break (the check could not tell a wrong transform apart):"]
        lines += [f"    {c.symmetry}: {c.name}  max rel err {c.max_rel_error:.2e}" + (f"  {c.note}" if c.note else "")
                  for c in controls]
    for n in report.not_symmetries:
        lines += ["", f"{n.symmetry} is not a symmetry of {report.family}: {n.reason} "
                      f"(measured break {n.max_rel_error:.2e})"]
    if report.oracle is not None and not report.oracle.passed:
        o = report.oracle
        lines += ["", f"oracle: the traced run's {o.output} is {o.max_rel_error:.2e} from transformers' own forward "
                      f"({o.attention} attention), tolerance {o.tolerance:.0e}: the run checked is not the model's"]
    if not report.checks and not report.not_symmetries:
        lines += ["", "no check was run"]
    lines += ["", "err/tol: the worst tensor's error over its own tolerance (a pass needs <= 1); the first broken "
                  "tensor is the first one over its tolerance in the order the run computed it"]
    return "\n".join(lines)
