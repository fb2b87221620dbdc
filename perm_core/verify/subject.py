"""A model and one input with everything a check derives from them (Subject): its family, spec and claims, its
traced runs, their un-scrambling, the errors of a run against the original (with the measured round-off a tensor
over its tolerance is allowed) and how far an element moves what it acts on.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import (
    LAYERED_ROLES,
    Claim,
    FamilySpec,
    Scramble,
    apply_axes,
    parts_of,
    transform_param,
    transform_params,
)
from perm_core.engine.tokens import model_inputs, n_tokens
from perm_core.families import Family, Geometry, family_of
from perm_core.run import trace_names
from perm_core.run.capture import stopped_input
from perm_core.run.stateless import own_parameters
from perm_core.run.trace import Record, run
from perm_core.verify.tolerances import (
    MOVED_AT,
    TOLERANCE,
    TensorError,
    judged_with_roundoff,
    measure_roundoff,
    relative_differences,
    relative_error,
    scales,
)

KEY_BIAS_REASON = "key-bias gradient: softmax ignores a shift shared by a whole row, so it is zero exactly"


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
        self.floor_reasons = key_bias_floors(self.claims, lambda name: self.params[name].dim(), self.geometry)
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
        return Unscrambled(records, inverse_of_spaces(scramble, records), self.geometry.patch_size)

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
            backward = any(trace_names.is_grad(name) for name in original)
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
        measurable = self.dtype in (torch.float32, torch.float64)
        return judged_with_roundoff(
            differences, dtype, self.floor_reasons, (lambda: self.roundoff(original)) if measurable else None,
            (lambda: self._scrambled_roundoff(restored, scramble)) if scramble is not None else None)

    def _scrambled_roundoff(self, restored: dict[str, torch.Tensor], scramble: Scramble) -> dict[str, float]:
        """The scrambled run's round-off: its un-scrambled records against the same run in the other dtype."""
        backward = any(trace_names.is_grad(name) for name in restored)
        other = torch.float32 if self.dtype == torch.float64 else torch.float64
        rerun = self.unscramble(self.trace(scramble, backward=backward, dtype=other), scramble)
        runs = (rerun, restored) if other == torch.float32 else (restored, rerun)
        return measure_roundoff(*runs, self.floor_reasons)

    def _scales(self, original: dict[str, Record], names: list[str], dtype: torch.dtype) -> dict[str, float]:
        """The original's scales (see tolerances.scales) over `names`, measured once per original trace: every key
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
        def pairs():
            for name in sorted(params, key=lambda n: self.params[n].numel()):
                after = params[name]
                if after is not self.params[name] and after.shape == self.params[name].shape:
                    yield name, self.params[name].detach(), after.detach()
        return weights_moved(pairs(), enough)

    def element_movement(self, scramble: Scramble) -> tuple[float, str]:
        """How far the element moves what it acts on, each tensor against its own size: the input's tokens (the
        share of movable tokens it moves, each with its ids and position) and the weights (weight_movement).
        A check is vacuous exactly when this is below MOVED_AT; forward and backward share it, since both
        directions run the same element on the same input and weights."""
        return element_movement(scramble, self.movable_tokens,
                                lambda: self.weight_movement(TransformedOnDemand(self, scramble)))

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


def key_bias_floors(claims: dict[str, Claim], ndim, geometry: Geometry) -> dict[str, str]:
    """The gradients judged against a floor, and why (KEY_BIAS_REASON): a key bias's (ndim(name): a parameter's
    number of axes), zero in exact arithmetic where no rotary embedding turns the keys, so that only round-off is
    left to compare. The whole-model and the streamed check both take theirs from here."""
    return {} if geometry.rope else {trace_names.param_grad(name): KEY_BIAS_REASON for name, claim in claims.items()
                                     if claim.rule.tag == "attn.k" and ndim(name) == 1}


def weights_moved(pairs: Iterable[tuple[str, torch.Tensor, torch.Tensor]], enough: float = MOVED_AT
                  ) -> dict[str, float]:
    """'weight NAME' -> the relative change (own scale) of each (name, before, after) in the order given (smallest
    first: the cheapest proof), stopping at the first that moved by `enough`; `pairs` may read or build each tensor
    only when it is reached (a streamed check reads them from the shards)."""
    moved = {}
    for name, before, after in pairs:
        moved[f"weight {name}"] = rel = relative_error(before, after)
        if rel >= enough:
            break
    return moved


def element_movement(scramble: Scramble, movable_tokens: int, weights) -> tuple[float, str]:
    """How far an element moves what it acts on, each tensor against its own size: the input's tokens (the share of
    movable tokens it moves, each with its ids and position) and, where they moved less than MOVED_AT, the weights
    (`weights()`: weights_moved's dict, asked only then). A check is vacuous exactly when this is below MOVED_AT; the
    whole-model and the streamed check both measure it so."""
    moved: dict[str, float] = {}
    if scramble.tokens is not None and movable_tokens > 0:
        index = scramble.tokens.index
        shifted = int((index != torch.arange(len(index), device=index.device)).sum())
        if shifted:
            moved[f"tokens: {shifted} of {movable_tokens} movable moved"] = shifted / movable_tokens
    if not max(moved.values(), default=0.0) >= MOVED_AT:
        moved.update(weights())
    return most_moved(moved)


def most_moved(moved: dict[str, float]) -> tuple[float, str]:
    """(amount, what) of the tensor that moved most, a non-finite amount counting least; (0.0, "") if none."""
    if not moved:
        return 0.0, ""
    what = max(moved, key=lambda n: moved[n] if math.isfinite(moved[n]) else -1.0)
    return moved[what], what


class OnDemand(Mapping):
    """A dict of tensors under `names` (a collection), each made by get(name) when it is asked for and not kept: a
    check does not hold a model-sized set alive for the few tensors it looks at."""

    def __init__(self, names, get):
        self._names, self._get = names, get

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._get(name)

    def __contains__(self, name) -> bool:  # Mapping's own would make the tensor to answer
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class TransformedOnDemand(OnDemand):
    """The scrambled parameter dict, each tensor built when it is asked for (the same tensor transform_params
    gives)."""

    def __init__(self, subject: Subject, scramble: Scramble):
        super().__init__(subject.params, lambda name: transform_param(subject.params[name], subject.claims[name],
                                                                      scramble))


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
        not a pure gather (a rotation, the pixels): tolerances.relative_differences then makes all of a run's
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


def inverse_of_spaces(scramble: Scramble, records: dict[str, Record]) -> Scramble:
    """The inverse of the spaces the records live in: an activation trace touches only the residual stream, the
    heads and the tokens, and inverting every per-layer Q/K/V/O/MLP chain it never reads would cost as much as
    comparing."""
    needed = set()
    for record in records.values():
        for role in record.axes if isinstance(record.axes, tuple) else ():
            for part in parts_of(role):
                name, layer = part if isinstance(part, tuple) else (part, record.layer)
                needed.add((name, layer if name in LAYERED_ROLES else None))
    spaces = {space: chain for space, chain in scramble.spaces.items() if space in needed}
    return Scramble(spaces, scramble.tokens).inverse()
