"""Scramble, run, un-scramble, compare: the check behind every verdict in the app and the CLI.

A check passes only if (1) every un-scrambled tensor is finite and within its tolerance, (2) the
transform really moved something (see tolerances.MOVED_AT), and (3) it compared at least one tensor.
A report passes only if it has checks, all pass, and every symmetry has negative controls that
all break. The error rules (own scale, floors for exact zeros, float32 round-off) are in tolerances.py.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import (
    LAYERED_ROLES,
    Claim,
    Concat,
    FamilySpec,
    Scramble,
    apply_axes,
    transform_param,
    transform_params,
)
from perm_core.engine.tokens import model_inputs, n_tokens
from perm_core.families import Family, Geometry, family_of
from perm_core.run.capture import output_projection, stopped_input
from perm_core.run.stateless import own_parameters
from perm_core.run.trace import Record, run
from perm_core.run.vocabulary import cut_to_rows_read
from perm_core.verify import oracle
from perm_core.verify.first_break import Stage, first_break, stages
from perm_core.verify.oracle import OracleResult
from perm_core.verify.tolerances import (
    BROKEN_AT,
    FLOOR,
    MOVED_AT,
    TOLERANCE,
    TensorError,
    floored_abs,
    in_eps,
    json_safe,
    judged,
    largest_magnitude,
    measure_roundoff,
    relative_differences,
    scales,
    tensor_errors,
    worst,
    worst_abs,
    worst_rel,
)

__all__ = ["BROKEN_AT", "FLOOR", "MOVED_AT", "TOLERANCE", "CheckResult", "ControlResult", "Report", "Subject",
           "TensorError", "VacuousCheckError", "check", "tensor_errors", "worst_rel"]
KEY_BIAS_REASON = "key-bias gradient: softmax ignores a shift shared by a whole row, so it is zero exactly"


class VacuousCheckError(ValueError):
    """A check that could not prove anything: no symmetries, no tensors, or no negative control."""


@dataclass
class CheckResult:
    symmetry: str
    direction: str  # "forward" | "backward"
    passed: bool
    max_abs_error: float
    max_rel_error: float
    tolerance: float  # the base tolerance of the dtype; a tensor may have its own, raised by its round-off (tensors)
    tensors: list[TensorError]
    moved: float = math.nan  # how far the element moves what it acts on (Subject.element_movement): the share of
    # movable tokens it moves, or a weight's relative change; proof the check is not vacuous
    moved_what: str = ""
    note: str = ""  # why it failed, when not an error above tolerance
    # The headline errors above are over tensors judged by relative error; tensors that are zero in exact
    # arithmetic (judged against the floor) are reported apart by the absolute value left in them.
    floored_max_abs_error: float = 0.0
    max_rel_error_eps: float = 0.0  # max_rel_error in units of the dtype's machine epsilon
    first_break: str = ""  # the first traced tensor, in the order the run computed them, over its tolerance
    stages: list[Stage] = field(default_factory=list)  # the worst error over tolerance of each place, in that order

    @property
    def non_finite(self) -> list[str]:
        return [t.name for t in self.tensors if not t.finite]

    @property
    def floored(self) -> dict[str, str]:
        return {t.name: t.floor_reason for t in self.tensors if t.floor_reason}


@dataclass
class ControlResult:
    symmetry: str
    name: str
    description: str
    broken: bool
    max_rel_error: float
    measured_on: str = "every traced tensor"  # or the one early activation that already showed the break
    # False when this checkpoint cannot tell the control from the symmetry: what it gets wrong acts on tensors that
    # are uniform here (a norm at init), so its element is itself a symmetry of this checkpoint (see explain_unbroken)
    informative: bool = True
    note: str = ""

    @property
    def holds(self) -> bool:
        """What a report requires of a control: it breaks, or this checkpoint cannot tell it apart (and says why)."""
        return self.broken or not self.informative


@dataclass
class NotSymmetry:
    """A symmetry the architecture does not have, with the measured break of its standard element."""

    symmetry: str
    reason: str
    max_rel_error: float

    @property
    def broken(self) -> bool:  # the evidence: without a break the claim "does not hold" is unproven
        return self.max_rel_error > BROKEN_AT


@dataclass
class Report:
    model: str
    family: str
    dtype: str
    keys: dict[str, int] = field(default_factory=dict)  # the key of each symmetry checked
    checks: list[CheckResult] = field(default_factory=list)
    controls: list[ControlResult] = field(default_factory=list)
    not_symmetries: list[NotSymmetry] = field(default_factory=list)
    restricted: dict[str, str] = field(default_factory=dict)  # symmetry -> the restricted form checked, and why
    oracle: OracleResult | None = None  # the original run against transformers' own forward (oracle.py)
    # Wall seconds of each part (original, oracle, checks, controls, not_symmetries); not part of the verdict
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return ((bool(self.checks) or bool(self.not_symmetries)) and all(c.passed for c in self.checks)
                and (self.oracle is None or self.oracle.passed)
                and all(c.holds for c in self.controls) and all(n.broken for n in self.not_symmetries))

    def to_json(self) -> dict:
        """Strict JSON: non-finite numbers are written as the strings "nan", "inf", "-inf"."""
        checks = []
        for c in self.checks:
            entry = {k: v for k, v in asdict(c).items() if k != "tensors"}
            entry["non_finite"] = c.non_finite
            entry["floored"] = c.floored
            entry["tensors"] = [{k: v for k, v in asdict(t).items() if k != "floor_reason" or v} for t in c.tensors]
            checks.append(entry)
        controls = [{k: v for k, v in asdict(c).items() if k != "description" and (k != "note" or v)}
                    for c in self.controls]
        not_symmetries = [{**asdict(n), "broken": n.broken} for n in self.not_symmetries]
        return json_safe({"model": self.model, "family": self.family, "dtype": self.dtype, "keys": self.keys,
                          "passed": self.passed, "checks": checks, "controls": controls,
                          "not_symmetries": not_symmetries, "restricted": self.restricted,
                          "oracle": None if self.oracle is None else {**asdict(self.oracle),
                                                                      "passed": self.oracle.passed}})


class Subject:
    """A model and one input, with everything derived from them computed once."""

    def __init__(self, model, inputs: dict | None = None):
        self.model = model
        self.family: Family = family_of(model)
        self.spec: FamilySpec = self.family.spec(model.config)
        self.geometry: Geometry = self.family.geometry(model.config)
        self.params = own_parameters(model)  # a shared model: not another session's swapped-in tensors
        self.claims: dict[str, Claim] = self.spec.claim_all(self.params)
        self.inputs = inputs
        self.dtype = next(iter(self.params.values())).dtype
        self.n_tokens = n_tokens(inputs, self.geometry) if inputs else None
        self.floor_reasons = {f"grad.param.{name}": KEY_BIAS_REASON for name, claim in self.claims.items()
                              if claim.rule.tag == "attn.k" and self.params[name].dim() == 1
                              and not self.geometry.rope}
        self._roundoff: dict[int, tuple] = {}
        self._early_originals: dict[str, torch.Tensor] = {}
        self._scales_of: dict[tuple, tuple] = {}

    @property
    def movable_tokens(self) -> int:
        return self.geometry.movable_tokens(self.n_tokens or 0)

    @property
    def tolerance(self) -> float:
        """The dtype's base tolerance (a tensor may have its own, raised by its measured round-off)."""
        return TOLERANCE.get(self.dtype, TOLERANCE[torch.float32])

    @property
    def places(self) -> dict:
        """What first_break needs to put this subject's traced tensors in the order its run computes them."""
        g = self.geometry
        return {"n_layers": g.n_layers,
                "parameter_layers": {name: claim.layer for name, claim in self.claims.items()},
                "embedding_parameters": frozenset(n for n, c in self.claims.items() if c.rule.tag == "embedding"),
                "first_decoder_layer": g.n_layers - g.n_decoder_layers if g.n_decoder_layers else None}

    def with_params(self, params: dict[str, torch.Tensor]) -> Subject:
        """The same model, input and spec with other weights (same names and shapes), nothing measured yet."""
        other = copy.copy(self)
        other.params = params
        other._roundoff, other._early_originals, other._scales_of = {}, {}, {}
        return other

    def build(self, keys_by_symmetry: dict[str, int]) -> Scramble:
        return symmetries.build_many(keys_by_symmetry, self.geometry, self.n_tokens)

    def transformed_params(self, scramble: Scramble) -> dict[str, torch.Tensor]:
        return transform_params(self.params, self.spec, scramble, self.claims)

    def trace(self, scramble: Scramble | None = None, backward: bool = False,
              params: dict[str, torch.Tensor] | None = None, dtype: torch.dtype | None = None,
              on_param_grad=None, graph: bool = False) -> dict[str, Record]:
        """graph: a forward as one TorchScript graph (trace.run)."""
        scramble = scramble or Scramble()
        if params is None:
            params = self.params if scramble.is_identity else self.transformed_params(scramble)
        dtype = dtype or self.dtype
        if dtype != self.dtype:
            params = {name: p.to(dtype) for name, p in params.items()}
        kwargs = model_inputs(self.inputs, self.geometry, scramble, dtype)
        return run(self.model, params, kwargs, self.geometry, self.claims, backward=backward,
                   on_param_grad=on_param_grad, graph=graph)

    def unscramble(self, records: dict[str, Record], scramble: Scramble) -> dict[str, torch.Tensor]:
        return dict(self.unscramble_lazily(records, scramble))

    def unscramble_lazily(self, records: dict[str, Record], scramble: Scramble) -> Unscrambled:
        return Unscrambled(records, _inverse_of_spaces(scramble, records), self.geometry.patch_size)

    def early_original(self, module_name: str) -> torch.Tensor:
        """The original model's input to `module_name` (a forward stopped there), once per subject."""
        if module_name not in self._early_originals:
            self._early_originals[module_name] = stopped_input(self, self.params, Scramble(), module_name)
        return self._early_originals[module_name]

    def roundoff(self, original: dict[str, Record]) -> dict[str, float]:
        """Each tensor's float32 round-off: its distance from the same run in float64 (see tolerances.py); for a
        float64 subject, the same model run in float32 is the other side. Measured once per original trace, and
        only when some tensor needs it."""
        cached = self._roundoff.get(id(original))
        if cached is None or cached[0] is not original:
            backward = any(name.startswith("grad.") for name in original)
            if self.dtype == torch.float64:
                runs = (self.trace(backward=backward, dtype=torch.float32), original)
            else:
                runs = (original, self.trace(backward=backward, dtype=torch.float64))
            cached = (original, measure_roundoff(*runs, self.floor_reasons))
            self._roundoff[id(original)] = cached
        return cached[1]

    def errors(self, original: dict[str, Record], restored: dict[str, torch.Tensor],
               scramble: Scramble | None = None, measured: dict | None = None) -> list[TensorError]:
        """Per-tensor errors; a tensor over its dtype's tolerance gets what its measured round-off allows: the
        original run's and, given the `scramble` that `restored` comes from, that run's own (a permutation
        reorders sums, so the scrambled run can round more than the original: a smollm2 layer-norm gradient
        at 1.1e-4 whose original float32 round-off was 1e-5)."""
        measured = measured or {}
        names = [n for n in original if n in restored or n in measured]
        if not names:
            return []
        reference = {n: getattr(original[n], "tensor", original[n]) for n in names if n not in measured}
        dtype = getattr(original[names[0]], "tensor", original[names[0]]).dtype
        # Compared once, each restored tensor built, compared and dropped in turn (`restored` may be Unscrambled):
        # a float64 check's gradients alone are a model-sized set, and memory first touched is slow to fault in.
        # `measured`: differences already taken (parameter gradients compared as backward made them).
        found = relative_differences(reference, restored, self._scales(original, names, dtype))
        differences = {n: measured[n] if n in measured else found[n] for n in names if n in measured or n in found}
        errors = judged(differences, dtype, self.floor_reasons)
        if self.dtype in (torch.float32, torch.float64) and any(e.finite and not e.passed for e in errors):
            roundoff = self.roundoff(original)
            errors = judged(differences, dtype, self.floor_reasons, roundoff)
            if scramble is not None and any(e.finite and not e.passed for e in errors):
                own = self._scrambled_roundoff(restored, scramble)
                roundoff = {n: max(roundoff.get(n, 0.0), own.get(n, 0.0)) for n in {*roundoff, *own}}
                errors = judged(differences, dtype, self.floor_reasons, roundoff)
        return errors

    def _scrambled_roundoff(self, restored: dict[str, torch.Tensor], scramble: Scramble) -> dict[str, float]:
        """The scrambled run's round-off: its un-scrambled records against the same run in the other dtype."""
        backward = any(name.startswith("grad.") for name in restored)
        other = torch.float32 if self.dtype == torch.float64 else torch.float64
        rerun = self.unscramble(self.trace(scramble, backward=backward, dtype=other), scramble)
        runs = (rerun, restored) if other == torch.float32 else (restored, rerun)
        return measure_roundoff(*runs, self.floor_reasons)

    def _scales(self, original: dict[str, Record], names: list[str], dtype: torch.dtype) -> dict[str, float]:
        """The original's scales (see compare.scales) over `names`, measured once per original trace: every key
        change compares against the same original."""
        key = (id(original), tuple(names), dtype)
        cached = self._scales_of.get(key)
        if cached is None or cached[0] is not original:
            reference = {n: getattr(original[n], "tensor", original[n]) for n in names}
            cached = (original, scales(reference, self.floor_reasons, dtype))
            if len(self._scales_of) >= 8:
                self._scales_of.clear()
            self._scales_of[key] = cached
        return cached[1]

    def weight_movement(self, params: Mapping[str, torch.Tensor], enough: float = MOVED_AT) -> dict[str, float]:
        """'weight NAME' -> relative change (own scale) of parameters the scramble touched, smallest first,
        stopping at the first that moved by `enough`: one moved weight is the proof, and a full pass over
        every weight would cost as much as building them. `params` may build each tensor when asked
        (TransformedOnDemand): then only the tensors up to the first moved one are built."""
        moved = {}
        for name in sorted(params, key=lambda n: self.params[n].numel()):
            after = params[name]
            if after is self.params[name] or after.shape != self.params[name].shape:
                continue
            before, after = self.params[name].detach(), after.detach()
            _, rel, _ = relative_differences({name: before}, {name: after}, {name: largest_magnitude(before)})[name]
            moved[f"weight {name}"] = rel
            if rel >= enough:
                break
        return moved

    def element_movement(self, scramble: Scramble) -> tuple[float, str]:
        """How far the element moves what it acts on, each tensor against its own size: the input's tokens (the
        share of movable tokens it moves, each with its ids and position) and the weights (weight_movement).
        A check is vacuous exactly when this is below MOVED_AT; forward and backward share it, since both
        directions run the same element on the same input and weights."""
        moved: dict[str, float] = {}
        if scramble.tokens is not None and self.movable_tokens > 0:
            index = scramble.tokens.index
            shifted = int((index != torch.arange(len(index), device=index.device)).sum())
            if shifted:
                moved[f"tokens: {shifted} of {self.movable_tokens} movable moved"] = shifted / self.movable_tokens
        if not max(moved.values(), default=0.0) >= MOVED_AT:
            moved.update(self.weight_movement(TransformedOnDemand(self, scramble)))
        return most_moved(moved)

    def movement(self, original: dict[str, Record], scrambled: dict[str, Record],
                 weights=None) -> tuple[float, str]:
        """How far the scrambled world is from the original before un-scrambling: the largest relative
        change of a recorded tensor or, where none moved enough, of a weight (`weights`: a dict from
        `weight_movement`, or a callable giving one, asked only when needed). Returns (amount, what)."""
        moved: dict[str, float] = {}
        reference = {n: r.tensor for n, r in original.items()}
        scale = self._scales(original, list(original), self.dtype)
        for name, (_, rel, finite) in relative_differences(
                reference, {n: r.tensor for n, r in scrambled.items()}, scale).items():
            if finite and name not in self.floor_reasons:
                moved[name] = rel
        if weights is not None and not max(moved.values(), default=0.0) >= MOVED_AT:
            moved.update(weights() if callable(weights) else weights)
        return most_moved(moved)


def most_moved(moved: dict[str, float]) -> tuple[float, str]:
    """(amount, what) of the tensor that moved most, a non-finite amount counting least; (0.0, "") if none."""
    if not moved:
        return 0.0, ""
    what = max(moved, key=lambda n: moved[n] if math.isfinite(moved[n]) else -1.0)
    return moved[what], what


class TransformedOnDemand(Mapping):
    """The scrambled parameter dict, each tensor built when it is asked for (the same tensor transform_params
    gives): a check does not keep a model-sized set alive through its comparisons for the few weights it may
    ask for."""

    def __init__(self, subject: Subject, scramble: Scramble):
        self._subject, self._scramble = subject, scramble

    def __getitem__(self, name: str) -> torch.Tensor:
        return transform_param(self._subject.params[name], self._subject.claims[name], self._scramble)

    def __contains__(self, name) -> bool:  # Mapping's own would build the tensor to answer
        return name in self._subject.params

    def __iter__(self):
        return iter(self._subject.params)

    def __len__(self) -> int:
        return len(self._subject.params)


class Unscrambled(Mapping):
    """The inverse applied to a scrambled run's records, each tensor when it is asked for (the same tensor
    Subject.unscramble gives). A kept result holds the scrambled trace only, half the bytes, and a page draws
    a few of its tensors: thirty sessions rendering their results held every un-scrambled copy too."""

    def __init__(self, records: dict[str, Record], inverse: Scramble, patch_size):
        self._records, self._inverse, self._patch_size = records, inverse, patch_size

    def __getitem__(self, name: str) -> torch.Tensor:
        record = self._records[name]
        return apply_axes(record.tensor, record.axes, self._inverse, record.layer, self._patch_size)

    def gather_steps(self, name: str):
        """(the scrambled tensor, the (axis, index) gathers that un-scramble it), or None where the inverse is
        not a pure gather (a rotation, the pixels): compare.relative_differences then makes all of a run's
        un-scrambled tensors and their differences in one call."""
        from perm_core.fast.batched_gathers import steps_of
        from perm_core.fast.param_cache import gather_indices

        record = self._records[name]
        if not isinstance(record.axes, tuple):
            return None
        indices = gather_indices(record.axes, self._inverse, record.layer, tuple(record.tensor.shape))
        return None if indices is None else (record.tensor, steps_of(indices))

    def __contains__(self, name) -> bool:  # Mapping's own would un-scramble the tensor to answer
        return name in self._records

    def __iter__(self):
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)


def _inverse_of_spaces(scramble: Scramble, records: dict[str, Record]) -> Scramble:
    """The inverse of the spaces the records live in: an activation trace touches only the residual stream, the
    heads and the tokens, and inverting every per-layer Q/K/V/O/MLP chain it never reads would cost as much as
    comparing."""
    needed = set()
    for record in records.values():
        for role in record.axes if isinstance(record.axes, tuple) else ():
            parts = [part for part, _ in role.parts] if isinstance(role, Concat) else [role] if role else []
            for part in parts:
                name, layer = part if isinstance(part, tuple) else (part, record.layer)
                needed.add((name, layer if name in LAYERED_ROLES else None))
    spaces = {space: chain for space, chain in scramble.spaces.items() if space in needed}
    return Scramble(spaces, scramble.tokens).inverse()


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
        self.inverse = _inverse_of_spaces(scramble, original)
        self.scale = subject._scales(original, list(original), subject.dtype)
        self.differences: dict[str, tuple[float, float, bool]] = {}

    def __call__(self, parameter: str, record: Record) -> None:
        name = f"grad.param.{parameter}"
        if name not in self.original:
            return
        reference = {name: self.original[name].tensor}
        restored = Unscrambled({name: record}, self.inverse, self.subject.geometry.patch_size)
        self.differences.update(relative_differences(reference, restored, self.scale))


def check_scramble(subject: Subject, scramble: Scramble, label: str, original: dict[str, Record],
                   backward: bool = True, stream: bool = True) -> list[CheckResult]:
    """stream: parameter gradients are compared as backward makes them (StreamedGradients); should any tensor
    fail, the check is run again with every gradient kept, so a round-off fallback sees them all."""
    streamed = StreamedGradients(subject, scramble, original) if backward and stream else None
    scrambled = subject.trace(scramble, backward=backward, params=subject.transformed_params(scramble),
                              on_param_grad=streamed)
    # The transformed set is not kept through the comparison (a model's worth of memory): the weights'
    # movement builds the few tensors it looks at again.
    errors = subject.errors(original, subject.unscramble_lazily(scrambled, scramble), scramble,
                            streamed.differences if streamed else None)
    if streamed is not None and not (errors and all(e.passed for e in errors)):
        del scrambled, errors
        return check_scramble(subject, scramble, label, original, backward, stream=False)
    del scrambled
    moved, what = subject.element_movement(scramble)
    results = []
    for direction in ("forward", "backward") if backward else ("forward",):
        mine = [e for e in errors if e.name.startswith("grad.") == (direction == "backward")]
        results.append(summarize(subject, label, direction, mine, moved, what))
    return results


def run_control(subject: Subject, control: symmetries.Control, original: dict[str, Record]) -> ControlResult:
    """A control first runs only up to block 1's MLP activation: it mis-applies its element in every block, so
    a break shows there, for a fifteenth of a full forward's cost on a 30-block model. Where it does not (or the
    model has one block), the full traced run decides."""
    early = _early_break(subject, control)
    if early is not None and early[0] > BROKEN_AT:
        return ControlResult(control.symmetry, control.name, control.description, True, *early)
    # A control's element carries the intended transforms; only how it was applied is wrong.
    restored = subject.unscramble(subject.trace(control.scramble), control.scramble)
    errors = tensor_errors(original, restored, subject.floor_reasons)
    if not errors:
        raise VacuousCheckError(f"control {control.symmetry}/{control.name} compared no tensors")
    amount = worst_rel(errors)
    return ControlResult(control.symmetry, control.name, control.description, amount > BROKEN_AT, amount)


def uniform_tensors(params: Mapping[str, torch.Tensor]) -> list[str]:
    """Parameters whose entries are all equal (a norm gain of ones, a zero bias): no permutation or rotation that
    respects their shape can change them, so a control that gets only their transform wrong cannot bite."""
    return [name for name, p in params.items()
            if p.numel() > 1 and p.is_floating_point() and bool((p == p.reshape(-1)[0]).all())]


def randomized(params: Mapping[str, torch.Tensor], names: list[str], seed: int = 0) -> dict[str, torch.Tensor]:
    """A copy of `params` with each named tensor given distinct values around its own (or around 1 if it is 0)."""
    generator = torch.Generator().manual_seed(seed)
    copied = dict(params)
    for name in names:
        p = params[name].detach()
        level = p.reshape(-1)[0].abs().item() or 1.0
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype)
        copied[name] = p + 0.5 * level * noise
    return copied


def explain_unbroken(subject: Subject, control: symmetries.Control, result: ControlResult) -> ControlResult:
    """A control that did not break is not informative (and does not fail the report) only when this checkpoint
    cannot tell it from the symmetry, shown, not assumed: its error here is round-off, some tensors are uniform,
    and on a copy with exactly those tensors randomized the same control breaks. Otherwise it stays NOT BROKEN."""
    if result.broken or not result.max_rel_error <= subject.tolerance:
        return result  # a broken control, or one broken by more than round-off: nothing to explain
    skipped = control.scramble.skip_tags | {"norm"}  # what a control leaves out is named first
    uniform = sorted(uniform_tensors(subject.params), key=lambda n: subject.claims[n].rule.tag not in skipped)
    if not uniform:
        return result
    varied = subject.with_params(randomized(subject.params, uniform))
    elsewhere = run_control(varied, control, varied.trace())
    if not elsewhere.broken:
        return result
    example = subject.params[uniform[0]].reshape(-1)[0].item()
    note = (f"not informative on this checkpoint: {len(uniform)} tensor(s) are uniform here ({uniform[0]} is "
            f"{example:g} everywhere), so the control's element is itself a symmetry (error "
            f"{result.max_rel_error:.1e}); with those tensors randomized it breaks by {elsewhere.max_rel_error:.1e}")
    return dataclasses.replace(result, informative=False, note=note)


EARLY_LAYER = 1  # block 0 whole, then block 1's attention and MLP input projection


def _early_break(subject: Subject, control: symmetries.Control) -> tuple[float, str] | None:
    """(relative error, where) of the MLP activation of block EARLY_LAYER, un-scrambled with the intended
    element, against the original's; None for a model with fewer blocks or a non-finite error."""
    g = subject.geometry
    if g.n_layers <= EARLY_LAYER:
        return None
    module = output_projection(subject, EARLY_LAYER)
    original = subject.early_original(module)
    # What the run reads before it stops: no head, and of the vocabulary table only the input's rows.
    needed = {n: p for n, p in subject.params.items()
              if subject.claims[n].layer in (None, *range(EARLY_LAYER + 1)) and subject.claims[n].rule.tag != "head"}
    needed, inputs = cut_to_rows_read(subject.model, g, subject.inputs, needed, subject.claims)
    scrambled = stopped_input(subject, transform_params(needed, subject.spec, control.scramble, subject.claims),
                              control.scramble, module, inputs)
    in_decoder = g.n_decoder_layers and EARLY_LAYER >= g.n_layers - g.n_decoder_layers  # decoder tokens stay
    record = Record(scrambled, (None, None if in_decoder else "tokens", ("mlp", EARLY_LAYER)), EARLY_LAYER)
    restored = apply_axes(record.tensor, record.axes, _inverse_of_spaces(control.scramble, {"early": record}),
                          EARLY_LAYER)
    _, rel, finite = relative_differences({"early": original}, {"early": restored},
                                          {"early": largest_magnitude(original)}).get("early", (0.0, 0.0, False))
    return (rel, f"block {EARLY_LAYER}'s MLP activation") if finite else None


def measure_break(subject: Subject, scramble: Scramble, original: dict[str, Record]) -> float:
    """Worst relative error of the un-scrambled forward run: how far the element changes the function."""
    restored = subject.unscramble(subject.trace(scramble), scramble)
    errors = tensor_errors({n: r for n, r in original.items() if not n.startswith("grad.")}, restored,
                           subject.floor_reasons)
    if not errors:
        raise VacuousCheckError("measuring a break compared no tensors")
    return worst_rel(errors)


def cannot_move(subject: Subject, name: str, backward: bool) -> list[CheckResult]:
    """The results of a tokens check on an input with too few movable tokens: nothing to check, said so."""
    note = (f"the input has {subject.movable_tokens} movable token(s): the tokens symmetry cannot move "
            "anything, so there is nothing to check")
    directions = ("forward", "backward") if backward else ("forward",)
    return [summarize(subject, name, d, [], 0.0, "", note) for d in directions]


def check(model, inputs: dict, symmetry_names=symmetries.SYMMETRIES, key: int | Mapping[str, int] = 0,
          model_name: str = "", backward: bool = True, include_combined: bool = True, progress=None) -> Report:
    """Every symmetry forward (and backward), their composition, and every negative control.
    `key`: one key for every symmetry, or a key per symmetry name (as the app's sidebar sets them)."""
    names = list(symmetry_names)
    key_of = dict(key) if isinstance(key, Mapping) else {name: key for name in names}
    if not names:
        raise VacuousCheckError("no symmetry to check: name at least one")
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
    not_holding = subject.geometry.not_holding()
    missing = [name for name in names if name in not_holding]
    names = [name for name in names if name not in not_holding]
    if "tokens" in names and subject.movable_tokens < 2:
        report.checks.extend(cannot_move(subject, "tokens", backward))
        names.remove("tokens")
    restrictions = subject.geometry.restrictions()
    report.restricted = {name: restrictions[name] for name in names if name in restrictions}
    steps = names + (["all"] if include_combined and len(names) > 1 else [])
    controls = {name: symmetries.controls(name, key_of[name], subject.geometry, subject.n_tokens) for name in names}
    for name, found in controls.items():
        if not found:
            raise VacuousCheckError(f"the {name} symmetry has no negative control on {subject.family.name}")
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
            advance(f"{name}: control {control.name}")
            with clock("controls"):
                report.controls.append(explain_unbroken(subject, control, run_control(subject, control, original)))
    for name in missing:
        advance(f"{name}: measuring why it does not hold")
        scramble = subject.build({name: key_of[name]})
        with clock("not_symmetries"):
            broken_by = measure_break(subject, scramble, original)
        report.not_symmetries.append(NotSymmetry(name, not_holding[name], broken_by))
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


def scrambled_weights(model, symmetry_names, key: int | Mapping[str, int] = 0) -> dict[str, torch.Tensor]:
    """The model's parameters transformed by the weight symmetries named (not tokens, which act on inputs), each with
    `key` (one for all, or one per name): name -> tensor, the model itself untouched."""
    names = list(symmetry_names)
    if "tokens" in names:
        raise ValueError("tokens permute the input, not the weights: scramble the input instead")
    key_of = dict(key) if isinstance(key, Mapping) else {name: key for name in names}
    subject = Subject(model)
    return subject.transformed_params(subject.build({name: key_of[name] for name in names}))
