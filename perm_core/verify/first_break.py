"""Where a check first breaks: its traced tensors in the order the run computed them, and the error layer by layer.

A forward run computes the embeddings, then each block's attention and hidden state, then the outputs; a backward
run computes the same gradients in reverse, the head's parameters first and the embedding tables last. A spec bug
in one block leaves every tensor before it exact, so the first tensor over its tolerance in this order names the
block (or the head, or the embeddings) where the transform and the model part ways.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perm_core.run import trace_names
from perm_core.run.trace_names import TracedName
from perm_core.verify.tolerances import TensorError

_WITHIN_BLOCK = {"attn": 0.1, "cross_attn": 0.2, "hidden": 0.3}


@dataclass(frozen=True)
class Stage:
    """One place in the run: `where` names it for people, `error_over_tolerance` is its worst tensor's margin."""

    where: str
    error_over_tolerance: float
    worst_tensor: str


def _forward_place(parts: TracedName, n_layers: int, first_decoder_layer: int | None) -> tuple[float, str]:
    if parts.kind == "embed" and parts.stack == trace_names.DECODER:
        start = n_layers if first_decoder_layer is None else first_decoder_layer
        return start - 0.5, "decoder embeddings"
    if parts.kind == "embed":
        return -1.0, "embeddings"
    if parts.layer is not None:
        return parts.layer + _WITHIN_BLOCK[parts.kind], f"block {parts.layer}"
    return float(n_layers), "output"


def place(name: str, n_layers: int, parameter_layers: dict[str, int | None] | None = None,
          embedding_parameters: frozenset[str] = frozenset(), first_decoder_layer: int | None = None
          ) -> tuple[float, str]:
    """(order, where) of a traced tensor: `order` sorts a run's tensors as the run computed them.
    parameter_layers: each parameter's block (None outside blocks); embedding_parameters: those read first."""
    parts = trace_names.parse(name)
    if not parts.grad:
        return _forward_place(parts, n_layers, first_decoder_layer)
    if parts.kind == "input":
        return 1.0, "input"
    if parts.kind == "param":
        parameter = parts.field
        if parameter in embedding_parameters:
            return 2.0, "embeddings"
        layer = (parameter_layers or {}).get(parameter)
        if layer is None:
            return -(n_layers + 1.0), "head"
        return -(layer + 0.2), f"block {layer}"
    order, where = _forward_place(parts, n_layers, first_decoder_layer)
    return -order, where


def ordered(errors: list[TensorError], **where) -> list[tuple[float, str, TensorError]]:
    return sorted(((*place(e.name, **where), e) for e in errors), key=lambda item: item[0])


def first_break(errors: list[TensorError], **where) -> str:
    """The first tensor in computation order that fails its tolerance (non-finite included); "" if none."""
    for _, _, error in ordered(errors, **where):
        if not error.passed:
            return error.name
    return ""


def stages(errors: list[TensorError], **where) -> list[Stage]:
    """The worst error over tolerance of each place in the run, in computation order (a NaN counts as inf)."""
    found: dict[str, Stage] = {}
    for _, label, error in ordered(errors, **where):
        margin = error.max_rel_error / error.tolerance if error.finite and error.tolerance > 0 else math.inf
        if math.isnan(margin):
            margin = math.inf
        kept = found.get(label)
        if kept is None or margin > kept.error_over_tolerance:
            found[label] = Stage(label, margin, error.name)
    return list(found.values())
