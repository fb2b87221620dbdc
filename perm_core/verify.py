"""Scramble, run, un-scramble, compare: the check behind every verdict in the app and the CLI.

Errors are per tensor: max absolute error, and max relative error = max |a - b| / max |b| (relative
to the tensor's scale, so near-zero entries do not make it meaningless).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from perm_core import symmetries
from perm_core.families import Family, Geometry, family_of
from perm_core.spec import Claim, FamilySpec, Scramble, apply_axes, transform_params
from perm_core.tokens import model_inputs, n_tokens
from perm_core.trace import Record, run

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
# Round-off in a tensor is set by the scale of everything it was computed from, so no tensor is held
# to a relative error finer than this fraction of the largest tensor of its kind.
ZERO_FLOOR = {torch.float64: 1e-6, torch.float32: 1e-2}
BROKEN_AT = 1e-3  # a control is broken when some tensor moves by more than this (relative)


@dataclass
class TensorError:
    name: str
    max_abs_error: float
    max_rel_error: float


@dataclass
class CheckResult:
    symmetry: str
    direction: str  # "forward" | "backward"
    passed: bool
    max_abs_error: float
    max_rel_error: float
    tolerance: float
    tensors: list[TensorError]


@dataclass
class ControlResult:
    symmetry: str
    name: str
    description: str
    broken: bool
    max_rel_error: float


@dataclass
class Report:
    model: str
    family: str
    dtype: str
    checks: list[CheckResult] = field(default_factory=list)
    controls: list[ControlResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and all(c.broken for c in self.controls)

    def to_json(self) -> dict:
        checks = [asdict(c) for c in self.checks]
        controls = [{k: v for k, v in asdict(c).items() if k != "description"} for c in self.controls]
        return {"model": self.model, "family": self.family, "dtype": self.dtype, "passed": self.passed,
                "checks": checks, "controls": controls}


class Subject:
    """A model and one input, with everything derived from them computed once."""

    def __init__(self, model, inputs: dict | None = None):
        self.model = model
        self.family: Family = family_of(model)
        self.spec: FamilySpec = self.family.spec(model.config)
        self.geometry: Geometry = self.family.geometry(model.config)
        self.params = dict(model.named_parameters())
        self.claims: dict[str, Claim] = self.spec.claim_all(self.params)
        self.inputs = inputs
        self.dtype = next(iter(self.params.values())).dtype
        self.n_tokens = n_tokens(inputs, self.geometry) if inputs else None

    def build(self, keys_by_symmetry: dict[str, int]) -> Scramble:
        return symmetries.build_many(keys_by_symmetry, self.geometry, self.n_tokens)

    def transformed_params(self, scramble: Scramble) -> dict[str, torch.Tensor]:
        return transform_params(self.params, self.spec, scramble, self.claims)

    def trace(self, scramble: Scramble | None = None, backward: bool = False,
              params: dict[str, torch.Tensor] | None = None) -> dict[str, Record]:
        scramble = scramble or Scramble()
        if params is None:
            params = self.params if scramble.is_identity else self.transformed_params(scramble)
        kwargs = model_inputs(self.inputs, self.geometry, scramble, self.dtype)
        return run(self.model, params, kwargs, self.geometry, self.claims, backward=backward)

    def unscramble(self, records: dict[str, Record], scramble: Scramble) -> dict[str, torch.Tensor]:
        inverse = scramble.inverse()
        return {name: apply_axes(r.tensor, r.axes, inverse, r.layer, self.geometry.patch_size)
                for name, r in records.items()}


def kind_of(name: str) -> str:
    return "grad.param" if name.startswith("grad.param.") else "grad" if is_gradient(name) else "forward"


def tensor_errors(original: dict[str, Record], restored: dict[str, torch.Tensor]) -> list[TensorError]:
    """Per-tensor errors. A tensor that is zero in exact arithmetic (the gradient of a key bias:
    softmax ignores a shift shared by a whole row) holds only round-off, so its relative error is
    taken against a floor of ZERO_FLOOR times the largest tensor of its kind."""
    floor = ZERO_FLOOR.get(next(iter(original.values())).tensor.dtype, 1e-2)
    names = [n for n in restored if n in original]
    scales = {n: original[n].tensor.abs().max().item() for n in names}
    kind_scale = {}
    for name in names:
        kind_scale[kind_of(name)] = max(kind_scale.get(kind_of(name), 0.0), scales[name])
    errors = []
    for name in names:
        reference = original[name].tensor.to(torch.float64)
        difference = (restored[name].to(torch.float64) - reference).abs().max().item()
        scale = max(scales[name], floor * kind_scale[kind_of(name)])
        errors.append(TensorError(name, difference, difference / scale if scale > 0 else difference))
    return errors


def is_gradient(name: str) -> bool:
    return name.startswith("grad.")


def _summarize(symmetry, direction, errors, tolerance) -> CheckResult:
    worst_abs = max((e.max_abs_error for e in errors), default=0.0)
    worst_rel = max((e.max_rel_error for e in errors), default=0.0)
    return CheckResult(symmetry, direction, bool(errors) and worst_rel <= tolerance, worst_abs, worst_rel,
                       tolerance, errors)


def check_scramble(subject: Subject, scramble: Scramble, label: str, original: dict[str, Record],
                   backward: bool = True) -> list[CheckResult]:
    restored = subject.unscramble(subject.trace(scramble, backward=backward), scramble)
    errors = tensor_errors(original, restored)
    tolerance = TOLERANCE.get(subject.dtype, 1e-4)
    results = [_summarize(label, "forward", [e for e in errors if not is_gradient(e.name)], tolerance)]
    if backward:
        results.append(_summarize(label, "backward", [e for e in errors if is_gradient(e.name)], tolerance))
    return results


def run_control(subject: Subject, control: symmetries.Control, original: dict[str, Record]) -> ControlResult:
    # A control's element carries the intended transforms; only how it was applied is wrong.
    restored = subject.unscramble(subject.trace(control.scramble), control.scramble)
    worst = max((e.max_rel_error for e in tensor_errors(original, restored)), default=0.0)
    return ControlResult(control.symmetry, control.name, control.description, worst > BROKEN_AT, worst)


def check(model, inputs: dict, symmetry_names=symmetries.SYMMETRIES, key: int = 0, model_name: str = "",
          backward: bool = True, include_combined: bool = True, progress=None) -> Report:
    """Every symmetry forward (and backward), their composition, and every negative control."""
    subject = Subject(model, inputs)
    report = Report(model_name or type(model).__name__, subject.family.name, str(subject.dtype).split(".")[-1])
    original = subject.trace(backward=backward)
    names = list(symmetry_names)
    steps = names + (["all"] if include_combined and len(names) > 1 else [])
    for step, name in enumerate(steps):
        if progress:
            progress(step / len(steps), f"checking {name}")
        keys = {n: key for n in names} if name == "all" else {name: key}
        scramble = subject.build(keys)
        report.checks.extend(check_scramble(subject, scramble, name, original, backward))
        if name != "all":
            for control in symmetries.controls(name, key, subject.geometry, subject.n_tokens):
                report.controls.append(run_control(subject, control, original))
    if progress:
        progress(1.0, "done")
    return report
