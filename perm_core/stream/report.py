"""The report of a streamed check and what the one driver (stream.check) builds it from: the verdicts of
verify.check, with the proof the streamed check rests on, its memory and its round-off allowances.

Each rule is the whole-model check's own function, given what a streamed check holds: a control's amount
(tolerances.worst_rel) and why an unbroken one is not informative (verify.controls.explained_unbroken, on the
checkpoint's tensors read from the shards), how far an element moves what it acts on (verify.subject.element_movement),
the tensors judged against a floor (verify.subject.key_bias_floors) and the oracle (verify.oracle.judged). Written
here: the notes on where round-off allowances were measured. What a check plans and its verdicts: stream.plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from perm_core.engine.spec import Scramble, transform_param
from perm_core.stream.allowance import Allowances
from perm_core.stream.forward import ControlRun, forward_pass
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import MemoryBound
from perm_core.stream.shards import ReplacedReader
from perm_core.verify.controls import explained_unbroken
from perm_core.verify.oracle import OracleResult
from perm_core.verify.oracle import judged as judged_by_oracle
from perm_core.verify.results import ControlResult, Report
from perm_core.verify.subject import OnDemand, element_movement, key_bias_floors, weights_moved
from perm_core.verify.tolerances import TOLERANCE, judged, worst_rel

PROOF = ("each stage (the embedding, every block, the head) was checked on the original run's own input there, "
         "and backward on the original's gradient at its output, both transformed as the element says: each stage "
         "equivariant on the original's activations makes the whole network equivariant, by induction along the "
         "chain of stages")


@dataclass
class StreamedReport(Report):
    proof: str = PROOF
    memory: MemoryBound | None = None
    head_chunks: int = 1
    notes: list[str] = field(default_factory=list)
    # the stages whose round-off was measured (stream.allowance): where, the tensors over their base tolerance that
    # called for it, and whose rerun it took ("original", and each element's whose tensors were still over)
    allowances: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        streamed = {"proof": self.proof, "head_chunks": self.head_chunks, "notes": self.notes,
                    "allowances": self.allowances,
                    "memory": None if self.memory is None else self.memory.to_json()}
        return {**super().to_json(), "streamed": streamed}


def control_result(r: ControlRun, scales: dict, floor_reasons: dict, dtype: torch.dtype) -> ControlResult:
    """A control's result by the whole-model check's rule (its worst relative error, tolerances.worst_rel); broken
    where the stage it broke at was found (stream.forward.ControlRun.judge)."""
    c = r.control
    amount = worst_rel(judged(r.tally.differences(scales), dtype, floor_reasons))
    if r.broken_at:
        return ControlResult(c.symmetry, c.name, c.description, True, amount,
                             f"{r.broken_at} (on the original's input there; streamed)")
    return ControlResult(c.symmetry, c.name, c.description, False, amount)


def explained(model: StreamedModel, inputs: dict, r: ControlRun, result: ControlResult, chunks: list[tuple[int, int]],
              floor_reasons: dict) -> ControlResult:
    """verify.controls.explained_unbroken, streamed: the checkpoint's tensors scanned from the shards, and the
    control rerun by forward_pass on the same reader with the uniform ones randomized."""
    stored = OnDemand(model.claims, lambda name: model.reader.read(name, model.dtype))
    def rerun(replaced: dict[str, torch.Tensor]) -> ControlResult:
        varied = type(model)(model.reader.directory, model.dtype, ReplacedReader(model.reader, replaced))
        original, [again] = forward_pass(varied, inputs, [r.control], stock=False, head_chunks=chunks)
        return control_result(again, original.scales.final(floor_reasons, model.dtype), floor_reasons, model.dtype)
    tolerance = TOLERANCE.get(model.dtype, TOLERANCE[torch.float32])
    return explained_unbroken(r.control, result, tolerance, stored, model.claims, rerun)


def movement(model: StreamedModel, scramble: Scramble, movable_tokens: int) -> tuple[float, str]:
    """verify.subject.element_movement, each weight read from the shards when it is reached, smallest first."""
    def pairs():
        for name in sorted(model.names, key=lambda n: model.reader.entries[n].numel):
            before = model.reader.read(name, model.dtype)
            after = transform_param(before, model.claims[name], scramble)
            if after is not before:
                yield name, before, after
    return element_movement(scramble, movable_tokens, lambda: weights_moved(pairs()))


def floor_reasons(model: StreamedModel) -> dict[str, str]:
    """verify.subject.key_bias_floors, each parameter's shape read from the shards' headers."""
    return key_bias_floors(model.claims, lambda name: len(model.reader.entries[name].shape), model.geometry)


def allowance_notes(allowance: Allowances, model: StreamedModel, report: StreamedReport) -> list[str]:
    """Where a stage's measured round-off was used, and where a tensor over its base tolerance was at a place whose
    round-off was not measured."""
    other = str(allowance.other).split(".")[-1]
    notes = [f"{u['stage']}: {len(u['over_base_tolerance'])} tensor(s) over the base tolerance, judged with the "
             f"stage's round-off measured by a rerun in {other} ({', '.join(u['measured'])})" for u in allowance.used]
    if not allowance.enabled:
        return notes
    base = TOLERANCE.get(model.dtype, TOLERANCE[torch.float32])
    unmeasured = sorted({e.name for c in report.checks for e in c.tensors
                         if e.finite and not e.max_rel_error <= base and e.name not in allowance.measured})
    if unmeasured:
        notes.append(f"round-off allowances are measured at every stage only: over its dtype's base tolerance at "
                     f"no stage, {', '.join(unmeasured)} fails here (the whole-model check would measure its "
                     "round-off, tolerances.py, before failing)")
    return notes


def oracle(model: StreamedModel, inputs: dict, run, chunks: list[tuple[int, int]]) -> OracleResult:
    """verify.oracle.judged on the streamed outputs (the logits; a headless model's last hidden state and pooled
    output) against the stock forward's that rode along; an output's round-off, where the rule asks for it, is
    forward_pass rerun in the other dtype by a model of the same class on the same reader."""
    def rerun(dtype: torch.dtype, name: str) -> torch.Tensor:
        other = type(model)(model.reader.directory, dtype, model.reader)
        return forward_pass(other, inputs, stock=False, head_chunks=chunks)[0].records[name]

    traced = {name: run.records[name] for name in model.output_axes}
    return judged_by_oracle(run.stock_outputs, traced, model.dtype, model.stock_attention, rerun)
