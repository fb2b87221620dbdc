"""The negative controls: each one's run (an early break first, the full traced run where it shows none), why a
control that does not break is not informative on a checkpoint (explain_unbroken: shown on a copy with its uniform
tensors randomized, never assumed), and the measured break of a symmetry an architecture lacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble, apply_axes, transform_params
from perm_core.run import trace_names
from perm_core.run.capture import output_projection, stopped_input
from perm_core.run.trace import Record
from perm_core.run.vocabulary import cut_to_rows_read
from perm_core.verify.results import ControlResult, VacuousCheckError
from perm_core.verify.subject import Subject, inverse_of_spaces
from perm_core.verify.tolerances import (
    BROKEN_AT,
    largest_magnitude,
    relative_differences,
    tensor_errors,
    worst_rel,
)


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
    """The named tensors of `params` (which may read each one when asked), each given distinct values around its
    own (or around 1 if it is 0): a copy's replacements."""
    generator = torch.Generator().manual_seed(seed)
    found = {}
    for name in names:
        p = params[name].detach()
        level = p.reshape(-1)[0].abs().item() or 1.0
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.device, p.dtype)
        found[name] = p + 0.5 * level * noise
    return found


def explain_unbroken(subject: Subject, control: symmetries.Control, result: ControlResult) -> ControlResult:
    """explained_unbroken on a whole model: the randomized copy is the same model with those tensors replaced."""
    def rerun(replaced: dict[str, torch.Tensor]) -> ControlResult:
        varied = subject.with_params({**subject.params, **replaced})
        return run_control(varied, control, varied.trace())
    return explained_unbroken(control, result, subject.tolerance, subject.params, subject.claims, rerun)


def explained_unbroken(control: symmetries.Control, result: ControlResult, tolerance: float,
                       params: Mapping[str, torch.Tensor], claims: dict, rerun) -> ControlResult:
    """A control that did not break is not informative (and does not fail the report) only when this checkpoint
    cannot tell it from the symmetry, shown, not assumed: its error here is round-off (within `tolerance`), some of
    `params` are uniform, and on a copy with exactly those tensors randomized the same control breaks
    (rerun(replaced): the control's result on the checkpoint with the tensors in `replaced` instead; the whole-model
    and the streamed check each run it their way). Otherwise it stays NOT BROKEN. `params` may read each tensor when
    asked: they are scanned only for a control that needs it."""
    if result.broken or not result.max_rel_error <= tolerance:
        return result  # a broken control, or one broken by more than round-off: nothing to explain
    skipped = control.scramble.skip_tags | {"norm"}  # what a control leaves out is named first
    uniform = sorted(uniform_tensors(params), key=lambda n: claims[n].rule.tag not in skipped)
    if not uniform:
        return result
    elsewhere = rerun(randomized(params, uniform))
    if not elsewhere.broken:
        return result
    example = params[uniform[0]].reshape(-1)[0].item()
    note = (f"not informative on this checkpoint: {len(uniform)} tensor(s) are uniform here ({uniform[0]} is "
            f"{example:g} everywhere), so the control's element is itself a symmetry (error "
            f"{result.max_rel_error:.1e}); with those tensors randomized it breaks by {elsewhere.max_rel_error:.1e}")
    return dataclasses.replace(result, informative=False, note=note)


EARLY_LAYER = 1  # block 0 whole, then block 1's attention and MLP input projection


def _early_break(subject: Subject, control: symmetries.Control) -> tuple[float, str] | None:
    """(relative error, where) of the MLP activation of block EARLY_LAYER, un-scrambled with the intended
    element, against the original's; None for a model with fewer blocks or a non-finite error."""
    g = subject.geometry
    if g.n_layers <= EARLY_LAYER or g.n_experts:  # no dense MLP activation to stop at (capture.output_projection):
        return None  # the full traced run decides
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
    restored = apply_axes(record.tensor, record.axes, inverse_of_spaces(control.scramble, {"early": record}),
                          EARLY_LAYER)
    _, rel, finite = relative_differences({"early": original}, {"early": restored},
                                          {"early": largest_magnitude(original)}).get("early", (0.0, 0.0, False))
    return (rel, f"block {EARLY_LAYER}'s MLP activation") if finite else None


def measure_break(subject: Subject, scramble: Scramble, original: dict[str, Record]) -> float:
    """Worst relative error of the un-scrambled forward run: how far the element changes the function."""
    restored = subject.unscramble(subject.trace(scramble), scramble)
    errors = tensor_errors({n: r for n, r in original.items() if not trace_names.is_grad(n)}, restored,
                           subject.floor_reasons)
    if not errors:
        raise VacuousCheckError("measuring a break compared no tensors")
    return worst_rel(errors)
