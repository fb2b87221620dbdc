"""The report of a streamed check and what every streamed path (one stack, stream.check; an encoder-decoder,
stream.encoder_decoder_check) builds it from: the verdicts of verify.check, with the proof the streamed check
rests on, its memory and its round-off allowances; a control's result; how far an element moves what it acts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from perm_core.engine.spec import Scramble, transform_param
from perm_core.stream.forward import ControlRun
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import MemoryBound
from perm_core.verify.check import ControlResult, Report, most_moved
from perm_core.verify.tolerances import MOVED_AT, relative_error

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
    """verify.check.Subject.element_movement, each weight read when it is asked for, smallest first."""
    moved: dict[str, float] = {}
    if scramble.tokens is not None and movable_tokens > 0:
        index = scramble.tokens.index
        shifted = int((index != torch.arange(len(index))).sum())
        if shifted:
            moved[f"tokens: {shifted} of {movable_tokens} movable moved"] = shifted / movable_tokens
    if not max(moved.values(), default=0.0) >= MOVED_AT:
        for name in sorted(model.names, key=lambda n: model.reader.entries[n].numel):
            before = model.reader.read(name, model.dtype)
            after = transform_param(before, model.claims[name], scramble)
            if after is before:
                continue
            moved[f"weight {name}"] = relative_error(before, after)
            if moved[f"weight {name}"] >= MOVED_AT:
                break
    return most_moved(moved)
