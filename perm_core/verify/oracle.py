"""The oracle row of every check: the project's original traced run against transformers' own forward.

A check compares the project's scrambled run with the project's original run, so a bug both runs share (a
sliding-window mask off by one, RoBERTa's positions one too low, an attention function that drops a bias) would
pass it. The oracle ties the original run to the stock model: the same weights and input through the model's own
`forward`, with transformers' own attention (SDPA where the model has it, else its eager attention), its own norms,
and its own position ids and masks built from the raw input. Their outputs must agree to round-off.

Tolerance: the dtype's check tolerance (1e-9 in float64, 1e-4 in float32), raised where the stock code's own
arithmetic needs more: it computes some steps in float32 even for a float64 model (RMSNorm, T5's layer norm), and
sums in another order. Then the output's measured float32 round-off (its distance in the same traced run made in
float32, against float64) times compare's ROUNDOFF_SAFETY is allowed, capped at ROUNDOFF_CAP (1e-3), as for the
checks' float32 tensors. A shared bug moves outputs by far more: a position table read one row off, or one token
let through a mask, is O(1e-1) on weights away from init.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from perm_core.engine.spec import Scramble
from perm_core.engine.tokens import model_inputs
from perm_core.run import trace_names
from perm_core.run.stateless import model_lock
from perm_core.verify.tolerances import (
    ROUNDOFF_CAP,
    ROUNDOFF_SAFETY,
    TOLERANCE,
    relative_error,
)


@dataclass
class OracleResult:
    output: str  # the traced output furthest from the stock forward's (every output is compared)
    max_rel_error: float
    tolerance: float
    attention: str  # the stock attention the model ran with

    @property
    def passed(self) -> bool:
        return self.max_rel_error <= self.tolerance


def stock_kwargs(inputs: dict, geometry, dtype: torch.dtype) -> dict:
    """The raw input as a user hands it to the model: no position ids, the 2-D padding mask, pixels in the dtype."""
    kwargs = model_inputs(inputs, geometry, Scramble(), dtype)
    kwargs.pop("position_ids", None)
    if geometry.input_kind != "image":
        ids = kwargs["input_ids"]
        mask = inputs.get("attention_mask")
        kwargs["attention_mask"] = torch.ones_like(ids) if mask is None else mask.reshape(ids.shape)
    return kwargs


@contextlib.contextmanager
def stock_numerics(model):
    """The model as transformers ships it, for the duration: its own attention and norm forwards (the project's
    exact-numerics replacements are instance attributes, set aside and put back). Holds the model's lock, as every
    forward on a shared model does."""
    with model_lock(model):
        replaced = {module: module.__dict__.pop("forward") for module in model.modules()
                    if "forward" in module.__dict__}
        own_attention = model.config._attn_implementation
        attention = "eager"
        try:
            try:
                model.set_attn_implementation("sdpa")
                attention = "sdpa"
            except (ValueError, ImportError):
                model.set_attn_implementation("eager")
            yield attention
        finally:
            for module, forward in replaced.items():
                module.forward = forward
            model.set_attn_implementation(own_attention)


# The traced outputs' names for transformers' output fields (trace.py names the rest after their field)
FIELDS = {trace_names.LAST_HIDDEN: "last_hidden_state", trace_names.POOLER: "pooler_output"}


def _field(name: str) -> str:
    return FIELDS.get(name, trace_names.parse(name).field)


def consult(subject, original: dict) -> OracleResult | None:
    """Every output the original run traced (logits, QA scores, pooled and last hidden states) against the stock
    forward's (judged); None where the run traced no output."""
    names = [n for n in original if trace_names.is_output(n)]
    if not names:
        return None
    kwargs = stock_kwargs(subject.inputs, subject.geometry, subject.dtype)
    with stock_numerics(subject.model) as attention, torch.no_grad():
        out = subject.model(**kwargs)
    stock = {name: getattr(out, _field(name), None) for name in names}
    traced = {name: original[name].tensor for name in names}
    return judged(stock, traced, subject.dtype, attention,
                  lambda dtype, name: subject.trace(dtype=dtype)[name].tensor)


def judged(stock: dict, traced: dict[str, torch.Tensor], dtype: torch.dtype, attention: str, rerun) -> OracleResult:
    """The oracle's verdict, the one rule of the whole-model and the streamed check: each traced output against the
    stock forward's (a missing or misshapen one is an error of +inf), the worst reported with its tolerance: the
    dtype's, or what that output's measured round-off allows (module docstring). rerun(other_dtype, name): the same
    traced output from a run in the other of float32 and float64, asked only when the error needs it."""
    worst_name, worst_error = next(iter(traced)), 0.0
    for name, tensor in traced.items():
        found = stock.get(name)
        if found is None or found.shape != tensor.shape:
            return OracleResult(name, float("inf"), TOLERANCE.get(dtype, ROUNDOFF_CAP), attention)
        error = relative_error(found.detach(), tensor)
        if not error <= worst_error:
            worst_name, worst_error = name, error
    base = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    if worst_error <= base or worst_error == float("inf"):
        return OracleResult(worst_name, worst_error, base, attention)
    other = torch.float32 if dtype == torch.float64 else torch.float64
    again = rerun(other, worst_name)
    mine = traced[worst_name]
    exact, rounded = (mine, again) if other == torch.float32 else (again, mine)
    roundoff = relative_error(exact.to(torch.float64), rounded.to(torch.float64))
    return OracleResult(worst_name, worst_error, min(max(base, ROUNDOFF_SAFETY * roundoff), ROUNDOFF_CAP), attention)
