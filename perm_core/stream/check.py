"""The streamed check: every symmetry and negative control of the whole-model check, on a checkpoint read from its
safetensors shards one block at a time.

What the proof rests on: the network is a chain of stages (the embedding, each block, the head). If each stage
maps the element's transform of the original's input at that stage to the transform of the original's output
there (and, backward, the transform of the original's output gradient to that of its input and parameter
gradients), then by induction along the chain the transformed network's run is the transformed original run, so
the whole network is equivariant. Each stage is therefore checked on the original's own activations and
gradients, with the same engine (engine.spec), the stock modules of transformers, and the same verdict rules
(verify.tolerances, verify.check), into the same Report. A stage with a tensor over its dtype's base tolerance gets
that stage's own measured round-off as its allowance, as the whole-model check gets the whole run's (stream.allowance).

Memory: at most three copies of the largest block's weights in the checked dtype (the output head is run in
vocabulary chunks no larger than a quarter block) and two of its largest tensor (a transformed weight's gradient and
its un-scrambled copy, compared and dropped), one block's activations and the embedding rows the input looks up;
a float32 check's float64 rerun for a round-off allowance adds one float64 block (memory.MemoryBound.allowance).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble
from perm_core.engine.tokens import model_inputs
from perm_core.fast.param_cache import tensor_bytes
from perm_core.stream.allowance import Allowances
from perm_core.stream.encoder_decoder_check import TwoStacks
from perm_core.stream.forward import OriginalRun, forward_pass
from perm_core.stream.head import head_stage
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import MemoryBound, StagePeaks
from perm_core.stream.plan import opened, plan_check
from perm_core.stream.report import PROOF, StreamedReport, allowance_notes, explained, floor_reasons
from perm_core.stream.reverse import BlockStage, Element, block_stage, embedding_stage
from perm_core.stream.stages import is_encoder_decoder
from perm_core.verify.check import named_keys

__all__ = ["PROOF", "StreamedReport", "stream_check"]


def stream_check(directory, inputs: dict, symmetry_names=symmetries.SYMMETRIES, key: int | Mapping[str, int] = 0,
                 model_name: str = "", backward: bool = True, include_combined: bool = True,
                 dtype: torch.dtype = torch.float64, progress=None) -> StreamedReport:
    """check() of verify.check, stage by stage from the checkpoint's shards (the module docstring): one driver for
    every layout, its stages run by OneStack or, for an encoder-decoder, encoder_decoder_check.TwoStacks."""
    names, key_of = named_keys(symmetry_names, key)
    kind = TwoStacks if is_encoder_decoder(directory) else OneStack
    model, peaks = opened(kind.model_class, directory, inputs, dtype)
    path = kind(model)
    g = model.geometry
    plan = plan_check(model, directory, inputs, names, key_of, model_name, backward, include_combined)
    report, count = plan.report, plan.count
    largest = path.largest()
    chunks = model.head_chunks(largest // 4)  # the head stage holds five chunk-sized tensors at once
    report.head_chunks = len(chunks)

    run, control_runs = plan.original_run(model, inputs, chunks, path.forward_pass, peaks, progress)
    scrambles = plan.scrambles(g)
    path.refuse(scrambles)
    elements = {name: Element(model, inputs, scramble) for name, scramble in scrambles.items()}
    transforms = tensor_bytes([[(e.scramble, e.inverse, e.layer_kwargs) for e in elements.values()], control_runs])
    floor = floor_reasons(model)
    allowance = Allowances(model, inputs, elements, floor, make_element=Element)
    grad, stash = head_stage(model, run, elements, backward, chunks, allowance)
    peaks.end("head")
    original_inputs = model_inputs(inputs, g, Scramble(), dtype)
    original_kwargs = model.layer_kwargs(original_inputs)
    path.begin(run, elements)
    for layer in reversed(range(model.n_layers)):
        if progress:
            progress(1.0 - (layer + 1) / (model.n_layers + 1), f"checking block {layer}")
        grad = path.block(layer, run, elements, backward, grad, original_kwargs[layer], allowance)
        peaks.end(f"block {layer}")
    path.embedding(run, elements, backward, grad, stash, original_inputs, allowance)
    peaks.end("embedding")

    def explain(control_run, result):
        return explained(model, inputs, control_run, result, chunks, path.forward_pass, floor)
    plan.verdicts(model, elements, allowance, control_runs, run.scales.final(floor, dtype), floor, backward, explain)
    report.notes.extend(allowance_notes(allowance, model, report, *path.note_places))
    peaks.end("comparisons")
    report.memory = path.memory(run, count, largest, peaks, transforms, elements, control_runs)
    if progress:
        progress(1.0, "done")
    return report


class OneStack:
    """A one-stack checkpoint's stages for the driver: its blocks walked back from the head, each handing the
    original's gradient at its input to the one before it, then the embedding."""

    model_class = StreamedModel
    forward_pass = staticmethod(forward_pass)
    note_places = ("every stage", "no stage")

    def __init__(self, model: StreamedModel):
        self.model = model

    def largest(self) -> int:
        return max(self.model.bytes_of(self.model.block_names(layer)) for layer in range(self.model.n_layers))

    def refuse(self, scrambles: dict[str, Scramble]) -> None:
        """Every element streams: a block's stage moves its tokens, heads and channels as the whole model does."""

    def begin(self, run: OriginalRun, elements: dict[str, Element]) -> None:
        """Nothing is summed over several stages: each stage's gradients are complete when it ends."""

    def block(self, layer: int, run: OriginalRun, elements: dict[str, Element], backward: bool,
              grad: torch.Tensor | None, kwargs: dict, allowance: Allowances) -> torch.Tensor | None:
        return block_stage(BlockStage(self.model, layer, run), run, elements, backward, grad, kwargs, allowance)

    def embedding(self, run: OriginalRun, elements: dict[str, Element], backward: bool, grad: torch.Tensor | None,
                  stash: dict, original_inputs: dict, allowance: Allowances) -> None:
        embedding_stage(self.model, run, elements, backward, grad, stash, original_inputs, allowance)

    def memory(self, run: OriginalRun, count: int, largest: int, stages: StagePeaks, transforms: int,
               elements: dict[str, Element], control_runs: list) -> MemoryBound:
        model = self.model
        g, itemsize = model.geometry, model.dtype.itemsize
        # the logits' width (a headless model's outputs: its last hidden state and pooled output)
        vocab = model.reader.entries[model.head_name].shape[0] if model.head_name is not None else 2 * g.d_model
        # one block's activations with their gradients (x4: original and transformed, forward and backward), every
        # block's input kept, and the logits with their gradient; a mixture of experts' at most every expert's per
        # token (each token reaches its top k): its input and output rows, gate|up, activation and product, and its
        # router logit
        experts = g.n_experts * (2 * g.d_model + 4 * g.d_expert + 1)
        per_block = count * (12 * g.d_model + 4 * g.d_mlp + experts + 4 * g.n_heads * count) * 4
        activations = itemsize * (per_block + count * g.d_model * 2 * model.n_layers + count * vocab * 4)
        # the token rows looked up and the other embedding tables whole (an image's: all of them), and an image's
        # pixels with their gradient, the original's and an element's
        rows = model.embedding_bytes(run.looked_up) * 3 + run.pixel_bytes * 4
        tensor = max(model.bytes_of([name]) for layer in range(model.n_layers) for name in model.block_names(layer))
        # a float32 check's float64 rerun (the only one wider than the check): a block, two tensors and activations
        allowance = 2 * (largest + 2 * tensor + per_block * itemsize) if model.dtype == torch.float32 else 0
        # the head's whole parameters: the original's and every element's copy with their gradients (the check), or
        # the original's and every control's (the original run)
        copies = max(2 * (1 + len(elements)), 1 + len(control_runs))
        return MemoryBound(largest, tensor, activations, rows, transforms, model.bytes_of(model.head_whole) * copies,
                           allowance, baseline=stages.baseline, peak=stages.peak,
                           peak_since_start=stages.can_reset, stages=stages.stages, stages_after=stages.after)
