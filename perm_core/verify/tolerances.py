"""Tensor comparisons behind every verdict: per-tensor errors, tolerances, and reductions that never
let a NaN or an infinity pass.

The rules, written once for the checks, the controls, Explore, Backward, Rotation and Fusion:
* A tensor's relative error is max |a - b| / max |b|, on the tensor's *own* scale.
* A tensor that is zero in exact arithmetic (named by verify.subject.key_bias_floors: the gradient
  of a key bias: softmax ignores a shift shared by a whole row) holds only round-off, so it is judged
  against FLOOR x the largest tensor of its kind instead; the report lists every such tensor and why.
* A non-finite value in either tensor, or a non-finite error, is an error of +inf: it fails every
  check and breaks every control, and reports name the tensor as "non-finite".
* float64 tensors are held to 1e-9. A float32 tensor is held to max(1e-4, ROUNDOFF_SAFETY x its own
  measured float32 round-off), the round-off being its distance from the same model run in float64
  (relative, on the same scale), capped at ROUNDOFF_CAP: deep or wide models accumulate round-off
  that a fixed 1e-4 does not allow for, and a cap keeps every pass meaningful.
* A float64 tensor over 1e-9 gets the same allowance one precision down: ROUNDOFF_SAFETY x its
  float32 round-off (measured the same way) x 2^-29, the ratio of the two unit round-offs, capped at
  FLOAT64_ROUNDOFF_CAP. Ill-conditioned tensors need it: in a deep random BERT-base the query-weight
  gradients of the last layers are 1e-10 of the largest gradient, sums of cancelling terms; float32
  gets them wrong by 300x, and float64 by 1.7e-7, within 1.6x of the scaled estimate. A spec bug is
  an O(1) error, far over the cap.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass

import torch

from perm_core.fast.batched_gathers import gathered_difference_by_rows, gathered_differences, on_cpu
from perm_core.run import trace_names

TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
FLOOR = {torch.float64: 1e-6, torch.float32: 1e-2}
ROUNDOFF_SAFETY = 8.0  # two independent float32 runs, each off by its round-off, plus margin
ROUNDOFF_CAP = 1e-3
FLOAT64_ROUNDOFF_CAP = 1e-6
UNIT_ROUNDOFF_RATIO = 2.0**-53 / 2.0**-24  # float64's unit round-off over float32's
BROKEN_AT = 1e-3  # a negative control is broken when some tensor moves by more than this (relative)
# A check proves something only if its transform moved what it acts on: some weight, activation or
# gradient of the scrambled world must differ from the original by at least this (relative).
MOVED_AT = 0.1


@dataclass
class TensorError:
    name: str
    max_abs_error: float
    max_rel_error: float
    tolerance: float = math.nan  # this tensor's own tolerance (see the module docstring)
    floor_reason: str | None = None  # why this tensor is judged against the floor, if it is
    finite: bool = True
    # A tensor whose axis 0 is a layer's experts (verify.experts): each expert's relative error, on this tensor's
    # scale; None for every other tensor
    expert_errors: tuple[float, ...] | None = None

    @property
    def passed(self) -> bool:
        return self.finite and self.max_rel_error <= self.tolerance

    @property
    def worst_expert(self) -> int | None:
        """The expert that holds this tensor's largest error (a non-finite error counts as the largest)."""
        if not self.expert_errors:
            return None
        return max(range(len(self.expert_errors)),
                   key=lambda e: math.inf if math.isnan(self.expert_errors[e]) else self.expert_errors[e])

    @property
    def experts_over_tolerance(self) -> int | None:
        if self.expert_errors is None:
            return None
        return sum(not error <= self.tolerance for error in self.expert_errors)  # a NaN is over


def tensor_entry(error: TensorError, empty_floor: bool = False) -> dict:
    """A TensorError as a report writes it: floor_reason where one applies (always with empty_floor, as null
    elsewhere), the errors per expert and the worst expert only for a tensor that has them."""
    entry = {k: v for k, v in asdict(error).items()
             if (k != "floor_reason" or v or empty_floor) and (k != "expert_errors" or v)}
    if error.expert_errors:
        entry["worst_expert"] = error.worst_expert
    return entry


def worst(values) -> float:
    """The largest value, with any NaN counted as +inf (Python's max() silently drops NaN)."""
    result = 0.0
    for value in values:
        if not math.isfinite(value):
            return math.inf
        result = max(result, value)
    return result


def headline(errors) -> list:
    """The tensors a headline error is taken over: those judged by their relative error. A finite tensor judged
    against the floor is zero in exact arithmetic, so its relative error measures nothing about the transform (see
    floored_abs); a non-finite one stays, so that a NaN anywhere still makes the headline inf."""
    return [e for e in errors if not (e.floor_reason and e.finite)]


def worst_rel(errors) -> float:
    return worst(e.max_rel_error for e in headline(errors))


def worst_abs(errors) -> float:
    return worst(e.max_abs_error for e in headline(errors))


def floored_abs(errors) -> float:
    """The largest absolute value left in tensors that are zero in exact arithmetic (reported apart)."""
    return worst(e.max_abs_error for e in errors if e.floor_reason)


def in_eps(relative_error: float, dtype: torch.dtype) -> float:
    """A relative error in units of the dtype's machine epsilon (2^-52 for float64, 2^-23 for float32)."""
    return relative_error / torch.finfo(dtype).eps


def is_finite(tensor: torch.Tensor) -> bool:
    return bool(torch.isfinite(tensor).all())


def kind_of(name: str) -> str:
    if trace_names.is_param_grad(name):
        return "grad.param"
    return "grad" if trace_names.is_grad(name) else "forward"


def scales(tensors: dict[str, torch.Tensor], floor_reasons: dict[str, str], dtype: torch.dtype) -> dict:
    """Each tensor's reference scale: its own largest |value|, or for exact zeros the kind floor."""
    return floored({n: largest_magnitude(t) for n, t in tensors.items()}, floor_reasons, dtype)


def floored(own: dict[str, float], floor_reasons: dict[str, str], dtype: torch.dtype) -> dict[str, float]:
    """Each tensor's own scale (its largest |value|: whole, or over every piece a streamed check saw), or for an
    exact zero (`floor_reasons`) FLOOR x the largest finite scale of its kind."""
    largest = {}
    for name, value in own.items():
        if math.isfinite(value):
            largest[kind_of(name)] = max(largest.get(kind_of(name), 0.0), value)
    floor = FLOOR.get(dtype, FLOOR[torch.float32])
    return {n: floor * largest.get(kind_of(n), 0.0) if n in floor_reasons else v for n, v in own.items()}


def relative_differences(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor],
                         scale: dict[str, float]) -> dict[str, tuple[float, float, bool]]:
    """name -> (max abs difference, relative difference, both finite), for names in both.

    Small tensors are compared a batch at a time, in five torch calls per batch instead of four per tensor: each
    call lets the GIL go and must win it back, and a classroom's sessions drawing charts made every such return
    cost milliseconds (a dinov2-s key change compares about 250 tensors)."""
    differences = _in_one_call(reference, other)
    batch: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    held = 0
    for name, ref in reference.items():
        if name in differences:
            continue
        by_rows = _by_rows(ref, other, name)
        if by_rows is not None:
            differences[name] = by_rows
            continue
        # Fetched once: `other` may build each tensor when asked (verify.Unscrambled), and then frees it here.
        mine = other.get(name)
        if mine is None or mine.shape != ref.shape:
            continue
        if batch and (batch[0][1].dtype != ref.dtype or held >= BATCH_BYTES):
            differences.update(_batched_max_abs_differences(batch))
            batch, held = [], 0
        if _batchable(ref, mine):
            batch.append((name, ref, mine))
            held += mine.numel() * mine.element_size()
        else:
            differences[name] = _max_abs_difference(ref, mine)
        del mine
    if batch:
        differences.update(_batched_max_abs_differences(batch))
    found = {}
    for name in reference:
        if name not in differences:
            continue
        # Taken in the tensors' own dtype: near-equal floats subtract exactly (Sterbenz), and one pass is
        # enough for finiteness too, since NaN propagates through max and inf - inf is NaN.
        found[name] = relative(differences[name], scale[name])
    return found


def relative(diff: float, scale: float) -> tuple[float, float, bool]:
    """(max |a - b|, relative difference, finite) of a tensor from its max |a - b| and its scale: (inf, inf, False)
    where either is not finite; over a zero scale, any difference but zero is infinitely large."""
    if not (math.isfinite(diff) and math.isfinite(scale)):
        return math.inf, math.inf, False
    return diff, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf), True


def _in_one_call(reference: dict[str, torch.Tensor], other) -> dict[str, float]:
    """max |a - b| of every pair up to CHUNK elements of one dtype, in one torch call, for `other` a dict or one
    that un-scrambles by gathers (verify.Unscrambled: each un-scrambled tensor is made, compared and dropped
    inside that call). A larger tensor is compared in slices, below, so that its difference is never held whole."""
    steps_of = getattr(other, "gather_steps", None)
    if steps_of is None and not isinstance(other, dict):
        return {}  # a mapping that builds each tensor when asked: one at a time, below, not all held at once
    names, tensors, references, steps = [], [], [], []
    for name, ref in reference.items():
        if name not in other or ref.numel() > CHUNK:
            continue
        found = steps_of(name) if steps_of is not None else (other[name], [])
        if found is None or found[0].shape != ref.shape or found[0].dtype != ref.dtype:
            continue
        names.append(name)
        tensors.append(found[0])
        references.append(ref)
        steps.append(found[1])
    if not names or not on_cpu(tensors + references, steps):
        return {}
    return dict(zip(names, gathered_differences(tensors, references, steps), strict=True))


def _by_rows(reference: torch.Tensor, other, name: str) -> float | None:
    """max |a - b| of a large tensor that `other` un-scrambles by gathers (verify.Unscrambled), gathered and compared
    a slice of rows at a time instead of un-scrambled whole first; None where that does not apply."""
    steps_of = getattr(other, "gather_steps", None)
    if steps_of is None or reference.numel() <= BATCH_ELEMENTS or name not in other:
        return None
    found = steps_of(name)
    if found is None or not found[1] or not on_cpu([found[0], reference], [found[1]]):
        return None
    tensor, steps = found
    if tensor.shape != reference.shape or tensor.dtype != reference.dtype:  # a permutation keeps the shape
        return None
    return gathered_difference_by_rows(tensor.detach(), reference.detach(), steps, CHUNK)


def _batchable(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (0 < a.numel() <= BATCH_ELEMENTS and a.dtype == b.dtype and a.dtype.is_floating_point
            and a.device == b.device)


def _batched_max_abs_differences(batch: list[tuple[str, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """name -> max |a - b| for a batch of non-empty, same-dtype pairs: the same numbers as _max_abs_difference
    (max propagates NaN)."""
    names, refs, mine = zip(*batch, strict=True)
    differences = torch._foreach_sub(list(refs), list(mine))
    torch._foreach_abs_(differences)  # then max: _foreach_norm(inf) is four times slower on CPU
    return dict(zip(names, torch.stack(torch._foreach_max(differences)).tolist(), strict=True))


# Elements per slice of a large reduction: a slice's temporary stays in cache, where a whole-tensor temporary
# (a 134 MB logits tensor) would be fresh memory faulted in and written twice; about 5x faster, same result.
CHUNK = 1 << 19

# Bytes of small tensors compared in one batch (its differences are held at once: 1 MiB of them stay in cache, and
# 8 MiB made a smollm2-135m comparison twice as slow as one by one), and the largest tensor
# taken into one: bigger ones are compared alone (torch's _foreach reductions are slow on them), in slices of
# CHUNK. A dinov2-s attention map (396k elements) is one slice: five calls where two slices took about a dozen.
BATCH_BYTES = 1 << 20
BATCH_ELEMENTS = 1 << 18


def _max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over every element; NaN if either holds a NaN (max propagates it, slice by slice)."""
    n = a.numel()
    if not n:
        return 0.0
    if a.requires_grad or b.requires_grad:  # out= refuses them, and a comparison is never differentiated
        a, b = a.detach(), b.detach()
    if n <= CHUNK and a.dtype == b.dtype:  # one slice: few torch calls, where each call must win the GIL back
        return torch.sub(a, b, out=_scratch(n, a.dtype, a.device).view(a.shape)).abs_().max().item()
    dtype = a.dtype if a.dtype == b.dtype else torch.float64  # near-equal floats subtract exactly in their own
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    buffer = _scratch(min(CHUNK, n), dtype, a.device)
    maxima = torch.empty((n + CHUNK - 1) // CHUNK, dtype=dtype, device=a.device)
    same = a.dtype == b.dtype  # then no conversion calls: each torch call must win the GIL back
    for i, start in enumerate(range(0, n, CHUNK)):
        stop = min(start + CHUNK, n)
        part = buffer[:stop - start]
        slice_a, slice_b = flat_a[start:stop], flat_b[start:stop]
        torch.sub(slice_a if same else slice_a.to(dtype), slice_b if same else slice_b.to(dtype), out=part)
        maxima[i] = part.abs_().max()
    return maxima.max().item()


_scratches = threading.local()


def _scratch(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """n elements of a temporary this thread keeps (at most CHUNK): a fresh one per comparison is memory the
    kernel faults in and zeroes each time, since glibc gives blocks this large back when they are freed."""
    kept = getattr(_scratches, "buffer", None)
    if kept is None or kept.dtype != dtype or kept.device != device or kept.numel() < n:
        kept = _scratches.buffer = torch.empty(n, dtype=dtype, device=device)
    return kept[:n]


def largest_magnitude(tensor: torch.Tensor) -> float:
    """max |t| in one pass without a temporary; NaN if t holds a NaN."""
    if not tensor.numel():
        return 0.0
    low, high = torch.aminmax(tensor)
    return max(-low.item(), high.item()) if not (low.isnan() or high.isnan()) else math.nan


def relative_error(reference: torch.Tensor, tensor: torch.Tensor) -> float:
    """max |tensor - reference| / max |reference| of one pair, on the reference's own scale; inf if either holds a
    non-finite value."""
    return relative_differences({"x": reference}, {"x": tensor}, {"x": largest_magnitude(reference)})["x"][1]


def tensor_errors(original: dict, restored: dict[str, torch.Tensor], floor_reasons: dict[str, str] | None = None,
                  roundoff: dict[str, float] | None = None, scale: dict[str, float] | None = None) -> list[TensorError]:
    """Per-tensor errors of `restored` against `original` (Records or tensors), with tolerances.

    roundoff: name -> the tensor's measured float32 round-off (relative), from `measure_roundoff`; it raises the
    tolerance of float32 and float64 tensors alike (see the module docstring).
    scale: the reference's `scales`, when the caller already has them (one original, many comparisons).
    """
    floor_reasons = floor_reasons or {}
    reference = {n: getattr(r, "tensor", r) for n, r in original.items() if n in restored}
    if not reference:
        return []
    dtype = next(iter(reference.values())).dtype
    scale = scale if scale is not None else scales(reference, floor_reasons, dtype)
    return judged(relative_differences(reference, restored, scale), dtype, floor_reasons, roundoff)


def judged(differences: dict[str, tuple[float, float, bool]], dtype: torch.dtype, floor_reasons: dict[str, str],
           roundoff: dict[str, float] | None = None) -> list[TensorError]:
    """Errors with tolerances from `relative_differences`' result: a caller that raises the tolerances after a
    first verdict (a measured round-off) judges the same differences again instead of comparing again."""
    base = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    errors = []
    for name, (diff, rel, finite) in differences.items():
        tolerance = base
        if roundoff is not None and dtype == torch.float32 and name in roundoff:
            tolerance = min(max(base, ROUNDOFF_SAFETY * roundoff[name]), ROUNDOFF_CAP)
        elif roundoff is not None and dtype == torch.float64 and name in roundoff:
            tolerance = min(max(base, ROUNDOFF_SAFETY * roundoff[name] * UNIT_ROUNDOFF_RATIO), FLOAT64_ROUNDOFF_CAP)
        errors.append(TensorError(name, diff, rel, tolerance, floor_reasons.get(name), finite))
    return errors


def judged_with_roundoff(differences: dict[str, tuple[float, float, bool]], dtype: torch.dtype,
                         floor_reasons: dict[str, str], original_roundoff=None, own_roundoff=None) -> list[TensorError]:
    """The round-off allowance rule of every check, whole-model or streamed (module docstring): the base tolerance;
    only where a finite tensor is over it (a measured round-off costs a rerun), the original run's measured
    round-off (`original_roundoff()`, None where it cannot be measured); where one is still over, the larger of it
    and the element's own run's (`own_roundoff()`: a permutation reorders sums, so it can round more)."""
    errors = judged(differences, dtype, floor_reasons)
    if original_roundoff is None or all(e.passed or not e.finite for e in errors):
        return errors
    roundoff = original_roundoff()
    errors = judged(differences, dtype, floor_reasons, roundoff)
    if own_roundoff is None or all(e.passed or not e.finite for e in errors):
        return errors
    own = own_roundoff()
    both = {n: max(roundoff.get(n, 0.0), own.get(n, 0.0)) for n in {*roundoff, *own}}
    return judged(differences, dtype, floor_reasons, both)


def measure_roundoff(float32_run: dict, float64_run: dict, floor_reasons: dict[str, str]) -> dict[str, float]:
    """name -> relative distance of a float32 run from the same computation in float64."""
    reference = {n: getattr(r, "tensor", r) for n, r in float64_run.items()}
    mine = {n: getattr(r, "tensor", r) for n, r in float32_run.items() if n in reference}
    scale = scales(reference, floor_reasons, torch.float32)  # the float32 floor: what float32 can resolve
    return {n: rel if finite else math.inf
            for n, (_, rel, finite) in relative_differences(reference, mine, scale).items()}


def json_safe(value):
    """A structure strict JSON accepts: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
