"""Are two checkpoints of one family the same function, and which group element maps A to B?

In float64 on a few reproducible probe inputs:
  outputs   logits, pooled output, last hidden state: the only traced tensors every weight symmetry leaves in
            place (up to the residual channel order, which is un-scrambled), so they alone decide "same function".
  element   recovered from the weights (perm_core.recover), applied to A: the parameter residual against B says
            whether it reproduces B, and B's traced tensors, un-scrambled by it, must then match A's one by one
            (hidden states and attention maps of A and B differ by the element even when the functions are equal).
Verdicts: "same function" (exit 0) when the outputs agree, the residual is at round-off and every un-scrambled
tensor agrees; "same function, element not recovered" (exit 1) when only the outputs agree; "different
functions" (exit 1) otherwise, naming what differs most after the best alignment.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from perm_core.compare import TOLERANCE, TensorError, json_safe, tensor_errors, worst_rel
from perm_core.families import family_of
from perm_core.recover import NOT_RECOVERED, Recovered, recover
from perm_core.spec import transform_params
from perm_core.verify import Subject

FLOAT32_ROUNDING = 1e-5  # a residual below this but above round-off looks like weights stored in float32


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
    tolerance: float = TOLERANCE[torch.float64]

    @property
    def output_error(self) -> float:
        return worst_rel(self.outputs)

    @property
    def same_function(self) -> bool:
        return bool(self.outputs) and self.output_error <= self.tolerance

    @property
    def residual(self) -> float:
        return worst_rel(self.parameters)

    @property
    def element_recovered(self) -> bool:
        return self.residual <= self.tolerance and worst_rel(self.tensors) <= self.tolerance

    @property
    def verdict(self) -> str:
        if self.same_function:
            return "same function" if self.element_recovered else "same function, element not recovered"
        return "different functions"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "same function" else 1

    def explanation(self) -> str:
        """One sentence behind the verdict, naming the tensor that decides it."""
        parameter, traced, output = worst_of(self.parameters), worst_of(self.tensors), worst_of(self.outputs)
        if self.verdict == "same function":
            return (f"B is A transformed by the recovered element: parameters within {parameter.max_rel_error:.1e} "
                    f"and every traced tensor within {traced.max_rel_error:.1e} (tolerance {self.tolerance:.0e})")
        if self.same_function:
            return (f"the outputs agree (within {self.output_error:.1e}) but no recovered element reproduces B: "
                    f"{parameter.name} is off by {parameter.max_rel_error:.1e}")
        if self.residual <= self.tolerance:
            return (f"B's weights are A's moved by an element that is not a symmetry of {self.family}: "
                    f"{output.name} differs by {output.max_rel_error:.1e}, {traced.name} by {traced.max_rel_error:.1e}")
        hint = (" (weights rounded to float32? scramble --dtype float64 writes an exact copy)"
                if self.residual < FLOAT32_ROUNDING else "")
        return (f"after the best alignment {parameter.name} differs most "
                f"({parameter.max_rel_error:.1e} relative){hint}; "
                f"outputs differ by {self.output_error:.1e} ({output.name})")

    def to_json(self) -> dict:
        worst_parameter = worst_of(self.parameters)
        return json_safe({
            "a": self.a, "b": self.b, "family": self.family, "dtype": "float64", "probes": self.n_probes,
            "tolerance": self.tolerance, "same_function": self.same_function, "output_error": self.output_error,
            "output_tensor": worst_of(self.outputs).name,
            "recovered": self.recovered.summary(), "not_recovered": NOT_RECOVERED,
            "residual": {"max_rel_error": self.residual, "worst_tensor": worst_parameter.name,
                         "parameters": [_entry(e) for e in self.parameters]},
            "tensors": [_entry(e) for e in self.tensors],
            "verdict": self.verdict, "explanation": self.explanation()})


def _entry(error: TensorError) -> dict:
    return {k: v for k, v in asdict(error).items() if k != "floor_reason" or v}


def worst_of(errors: list[TensorError]) -> TensorError:
    def key(e):
        return e.max_rel_error if math.isfinite(e.max_rel_error) else math.inf

    return max(errors, key=key) if errors else TensorError("", math.nan, math.nan)


def probe_inputs(loaded, count: int = 2) -> list[dict]:
    """Reproducible inputs: the model's default input for seeds 0 .. count - 1, without repeats (a text
    model with a tokenizer or an image model has one default input whatever the seed)."""
    from perm_core.defaults import default_inputs

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


def compare_models(model_a, model_b, probes: list[dict], name_a: str = "A", name_b: str = "B") -> Comparison:
    check_comparable(model_a, model_b)
    subject_a, params_b = Subject(model_a), dict(model_b.named_parameters())
    recovered = recover(subject_a.params, params_b, subject_a.spec, subject_a.claims, subject_a.geometry)
    moved_a = transform_params(subject_a.params, subject_a.spec, recovered.element, subject_a.claims)
    parameters = tensor_errors({n: p.detach() for n, p in params_b.items()},
                               {n: p.detach() for n, p in moved_a.items()})
    traced: dict[str, TensorError] = {}
    for probe in probes:
        original = Subject(model_a, probe).trace()
        restored = subject_a.unscramble(Subject(model_b, probe).trace(), recovered.element)
        for error in tensor_errors(original, restored):
            if error.name not in traced or not error.max_rel_error <= traced[error.name].max_rel_error:
                traced[error.name] = error
    tensors = list(traced.values())
    outputs = [e for e in tensors if e.name.startswith("output.")]
    return Comparison(name_a, name_b, subject_a.family.name, len(probes), recovered, outputs, parameters, tensors)
