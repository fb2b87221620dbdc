"""The report of a streamed check and what every streamed path (one stack, stream.check; an encoder-decoder,
stream.encoder_decoder_check) builds it from: the verdicts of verify.check, with the proof the streamed check
rests on, its memory and its round-off allowances; a control's result; how far an element moves what it acts on.

The rules both paths share are written here once: the notes on round-off allowances, the tensors judged against a
floor (floor_reasons) and the oracle, each told what differs (the path's forward pass, the tensors a block's stage
compares, where its round-off is not measured). What a check plans and its verdicts: stream.plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from perm_core.engine.spec import Scramble, transform_param
from perm_core.run import trace_names
from perm_core.stream.allowance import Allowances
from perm_core.stream.forward import ControlRun
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import MemoryBound
from perm_core.verify.oracle import OracleResult
from perm_core.verify.oracle import judged as judged_by_oracle
from perm_core.verify.results import ControlResult, Report
from perm_core.verify.subject import KEY_BIAS_REASON, element_movement, weights_moved
from perm_core.verify.tolerances import TOLERANCE

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


def control_result(r: ControlRun, scales: dict, floor_reasons: dict) -> ControlResult:
    c = r.control
    amount = r.tally.worst_relative(scales, floor_reasons)
    if r.broken_at:
        return ControlResult(c.symmetry, c.name, c.description, True, amount,
                             f"{r.broken_at} (on the original's input there; streamed)")
    return ControlResult(c.symmetry, c.name, c.description, False, amount,
                         note="streamed: an unbroken control is not tested for being uninformative here")


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
    """The gradients judged against a floor, and why (verify.subject.KEY_BIAS_REASON): a key bias's, zero in exact
    arithmetic where no rotary embedding turns the keys, so only round-off is left to compare."""
    return {trace_names.param_grad(n): KEY_BIAS_REASON for n, c in model.claims.items()
            if c.rule.tag == "attn.k" and len(model.reader.entries[n].shape) == 1 and not model.geometry.rope}


def allowance_notes(allowance: Allowances, model: StreamedModel, report: StreamedReport,
                    stage_tensors: Callable[[StreamedModel, int], list[str]], measured_at: str, not_at: str
                    ) -> list[str]:
    """Where a block's measured round-off was used, and where a tensor over its base tolerance was at a place whose
    round-off is not measured. stage_tensors(model, layer): the tensors block `layer`'s stage compares itself;
    `measured_at`, `not_at`: the path's words for where round-off is measured and where it is not."""
    other = str(allowance.other).split(".")[-1]
    notes = [f"{u['stage']}: {len(u['over_base_tolerance'])} tensor(s) over the base tolerance, judged with the "
             f"stage's round-off measured by a rerun in {other} ({', '.join(u['measured'])})" for u in allowance.used]
    if not allowance.enabled:
        return notes
    measured = {n for u in allowance.used for n in stage_tensors(model, int(u["stage"].split()[1]))}
    base = TOLERANCE.get(model.dtype, TOLERANCE[torch.float32])
    unmeasured = sorted({e.name for c in report.checks for e in c.tensors
                         if e.finite and not e.max_rel_error <= base and e.name not in measured})
    if unmeasured:
        notes.append(f"round-off allowances are measured at {measured_at} only: over its dtype's base tolerance at "
                     f"{not_at}, {', '.join(unmeasured)} fails here (the whole-model check would measure its "
                     "round-off, tolerances.py, before failing)")
    return notes


def oracle(model: StreamedModel, inputs: dict, run, chunks: list[tuple[int, int]], forward_pass) -> OracleResult:
    """verify.oracle.judged on the streamed outputs (the logits; a headless model's last hidden state and pooled
    output) against the stock forward's that rode along; an output's round-off, where the rule asks for it, is the
    path's `forward_pass` rerun in the other dtype by a model of the same class on the same reader."""
    def rerun(dtype: torch.dtype, name: str) -> torch.Tensor:
        other = type(model)(model.reader.directory, dtype, model.reader)
        return forward_pass(other, inputs, stock=False, head_chunks=chunks)[0].records[name]

    traced = {name: run.records[name] for name in model.output_axes}
    return judged_by_oracle(run.stock_outputs, traced, model.dtype, model.stock_attention, rerun)
