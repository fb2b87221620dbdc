"""The streamed check: every symmetry and negative control of the whole-model check, on a checkpoint read from its
safetensors shards one block at a time.

What the proof rests on: the network is a chain of stages (the embedding, each block, the head; an encoder-decoder's
two stacks of blocks). If each stage maps the element's transform of the original's input at that stage to the
transform of the original's output there (and, backward, the transform of the original's output gradient to that of
its input and parameter gradients), then by induction along the chain the transformed network's run is the
transformed original run, so the whole network is equivariant. Each stage is therefore checked on the original's own
activations and gradients, with the same engine (engine.spec), the stock modules of transformers, and the same
verdict rules (verify.tolerances, verify.check), into the same Report. A stage with a tensor over its dtype's base
tolerance gets that stage's own measured round-off as its allowance, as the whole-model check gets the whole run's
(stream.allowance); so does a sum over blocks (stream.reverse.Sums).

One driver for every layout: the model (stream.layout's one stack, stream.encoder_decoder's two) says where its
stacks start (stack_starts) and which block's output the later blocks also read (encoder_layer); the driver walks
the blocks back from the head, a stack's first block handing its input gradient to its embedding output.

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
from perm_core.run import trace_names
from perm_core.stream.allowance import Allowances
from perm_core.stream.encoder_decoder import streamed_model
from perm_core.stream.forward import OriginalRun
from perm_core.stream.head import head_stage
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import MemoryBound, StagePeaks
from perm_core.stream.plan import opened, plan_check
from perm_core.stream.report import PROOF, StreamedReport, allowance_notes, explained, floor_reasons
from perm_core.stream.reverse import BlockStage, Element, Sums, block_stage, embedding_stage
from perm_core.stream.stages import StreamingUnsupportedError
from perm_core.verify.check import named_keys

__all__ = ["PROOF", "StreamedReport", "stream_check"]


def stream_check(directory, inputs: dict, symmetry_names=symmetries.SYMMETRIES, key: int | Mapping[str, int] = 0,
                 model_name: str = "", backward: bool = True, include_combined: bool = True,
                 dtype: torch.dtype = torch.float64, progress=None) -> StreamedReport:
    """check() of verify.check, stage by stage from the checkpoint's shards (the module docstring)."""
    names, key_of = named_keys(symmetry_names, key)
    model, peaks = opened(streamed_model, directory, inputs, dtype)
    g = model.geometry
    plan = plan_check(model, directory, inputs, names, key_of, model_name, backward, include_combined)
    report, count = plan.report, plan.count
    largest = max(model.bytes_of(model.stage_names(layer)) for layer in range(model.n_layers))
    chunks = model.head_chunks(largest // 4)  # the head stage holds five chunk-sized tensors at once
    report.head_chunks = len(chunks)

    run, control_runs = plan.original_run(model, inputs, chunks, peaks, progress)
    scrambles = plan.scrambles(g)
    if not model.tokens_move and any(s.tokens is not None for s in scrambles.values()):  # no stage moves them
        raise StreamingUnsupportedError("streaming an encoder-decoder checks no token permutation")
    elements = {name: Element(model, inputs, scramble) for name, scramble in scrambles.items()}
    transforms = tensor_bytes([[(e.scramble, e.inverse, e.layer_kwargs) for e in elements.values()], control_runs])
    floor = floor_reasons(model)
    allowance = Allowances(model, inputs, elements, floor, make_element=Element)
    grad, stash = head_stage(model, run, elements, backward, chunks, allowance)
    peaks.end("head")
    original_inputs = model_inputs(inputs, g, Scramble(), dtype)
    original_kwargs = model.layer_kwargs(original_inputs)
    sums, grads = Sums(run, elements, allowance), {}  # grads: the original's at each embedding output
    for layer in reversed(range(model.n_layers)):
        if progress:
            progress(1.0 - (layer + 1) / (model.n_layers + 1), f"checking block {layer}")
        if layer == model.encoder_layer:  # every block that reads the encoder's output is done: its gradient is whole
            grad = sums.compare(trace_names.grad(trace_names.hidden(layer)))
        stage = BlockStage(model, layer, run, sums)
        grad = block_stage(stage, run, elements, backward, grad, original_kwargs[layer], allowance)
        peaks.end(f"block {layer}")
        start = model.stack_starts.get(layer)
        if start is not None:  # a stack's first block: its input gradient is its embedding output's, its sums whole
            for name in model.summed(layer):
                sums.compare(trace_names.param_grad(name))
            grads[start], grad = grad, None
    embedding_stage(model, run, elements, backward, grads if backward else None, stash, original_inputs, allowance)
    peaks.end("embedding")

    def explain(control_run, result):
        return explained(model, inputs, control_run, result, chunks, floor)
    plan.verdicts(model, elements, allowance, control_runs, run.scales.final(floor, dtype), floor, backward, explain)
    report.notes.extend(allowance_notes(allowance, model, report))
    peaks.end("comparisons")
    report.memory = memory(model, run, count, largest, peaks, transforms, elements, control_runs)
    if progress:
        progress(1.0, "done")
    return report


def memory(model: StreamedModel, run: OriginalRun, count: int, largest: int, stages: StagePeaks, transforms: int,
           elements: dict[str, Element], control_runs: list) -> MemoryBound:
    """What the check may hold at once (memory.MemoryBound) and what it held. An encoder-decoder's block activations
    count both stacks' tokens (a decoder block's cross-attention reads every encoder token); it also keeps the
    encoder's output, that output's gradient summed for the original and each element, and each block's gradient
    at its output (a sum's round-off reruns the blocks that add to it)."""
    g, itemsize = model.geometry, model.dtype.itemsize
    later = sum(run.records[name].shape[1] for name in model.embedding_axes if name != trace_names.EMBED)
    tokens, head_tokens = count + later, later or count  # every stack's; the last stack's, which the head reads
    # the logits' width (a headless model's outputs: its last hidden state and pooled output)
    vocab = model.reader.entries[model.head_name].shape[0] if model.head_name is not None else 2 * g.d_model
    # one block's activations with their gradients (x4: original and transformed, forward and backward), every
    # block's input kept, and the logits with their gradient; a mixture of experts' at most every expert's per
    # token (each token reaches its top k): its input and output rows, gate|up, activation and product, and its
    # router logit
    experts = g.n_experts * (2 * g.d_model + 4 * g.d_expert + 1)
    per_block = tokens * (12 * g.d_model + 4 * g.d_mlp + experts + 4 * g.n_heads * tokens) * 4
    kept = tokens * g.d_model * 2 * model.n_layers
    if model.encoder_layer is not None:
        kept += count * g.d_model * (2 + len(elements)) + tokens * g.d_model * model.n_layers
    activations = itemsize * (per_block + kept + head_tokens * vocab * 4)
    # the token rows looked up and the other embedding tables whole (an image's: all of them), and an image's
    # pixels with their gradient, the original's and an element's
    rows = model.embedding_bytes(run.looked_up) * 3 + run.pixel_bytes * 4
    tensor = max(model.bytes_of([name]) for layer in range(model.n_layers) for name in model.stage_names(layer))
    # a float32 check's float64 rerun (the only one wider than the check): a block, two tensors and activations
    allowance = 2 * (largest + 2 * tensor + per_block * itemsize) if model.dtype == torch.float32 else 0
    # the head's whole parameters: the original's and every element's copy with their gradients (the check), or
    # the original's and every control's (the original run)
    copies = max(2 * (1 + len(elements)), 1 + len(control_runs))
    return MemoryBound(largest, tensor, activations, rows, transforms, model.bytes_of(model.head_whole) * copies,
                       allowance, baseline=stages.baseline, peak=stages.peak,
                       peak_since_start=stages.can_reset, stages=stages.stages, stages_after=stages.after)
