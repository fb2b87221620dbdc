"""Scramble, run, un-scramble, compare: the check behind every verdict in the app and the CLI.

A check passes only if (1) every un-scrambled tensor is finite and within its tolerance, (2) the
transform really moved something (see tolerances.MOVED_AT), and (3) it compared at least one tensor.
A report passes only if it has checks, all pass, and every symmetry has negative controls that
all break. The error rules (own scale, floors for exact zeros, float32 round-off) are in tolerances.py;
the results in results.py, the subject in subject.py, the negative controls in controls.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble
from perm_core.run import trace_names
from perm_core.run.devices import placed
from perm_core.run.numerics import exact_numerics
from perm_core.run.trace import Record
from perm_core.verify import expert_blocks, experts, oracle
from perm_core.verify.controls import explain_unbroken, measure_break, run_control
from perm_core.verify.first_break import first_break, stages
from perm_core.verify.results import CheckResult, NotSymmetry, Report, VacuousCheckError
from perm_core.verify.subject import Subject, Unscrambled, inverse_of_spaces
from perm_core.verify.tolerances import MOVED_AT, floored_abs, in_eps, relative_differences, worst, worst_abs, worst_rel

__all__ = ["check", "check_scramble", "scrambled_weights", "summarize"]


def summarize(subject: Subject, symmetry, direction, errors, moved, moved_what, note="") -> CheckResult:
    """One symmetry's verdict in one direction from its tensors' errors, by the verdict rules (a streamed check
    judges its stages' errors through it too)."""
    if not errors and not note:
        raise VacuousCheckError(f"the {direction} check of {symmetry} compared no tensors")
    non_finite = [e.name for e in errors if not e.finite]
    if non_finite:
        note = f"non-finite values in {', '.join(non_finite[:5])}" + (" ..." if len(non_finite) > 5 else "")
    elif not note and not moved >= MOVED_AT:
        note = (f"the transform moved nothing it acts on (largest change {moved:.1e} < {MOVED_AT}, of the "
                "tokens and of each weight on its own scale): un-scrambling an unchanged model proves nothing")
    passed = bool(errors) and not note and all(e.passed for e in errors)
    rel = worst_rel(errors)
    return CheckResult(symmetry, direction, passed, worst_abs(errors), rel, subject.tolerance, errors, moved,
                       moved_what, note, floored_abs(errors), in_eps(rel, subject.dtype),
                       first_break(errors, **subject.places), stages(errors, **subject.places))


class StreamedGradients:
    """Each parameter gradient of a scrambled run, compared with the original's as backward hands it over and then
    dropped: its difference after un-scrambling."""

    def __init__(self, subject: Subject, scramble: Scramble, original: dict[str, Record]):
        self.subject, self.original = subject, original
        self.inverse = inverse_of_spaces(scramble, original)
        self.scale = subject._scales(original, list(original), subject.dtype)
        self.differences: dict[str, tuple[float, float, bool]] = {}
        self.expert_names = experts.expert_tensors(subject)
        self.expert_errors: dict[str, tuple[float, ...]] = {}  # verify.experts, of the gradients that have them

    def __call__(self, parameter: str, record: Record) -> None:
        name = trace_names.param_grad(parameter)
        if name not in self.original:
            return
        reference = {name: self.original[name].tensor}
        restored = Unscrambled({name: record}, self.inverse, self.subject.geometry.patch_size)
        self.differences.update(relative_differences(reference, restored, self.scale))
        if name in self.expert_names:
            self.expert_errors.update(experts.measured((name,), reference, restored, self.scale))


def check_scramble(subject: Subject, scramble: Scramble, label: str, original: dict[str, Record],
                   backward: bool = True, stream: bool = True) -> list[CheckResult]:
    """stream: parameter gradients are compared as backward makes them (StreamedGradients); should any tensor
    fail, the check is run again with every gradient kept, so a round-off fallback sees them all."""
    streamed = StreamedGradients(subject, scramble, original) if backward and stream else None
    scrambled = subject.trace(scramble, backward=backward, params=subject.transformed_params(scramble),
                              on_param_grad=streamed)
    # The transformed set is not kept through the comparison (a model's worth of memory): the weights'
    # movement builds the few tensors it looks at again.
    restored = subject.unscramble_lazily(scrambled, scramble)
    errors = subject.errors(original, restored, scramble, streamed.differences if streamed else None)
    if streamed is not None and not (errors and all(e.passed for e in errors)):
        del scrambled, restored, errors
        return check_scramble(subject, scramble, label, original, backward, stream=False)
    # Which expert an expert tensor's error is in (verify.experts): measured as backward handed the gradient over,
    # or here, each such tensor un-scrambled once more
    names = experts.expert_tensors(subject)
    per_expert = streamed.expert_errors if streamed is not None else experts.measured(
        names, original, restored, subject._scales(original, list(original), subject.dtype)) if names else {}
    errors = experts.with_expert_errors(errors, per_expert)
    del scrambled, restored
    moved, what = subject.element_movement(scramble)
    results = []
    for direction in ("forward", "backward") if backward else ("forward",):
        mine = [e for e in errors if trace_names.is_grad(e.name) == (direction == "backward")]
        results.append(summarize(subject, label, direction, mine, moved, what))
    if subject.geometry.n_experts and not all(r.passed for r in results):  # where its experts broke (expert_blocks)
        blocks = expert_blocks.diagnose(subject, scramble, subject.transformed_params(scramble), subject.tolerance)
        results = [replace(r, experts=blocks) if not r.passed else r for r in results]
    return results


def cannot_move(subject: Subject, name: str, backward: bool) -> list[CheckResult]:
    """The results of a tokens check on an input with too few movable tokens: nothing to check, said so."""
    note = (f"the input has {subject.movable_tokens} movable token(s): the tokens symmetry cannot move "
            "anything, so there is nothing to check")
    directions = ("forward", "backward") if backward else ("forward",)
    return [summarize(subject, name, d, [], 0.0, "", note) for d in directions]


def named_keys(symmetry_names, key: int | Mapping[str, int]) -> tuple[list[str], dict[str, int]]:
    """The symmetries named, in order, and each one's key (`key`: one for all, or one per name); none named is a
    VacuousCheckError."""
    names = list(symmetry_names)
    if not names:
        raise VacuousCheckError("no symmetry to check: name at least one")
    return names, dict(key) if isinstance(key, Mapping) else {name: key for name in names}


@dataclass
class SymmetryPlan:
    """What a check judges, settled before any element runs: the same for the whole-model and the streamed check."""

    names: list[str]  # the symmetries checked: neither lacked by the architecture nor tokens that cannot move
    steps: list[str]  # each of names, then "all" (every one of them at once) where there are two or more
    controls: dict[str, list[symmetries.Control]]  # by symmetry in names, none empty
    missing: dict[str, str]  # each symmetry named that the architecture lacks, with why: its break is measured


def plan_symmetries(report: Report, judge, geometry, count: int | None, names: list[str], key_of: dict[str, int],
                    backward: bool, include_combined: bool) -> SymmetryPlan:
    """The plan of `names` on a model of `geometry` and an input of `count` tokens; into `report`, the verdicts of
    tokens that cannot move (cannot_move, judged by `judge`: summarize's subject) and the restricted forms checked.
    A symmetry with no negative control is a VacuousCheckError."""
    not_applicable = geometry.not_applicable()
    report.not_applicable = {name: not_applicable[name] for name in names if name in not_applicable}
    names = [name for name in names if name not in not_applicable]
    if not names:
        raise VacuousCheckError(f"nothing to check on {report.family}: "
                                + "; ".join(f"{n}: {why}" for n, why in report.not_applicable.items()))
    not_holding = geometry.not_holding()
    missing = {name: not_holding[name] for name in names if name in not_holding}
    names = [name for name in names if name not in not_holding]
    if "tokens" in names and judge.movable_tokens < 2:
        report.checks.extend(cannot_move(judge, "tokens", backward))
        names.remove("tokens")
    restrictions = geometry.restrictions()
    report.restricted = {name: restrictions[name] for name in names if name in restrictions}
    steps = names + (["all"] if include_combined and len(names) > 1 else [])
    controls = {name: symmetries.controls(name, key_of[name], geometry, count) for name in names}
    for name, found in controls.items():
        if not found:
            raise VacuousCheckError(f"the {name} symmetry has no negative control on {report.family}")
    return SymmetryPlan(names, steps, controls, missing)


def check(model, inputs: dict, symmetry_names=symmetries.SYMMETRIES, key: int | Mapping[str, int] = 0,
          model_name: str = "", backward: bool = True, include_combined: bool = True, progress=None,
          device: str | torch.device | None = None) -> Report:
    """Every symmetry forward (and backward), their composition, and every negative control.
    `key`: one key for every symmetry, or a key per symmetry name (as the app's sidebar sets them).
    `device`: "cpu", "cuda" or "mps": the model moves there (in place, as nn.Module.to) and the inputs with it;
    default: where the model is, the inputs moved to it. A model transformers loaded runs on perm_core's exact
    numerics for the check and is handed back as it came (run.numerics.exact_numerics)."""
    names, key_of = named_keys(symmetry_names, key)
    model, inputs = placed(model, inputs, device)
    with exact_numerics(model):
        return _checked(model, inputs, names, key_of, model_name, backward, include_combined, progress)


def _checked(model, inputs: dict, names: list[str], key_of: dict[str, int], model_name: str, backward: bool,
             include_combined: bool, progress) -> Report:
    subject = Subject(model, inputs)
    report = Report(model_name or type(model).__name__, subject.family.name, str(subject.dtype).split(".")[-1],
                    {name: key_of[name] for name in names})
    if progress:
        progress(0.0, "original run" + (" and its gradients" if backward else ""))
    clock = _PartClock(report.seconds)
    with clock("original"):
        original = subject.trace(backward=backward)
    with clock("oracle"):
        report.oracle = oracle.consult(subject, original)
    plan = plan_symmetries(report, subject, subject.geometry, subject.n_tokens, names, key_of, backward,
                           include_combined)
    names, steps, controls, missing = plan.names, plan.steps, plan.controls, plan.missing
    # One unit per scrambled run: each check, each control (runs are about equally long).
    total, done = len(steps) + len(missing) + sum(len(c) for c in controls.values()), 0

    def advance(message: str) -> None:
        nonlocal done
        if progress:
            progress(done / total, message)
        done += 1

    for name in steps:
        advance(f"checking {name}")
        keys = {n: key_of[n] for n in names} if name == "all" else {name: key_of[name]}
        with clock("checks"):
            report.checks.extend(check_scramble(subject, subject.build(keys), name, original, backward))
        for control in controls.get(name, []):
            advance(f"{name}: negative control, {control.description}")  # words, not its identifier
            with clock("controls"):
                result = explain_unbroken(subject, control, run_control(subject, control, original))
                if result.broken and control.name in expert_blocks.MOE_CONTROLS:  # where in the experts it broke
                    result = replace(result, experts=expert_blocks.diagnose(
                        subject, control.scramble, subject.transformed_params(control.scramble), subject.tolerance))
                report.controls.append(result)
    for name, reason in missing.items():
        advance(f"{name}: measuring why it does not hold")
        scramble = subject.build({name: key_of[name]})
        with clock("not_symmetries"):
            broken_by = measure_break(subject, scramble, original)
        report.not_symmetries.append(NotSymmetry(name, reason, broken_by))
    if progress:
        progress(1.0, "done")
    return report


class _PartClock:
    """`with clock(part):` adds the block's wall seconds to seconds[part]."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds = seconds

    @contextlib.contextmanager
    def __call__(self, part: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - started


def worst_check(report: Report) -> float:
    return worst(c.max_rel_error for c in report.checks)


def scrambled_weights(model, symmetry_names, key: int | Mapping[str, int] = 0,
                      device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """The model's parameters transformed by the weight symmetries named (not tokens, which act on inputs), each with
    `key` (one for all, or one per name): name -> tensor, the model's values untouched (`device`: moved there
    first, as check does)."""
    names = list(symmetry_names)
    if "tokens" in names:
        raise ValueError("tokens permute the input, not the weights: scramble the input instead")
    model, _ = placed(model, {}, device)
    key_of = dict(key) if isinstance(key, Mapping) else {name: key for name in names}
    subject = Subject(model)
    return subject.transformed_params(subject.build({name: key_of[name] for name in names}))
