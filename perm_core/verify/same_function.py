"""Are two checkpoints of one family the same function, and which group element maps A to B?

In float64 on a few reproducible probe inputs:
  outputs   logits, pooled output, last hidden state: the only traced tensors every weight symmetry leaves in
            place (up to the residual channel order, which is un-scrambled), so they alone decide "same function".
  element   recovered from the weights (perm_core.verify.recover), applied to A: the parameter residual against B says
            whether it reproduces B, and B's traced tensors, un-scrambled by it, must then match A's one by one
            (hidden states and attention maps of A and B differ by the element even when the functions are equal).
Verdicts: "same function" (exit 0) when the outputs agree, the residual is at round-off and every un-scrambled
tensor agrees; "same function, element not recovered" (exit 1) when only the outputs agree; "different
functions" (exit 1) otherwise, naming what differs most after the best alignment.

At the stored precision: two checkpoints stored in float64 are held to float64 round-off (1e-9). When either is
stored coarser (float32, bfloat16, float16), B can only be A's image rounded to that dtype, so the weights are held
to ROUNDINGS unit round-offs of the stored dtype (plus float32 arithmetic, see weight_bound) of each tensor's
largest entry, and every traced tensor, outputs included, to a bound propagated through A itself: PROPAGATION x
what moving every weight of A as far as a rounded copy may move it does to the tensor (propagated_bounds). The
verdict then says "same function up to float32 rounding of the stored weights". Outputs that agree only within
that bound vouch for nothing when the weights do not: without the element, "same function" needs outputs equal
to float64 round-off.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from perm_core.engine.spec import transform_params
from perm_core.families import family_of
from perm_core.run import trace_names
from perm_core.run.devices import model_device, placed
from perm_core.run.numerics import exact_numerics
from perm_core.schemas import SCHEMA_VERSION
from perm_core.verify.recover import NOT_RECOVERED, Recovered, recover
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import TOLERANCE, TensorError, json_safe, tensor_entry, tensor_errors, worst_rel

FLOAT32_ROUNDING = 1e-5  # a residual below this but above round-off looks like weights stored in float32
# The weight bound, relative to each tensor's largest |entry| (the scale the residual is measured on), is
#   ROUNDINGS x u_stored + FLOAT32_ARITHMETIC x u_float32,   u = unit round-off (half the machine epsilon).
# Invariant: B = round_stored(E(A) + e): A moved by the element E, maybe off by the arithmetic e of applying E,
# then rounded once to the stored dtype. Rounding to nearest moves an entry x by at most u_stored |x|, so one
# rounding leaves at most 1 u_stored of the tensor's scale (scramble applies E in float64: e is nil); A and B both
# rounded from one float64 original leave two, the second moved by E's orthogonal maps. ROUNDINGS = 4 is twice
# those two. A writer that applies E's rotations in float32 adds its arithmetic and the rounding of the rotation
# itself, relative to the tensor's scale: FLOAT32_ARITHMETIC = 16 u_float32, about twice the 8.8 measured at
# head_dim 256 (1.7, 7.2, 6.7 at head_dim 4, 64, 128), and 1e-6 next to bfloat16's 1.6e-2.
# Measured through compare on gpt2, llama, bert, vit, gpt_neox, t5, qwen3 and phi3 (tiny random configs, every
# weight symmetry, float32 and bfloat16): residuals of at most 0.85 u_stored rounded once, 1.31 u_stored rounded
# twice, 2.56 u_float32 rotated in float32: at most 0.29 of the bound. A 1e-3 nudge of one weight is 800 times the
# float32 bound (tests/unit/test_stored_precision.py).
ROUNDINGS = 4
FLOAT32_ARITHMETIC = 16
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# Traced tensors (outputs included) are held to PROPAGATION x the change caused in them, on the same probes, by
# moving every entry x of every weight of A as far as the invariant above lets it move, with random signs:
# ROUNDINGS u_stored |x| (a rounding is relative to the entry itself; the weight check relaxes it to the tensor's
# largest entry) + FLOAT32_ARITHMETIC u_float32 of the tensor's largest entry. To first order the rounded pair's
# errors are a smaller move through the same Jacobian. Measured on the pairs above: the worst traced tensor
# reaches 0.20 of its bound (t5, bfloat16, rounded twice), at most 0.07 elsewhere; over 8 seeds of the signs the
# bound varies by up to 3.8x (vit, bfloat16; seed 0 is t5's smallest), which leaves every pair at least 5x inside
# its bound whatever the seed. PROPAGATION = 2 is part of that margin. The bound is loose in bfloat16 (0.1 to 1
# relative on tiny random models, where the actual errors are 3e-3 to 0.1): the weights decide the verdict there.
PROPAGATION = 2.0
PROPAGATION_SEED = 0


def weight_bound(precision: torch.dtype | None) -> float:
    """The residual allowed per parameter (relative to its largest |entry|): float64 round-off when both
    checkpoints are float64 (precision None), else the stored dtype's rounding (see ROUNDINGS)."""
    if precision is None or precision == torch.float64:
        return TOLERANCE[torch.float64]
    return ROUNDINGS * UNIT_ROUNDOFF[precision] + FLOAT32_ARITHMETIC * UNIT_ROUNDOFF[torch.float32]


def coarsest(*dtypes: torch.dtype | None) -> torch.dtype | None:
    """The stored dtype whose rounding a pair carries: the coarser of the two; None when neither is known to be
    rounded (zoo and random models are made in the dtype asked for)."""
    known = [d for d in dtypes if d is not None and d != torch.float64]
    return max(known, key=lambda d: UNIT_ROUNDOFF[d]) if known else None


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


class IncomparableError(ValueError):
    """Two models that are not two checkpoints of one architecture (family, shapes or parameter names)."""


@dataclass
class Comparison:
    a: str
    b: str
    family: str
    n_probes: int
    recovered: Recovered
    outputs: list[TensorError]  # the symmetry-invariant outputs, B's un-scrambled to A's channel order
    parameters: list[TensorError]  # A moved by the recovered element, against B
    tensors: list[TensorError]  # every traced tensor of B un-scrambled by the recovered element, against A's
    tolerance: float = TOLERANCE[torch.float64]  # float64 round-off: outputs this close need no element
    stored: tuple[torch.dtype | None, torch.dtype | None] = (None, None)  # A's and B's stored dtypes, if known
    # Each TensorError's `tolerance` is its bound: the weight bound for parameters, the propagated bound for traced
    # tensors (both `tolerance` when the pair is not rounded).
    bounds: dict[str, float] = field(default_factory=dict)

    @property
    def precision(self) -> torch.dtype | None:
        """The stored dtype whose rounding the pair carries; None: held to float64 round-off."""
        return coarsest(*self.stored)

    @property
    def rounding(self) -> str:
        return f"{dtype_name(self.precision)} rounding of the stored weights" if self.precision else ""

    @property
    def output_error(self) -> float:
        return worst_rel(self.outputs)

    @property
    def output_bound(self) -> float:
        return worst_of(self.outputs, over_bound=True).tolerance if self.outputs else self.tolerance

    @property
    def weight_bound(self) -> float:
        return weight_bound(self.precision)

    @property
    def same_function(self) -> bool:
        """The outputs agree within their bounds (float64 round-off, or their propagated rounding)."""
        return bool(self.outputs) and all(e.passed for e in self.outputs)

    @property
    def outputs_exact(self) -> bool:
        return bool(self.outputs) and self.output_error <= self.tolerance

    @property
    def residual(self) -> float:
        return worst_rel(self.parameters)

    @property
    def weights_within(self) -> bool:
        return all(e.passed for e in self.parameters)

    @property
    def tensors_within(self) -> bool:
        return all(e.passed for e in self.tensors)

    @property
    def element_recovered(self) -> bool:
        return self.weights_within and self.tensors_within

    @property
    def exact(self) -> bool:
        """Everything within float64 round-off: a rounded pair that needed none of its rounding (permutations)."""
        return self.residual <= self.tolerance and worst_rel(self.tensors) <= self.tolerance

    @property
    def verdict(self) -> str:
        if self.same_function and self.element_recovered:
            return f"same function up to {self.rounding}" if self.precision and not self.exact else "same function"
        if (self.same_function and self.weights_within) or self.outputs_exact:
            return "same function, element not recovered"
        return "different functions"

    @property
    def exit_code(self) -> int:
        return 0 if self.same_function and self.element_recovered else 1

    def explanation(self) -> str:
        """One sentence behind the verdict, naming the tensor that decides it."""
        parameter, output = worst_of(self.parameters, over_bound=True), worst_of(self.outputs, over_bound=True)
        traced = worst_of(self.tensors, over_bound=True)
        if self.exit_code == 0 and self.precision and not self.exact:
            return (f"B is A transformed by the recovered element, up to {self.rounding}: parameters within "
                    f"{self.residual:.1e} of their largest entries (bound {self.weight_bound:.1e} = {ROUNDINGS} u_"
                    f"{dtype_name(self.precision)} + {FLOAT32_ARITHMETIC} u_float32), outputs within "
                    f"{self.output_error:.1e} (propagated bound {self.output_bound:.1e}), every traced tensor within "
                    f"its propagated bound (closest: {traced.name}, {traced.max_rel_error:.1e} of "
                    f"{traced.tolerance:.1e})")
        if self.exit_code == 0:
            return (f"B is A transformed by the recovered element: parameters within {parameter.max_rel_error:.1e} "
                    f"and every traced tensor within {traced.max_rel_error:.1e} (tolerance {self.tolerance:.0e})")
        if self.same_function and self.weights_within:
            return (f"the weights and outputs agree{' up to ' + self.rounding if self.precision else ''}, but B's "
                    f"traced tensors un-scrambled by the recovered element do not match A's: {traced.name} is off by "
                    f"{traced.max_rel_error:.1e} (bound {traced.tolerance:.1e})")
        if self.outputs_exact:
            return (f"the outputs agree (within {self.output_error:.1e}) but no recovered element reproduces B: "
                    f"{parameter.name} is off by {parameter.max_rel_error:.1e}")
        if self.weights_within:
            return (f"B's weights are A's moved by an element that is not a symmetry of {self.family}"
                    f"{' (up to ' + self.rounding + ')' if self.precision else ''}: {output.name} differs by "
                    f"{output.max_rel_error:.1e}, {traced.name} by {traced.max_rel_error:.1e}")
        hint = (" (weights rounded to float32? scramble --dtype float64 writes an exact copy)"
                if self.residual < FLOAT32_ROUNDING and not self.precision else "")
        held = (f", more than {self.rounding} allows ({self.weight_bound:.1e})" if self.precision else "")
        return (f"after the best alignment {parameter.name} differs most "
                f"({parameter.max_rel_error:.1e} relative){held}{hint}; "
                f"outputs differ by {self.output_error:.1e} ({output.name})")

    def to_json(self) -> dict:
        worst_parameter = worst_of(self.parameters)
        return json_safe({
            "schema_version": SCHEMA_VERSION, "a": self.a, "b": self.b, "family": self.family, "dtype": "float64",
            "probes": self.n_probes,
            "stored_dtype": {"a": dtype_name(self.stored[0]), "b": dtype_name(self.stored[1])},
            "precision": dtype_name(self.precision or torch.float64),
            "tolerance": self.tolerance,
            "bounds": {"weights": self.weight_bound, "outputs": self.output_bound,
                       "rule": "float64 round-off" if not self.precision else
                       f"weights: {ROUNDINGS} u_{dtype_name(self.precision)} + {FLOAT32_ARITHMETIC} u_float32 of each "
                       f"tensor's largest entry; traced tensors: {PROPAGATION:g} x the change caused by moving every "
                       f"entry x of A's weights by {ROUNDINGS} u_{dtype_name(self.precision)} |x| + "
                       f"{FLOAT32_ARITHMETIC} u_float32 max|W| (random signs)"},
            "same_function": self.same_function, "output_error": self.output_error,
            "output_tensor": worst_of(self.outputs).name,
            "recovered": self.recovered.summary(), "not_recovered": NOT_RECOVERED,
            "residual": {"max_rel_error": self.residual, "worst_tensor": worst_parameter.name,
                         "parameters": [_entry(e) for e in self.parameters]},
            "tensors": [_entry(e) for e in self.tensors],
            "verdict": self.verdict, "explanation": self.explanation()})


def _entry(error: TensorError) -> dict:
    return tensor_entry(error)


def worst_of(errors: list[TensorError], over_bound: bool = False) -> TensorError:
    """The largest relative error, or with over_bound the largest relative error over its own tolerance."""
    def key(e):
        value = e.max_rel_error / e.tolerance if over_bound and e.tolerance > 0 else e.max_rel_error
        return value if math.isfinite(value) else math.inf

    return max(errors, key=key) if errors else TensorError("", math.nan, math.nan)


def probe_inputs(loaded, count: int = 2) -> list[dict]:
    """Reproducible inputs: the model's default input for seeds 0 .. count - 1, without repeats (a text
    model with a tokenizer or an image model has one default input whatever the seed)."""
    from perm_core.models.defaults import default_inputs

    probes = []
    for seed in range(count):
        candidate = default_inputs(loaded, seed)
        if not any(candidate.keys() == p.keys() and all(torch.equal(candidate[k], p[k]) for k in p) for p in probes):
            probes.append(candidate)
    return probes


def check_comparable(model_a, model_b) -> None:
    family_a, family_b = family_of(model_a).name, family_of(model_b).name
    if family_a != family_b:
        raise IncomparableError(f"A is a {family_a} model and B a {family_b} model: only two checkpoints of one "
                                "family can be the same function up to its symmetries")
    shapes_a = {n: tuple(p.shape) for n, p in model_a.named_parameters()}
    shapes_b = {n: tuple(p.shape) for n, p in model_b.named_parameters()}
    if shapes_a != shapes_b:
        differing = sorted(set(shapes_a) ^ set(shapes_b)) or [n for n in shapes_a if shapes_a[n] != shapes_b[n]]
        raise IncomparableError(f"A and B are {family_a} models of different shapes or classes (first difference: "
                                f"{differing[0]})")
    for name, model in (("A", model_a), ("B", model_b)):
        dtype = next(model.parameters()).dtype
        if dtype != torch.float64:
            raise IncomparableError(f"{name} is {dtype}: compare models in float64 (load them with dtype=float64)")


def compare_models(model_a, model_b, probes: list[dict], name_a: str = "A", name_b: str = "B",
                   stored: tuple[torch.dtype | None, torch.dtype | None] = (None, None),
                   device: str | torch.device | None = None) -> Comparison:
    """stored: the dtypes A's and B's weights were stored in (None: not rounded, e.g. a random model); a pair
    stored coarser than float64 is held to that dtype's rounding (module docstring). device: both models move there
    (in place) and the probes with them; default: where A is."""
    check_comparable(model_a, model_b)
    model_a, _ = placed(model_a, {}, device)
    model_b, _ = placed(model_b, {}, model_device(model_a))
    probes = [placed(model_a, probe, None)[1] for probe in probes]
    with exact_numerics(model_a), exact_numerics(model_b):
        return _compared(model_a, model_b, probes, name_a, name_b, stored)


def _compared(model_a, model_b, probes: list[dict], name_a: str, name_b: str, stored) -> Comparison:
    precision = coarsest(*stored)
    subject_a, params_b = Subject(model_a), dict(model_b.named_parameters())
    # recovery is matching on the host (its index and eye tensors are CPU tensors); .cpu() copies nothing there
    recovered = recover({n: p.detach().cpu() for n, p in subject_a.params.items()},
                        {n: p.detach().cpu() for n, p in params_b.items()},
                        subject_a.spec, subject_a.claims, subject_a.geometry)
    moved_a = transform_params(subject_a.params, subject_a.spec, recovered.element, subject_a.claims)
    parameters = tensor_errors({n: p.detach() for n, p in params_b.items()},
                               {n: p.detach() for n, p in moved_a.items()})
    traced: dict[str, TensorError] = {}
    originals = []
    for probe in probes:
        originals.append(Subject(model_a, probe).trace())
        restored = subject_a.unscramble(Subject(model_b, probe).trace(), recovered.element)
        for error in tensor_errors(originals[-1], restored):
            if error.name not in traced or not error.max_rel_error <= traced[error.name].max_rel_error:
                traced[error.name] = error
    bounds = {}
    if precision is not None:
        parameters = [dataclasses.replace(e, tolerance=weight_bound(precision)) for e in parameters]
        bounds = propagated_bounds(model_a, subject_a.params, probes, originals, precision)
        traced = {n: dataclasses.replace(e, tolerance=max(e.tolerance, bounds.get(n, 0.0)))
                  for n, e in traced.items()}
    tensors = list(traced.values())
    outputs = [e for e in tensors if trace_names.is_output(e.name)]
    return Comparison(name_a, name_b, subject_a.family.name, len(probes), recovered, outputs, parameters, tensors,
                      stored=stored, bounds=bounds)


def perturbed(params: dict[str, torch.Tensor], precision: torch.dtype, seed: int = PROPAGATION_SEED) -> dict:
    """Every entry x of every weight moved by ROUNDINGS u_stored |x| + FLOAT32_ARITHMETIC u_float32 max |W|, with
    random signs: as far as a rounded copy may move it (see PROPAGATION)."""
    generator = torch.Generator().manual_seed(seed)
    rounding, arithmetic = ROUNDINGS * UNIT_ROUNDOFF[precision], FLOAT32_ARITHMETIC * UNIT_ROUNDOFF[torch.float32]
    moved = {}
    for name, param in params.items():
        param = param.detach()
        signs = torch.randint(0, 2, param.shape, generator=generator).to(param.device, param.dtype).mul_(2).sub_(1)
        moved[name] = param + signs.mul_(param.abs().mul(rounding).add_(arithmetic * param.abs().max()))
    return moved


def propagated_bounds(model_a, params_a: dict, probes: list[dict], originals: list[dict], precision: torch.dtype,
                      seed: int = PROPAGATION_SEED) -> dict[str, float]:
    """traced tensor -> PROPAGATION x the largest relative change (over the probes) that moving A's weights as far
    as a rounded copy may move them (`perturbed`) causes in it."""
    moved = perturbed(params_a, precision, seed)
    found: dict[str, float] = {}
    for probe, original in zip(probes, originals, strict=True):
        changed = Subject(model_a, probe).trace(params=moved)
        for error in tensor_errors(original, {n: r.tensor for n, r in changed.items()}):
            value = error.max_rel_error if math.isfinite(error.max_rel_error) else math.inf
            found[error.name] = max(found.get(error.name, 0.0), value)
    return {name: PROPAGATION * value for name, value in found.items()}
