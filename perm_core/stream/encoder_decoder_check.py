"""An encoder-decoder's stages in the streamed check (TwoStacks): stream.check's one driver runs them, with its proof,
verdicts and report, over stream.encoder_decoder's stages, from the head back to the shared token table.

Backward, the chain of stages is not a single line: every decoder block's cross-attention reads the encoder's normed
output, and every block of a stack reads its stack's relative position table (block 0's). So besides the gradient
at its hidden input, a decoder block's stage gives a gradient at the encoder's output, and every block's stage one
at its stack's table. These are sums over the stages that read them: the decoder is streamed in reverse first,
each stage adding its part (the original's, and each element's un-scrambled), then the encoder's output gradient
(the whole-model trace's grad.blocks.{last encoder block}.hidden) and the decoder's table gradient are complete and
compared, and the encoder is streamed in reverse on that gradient; its table's gradient is compared after its
block 0. Each stage is still checked on the original's own input and output gradient, so the induction of
stream.check holds stage by stage, and a part that one stage gets wrong shows in the sum it is added to.

A block's stage with a tensor over its dtype's base tolerance gets its own measured round-off as its allowance
(stream.allowance, as one stack's blocks do), and so does the head (stream.head, every layout's); the embedding's
and the sums' are not measured, and the report's notes say where that made a tensor fail.
"""

from __future__ import annotations

import torch

from perm_core.engine.spec import Scramble, transform_param
from perm_core.run import trace_names
from perm_core.run.trace import TOKEN_RESID
from perm_core.stream.allowance import Allowances
from perm_core.stream.encoder_decoder import (
    DECODER_RESID,
    EMBEDS,
    EncoderDecoderModel,
    EncoderDecoderRun,
    attention_axes,
    block_tensor_names,
    cross_axes,
    forward_pass,
    hidden_axes,
)
from perm_core.stream.head import as_leaf, cast, frames
from perm_core.stream.memory import MemoryBound, StagePeaks
from perm_core.stream.reverse import Element, block_stage, handed_over, with_head_rows
from perm_core.stream.stages import StreamingUnsupportedError


class Sums:
    """Gradients that several stages add to (a stack's position table, the encoder's output): the original's and
    each element's un-scrambled, compared once complete."""

    def __init__(self, run: EncoderDecoderRun, elements: dict[str, Element]):
        self.run, self.elements = run, elements
        self.parts: dict[str | None, dict[str, torch.Tensor]] = {None: {}, **{label: {} for label in elements}}

    def add(self, owner: str | None, found: dict[str, torch.Tensor]) -> None:
        """Add a stage's parts (owner None: the original's)."""
        mine = self.parts[owner]
        for name, tensor in found.items():
            mine[name] = tensor if name not in mine else mine[name] + tensor

    def compare(self, name: str) -> torch.Tensor | None:
        """The original's complete sum (None before any stage added to it), each element's compared with it."""
        total = self.parts[None].pop(name, None)
        if total is None:
            return None
        self.run.scales.add(name, total)
        for label, element in self.elements.items():
            element.tally.add(name, total, self.parts[label].pop(name))
        return total


def stage_tensors(model: EncoderDecoderModel, layer: int, backward: bool = True) -> list[str]:
    """Every tensor block `layer`'s stage compares itself (stream.reverse.block_stage_tensors): its output, its
    attention and cross-attention and, backward, its input's gradient and its own parameters' gradients (the sums
    it adds to are compared once complete, outside any one stage)."""
    names = block_tensor_names(model, layer)
    forward = [names[k] for k in ("hidden", "attn", "cross") if k in names]
    return forward + ([names["grad_in"], *map(trace_names.param_grad, model.block_names(layer))] if backward else [])


class StackBlock:
    """An encoder-decoder block's stage for stream.reverse.block_stage: besides a one-stack block's (BlockStage), its
    stack's position table read and moved with its weights, a decoder block's encoder output as a second input, and
    each run's parts of the sums (the table's gradient, a decoder block's at the encoder's output) added to `sums`."""

    def __init__(self, model: EncoderDecoderModel, layer: int, run: EncoderDecoderRun, sums: Sums):
        self.names = names = block_tensor_names(model, layer)
        self.model, self.layer, self.sums, self.grad_in = model, layer, sums, names["grad_in"]
        self.stack, self.hidden = model.stack_of(layer)[0], run.block_inputs[layer]
        self.encoder_out = run.encoder_out if self.stack == "decoder" else None
        self.records = {names[k]: run.records[names[k]] for k in ("hidden", "attn", "cross") if k in names}
        self.table = model.table(layer)
        self.weight_names = [*model.block_names(layer), self.table]

    def tensors(self, backward: bool) -> list[str]:
        return stage_tensors(self.model, self.layer, backward)

    def add(self, owner: str | None, parts: dict) -> None:
        self.sums.add(owner, parts)

    def run(self, on: EncoderDecoderModel, weights: dict[str, torch.Tensor], dtype: torch.dtype,
            grad_out: torch.Tensor | None, kwargs: dict, backward: bool, found, element: Element | None) -> dict:
        """stream.reverse.BlockStage.run, with the table among `weights` and a decoder block's encoder output as a
        second input. Returns, backward, its parts of the sums: the table's gradient and a decoder block's gradient
        at the encoder's output."""
        layer, names, axes = self.layer, self.names, hidden_axes(self.stack)
        moved, restored = frames(element)
        table = as_leaf(weights.pop(self.table), backward)
        leaves = {n: as_leaf(w, backward) for n, w in weights.items()}
        weights.clear()  # the leaves are the only copy
        with handed_over(leaves, on.claims, found, restored, backward):
            inputs = as_leaf(moved(cast(self.hidden, dtype), axes), backward)
            encoder = None if self.encoder_out is None else as_leaf(moved(cast(self.encoder_out, dtype), TOKEN_RESID),
                                                                    backward)
            out, attention, cross = on.block(layer, leaves, inputs, kwargs, table, encoder)
            found(names["hidden"], restored(out, axes))
            found(names["attn"], restored(attention, attention_axes(layer, self.stack), layer))
            if cross is not None:
                found(names["cross"], restored(cross, cross_axes(layer), layer))
            if not backward:
                return {}
            extra = [table] + ([encoder] if encoder is not None else [])
            torch.autograd.backward(out, moved(cast(grad_out, dtype), axes), inputs=[inputs, *extra, *leaves.values()])
            found(names["grad_in"], restored(inputs.grad, axes))
            claim = on.claims[self.table]
            parts = {trace_names.param_grad(self.table): restored(table.grad, claim.rule.axes, claim.layer)}
            if encoder is not None:
                parts[trace_names.grad(trace_names.hidden(on.n_encoder - 1))] = restored(encoder.grad, TOKEN_RESID)
            return parts


def embedding_stage(model: EncoderDecoderModel, run: EncoderDecoderRun, elements: dict[str, Element],
                    backward: bool, grads: tuple[torch.Tensor, torch.Tensor] | None, stash: dict,
                    kwargs: dict) -> None:
    """Compare both embedding outputs (the encoder's and the decoder's) and the shared table's gradient at the
    looked-up rows (a tied head's rows completed). `grads`: the original's at the encoder's first block input and
    at the decoder's."""
    name = model.embed_name
    rows = model.embedding_weights(run.looked_up)[name]
    claim = model.claims[name]
    original = None
    if backward:
        leaf = as_leaf(rows, True)
        torch.autograd.backward(list(model.embed({name: leaf}, run.looked_up, kwargs)), list(grads), inputs=[leaf])
        original = with_head_rows(leaf.grad, stash.get("original"), run.looked_up)
        run.scales.add(trace_names.param_grad(name), original)
    for label, element in elements.items():
        leaf = as_leaf(transform_param(rows, claim, element.scramble), backward)
        embeds = model.embed({name: leaf}, run.looked_up, element.kwargs)
        for embed_name, embed, axes in zip(EMBEDS, embeds, (TOKEN_RESID, DECODER_RESID), strict=True):
            element.tally.add(embed_name, run.records[embed_name], element.restored(embed, axes))
        if backward:
            torch.autograd.backward(list(embeds), [element.moved(grads[0], TOKEN_RESID),
                                                   element.moved(grads[1], DECODER_RESID)], inputs=[leaf])
            restored = with_head_rows(element.restored(leaf.grad, claim.rule.axes, claim.layer), stash.get(label),
                                  run.looked_up)
            element.tally.add(trace_names.param_grad(name), original, restored)
        del leaf, embeds


class TwoStacks:
    """An encoder-decoder's stages for stream.check's one driver: the decoder's blocks walked back first, the sums
    several stages add to compared once complete (the decoder's table and the encoder's output gradient where the
    walk leaves the decoder, the encoder's table before the embedding), then the encoder's."""

    model_class = EncoderDecoderModel
    forward_pass = staticmethod(forward_pass)
    note_places = ("the blocks' own tensors and the head", "the embedding or in a sum over blocks")

    def __init__(self, model: EncoderDecoderModel):
        self.model = model
        self.sums: Sums | None = None
        self.decoder_grad: torch.Tensor | None = None

    def largest(self) -> int:
        m = self.model
        return max(m.bytes_of([*m.block_names(layer), m.table(layer)]) for layer in range(m.n_layers))

    def refuse(self, scrambles: dict[str, Scramble]) -> None:
        if any(scramble.tokens is not None for scramble in scrambles.values()):  # the decoder's tokens never move:
            raise StreamingUnsupportedError("streaming an encoder-decoder checks no token permutation")  # no stage

    def begin(self, run: EncoderDecoderRun, elements: dict[str, Element]) -> None:
        self.sums, self.decoder_grad = Sums(run, elements), None

    def block(self, layer: int, run: EncoderDecoderRun, elements: dict[str, Element], backward: bool,
              grad: torch.Tensor | None, kwargs: dict, allowance: Allowances) -> torch.Tensor | None:
        m = self.model
        if layer == m.n_encoder - 1:  # the decoder is done: its sums are complete
            self.sums.compare(trace_names.param_grad(m.tables["decoder"]))
            grad = self.sums.compare(trace_names.grad(trace_names.hidden(layer)))
        grad = block_stage(StackBlock(m, layer, run, self.sums), run, elements, backward, grad, kwargs, allowance)
        if layer == m.n_encoder:  # the decoder's first block: its input gradient is the decoder embedding's
            self.decoder_grad, grad = grad, None
        return grad

    def embedding(self, run: EncoderDecoderRun, elements: dict[str, Element], backward: bool,
                  grad: torch.Tensor | None, stash: dict, original_inputs: dict, allowance: Allowances) -> None:
        """The two stacks' embedding, its round-off not measured (allowance_notes says where that fails)."""
        self.sums.compare(trace_names.param_grad(self.model.tables["encoder"]))
        embedding_stage(self.model, run, elements, backward, (grad, self.decoder_grad) if backward else None, stash,
                        original_inputs)

    def memory(self, run: EncoderDecoderRun, count: int, largest: int, stages: StagePeaks, transforms: int,
               elements: dict[str, Element], control_runs: list) -> MemoryBound:
        """stream.check's bound, for two stacks: a block's activations counted over both stacks' tokens (a decoder
        block's cross-attention reads every encoder token), every block's input and the encoder's output kept, the
        encoder output's gradient summed for the original and each element, and the logits with their gradient."""
        model = self.model
        g, itemsize = model.geometry, model.dtype.itemsize
        decoder_tokens = run.records[trace_names.DECODER_EMBED].shape[1]
        tokens = count + decoder_tokens
        vocab = model.reader.entries[model.head_name].shape[0]
        per_block = tokens * (12 * g.d_model + 4 * g.d_mlp + 4 * g.n_heads * tokens) * 4
        kept = tokens * g.d_model * 2 * model.n_layers + count * g.d_model * (2 + len(elements))
        activations = itemsize * (per_block + kept + decoder_tokens * vocab * 4)
        rows = model.embedding_bytes(run.looked_up) * 3
        tensor = max(model.bytes_of([name]) for layer in range(model.n_layers)
                     for name in [*model.block_names(layer), model.table(layer)])
        # a float32 check's float64 rerun (the only one wider than the check): a block, two tensors, activations
        allowance = 2 * (largest + 2 * tensor + per_block * itemsize) if model.dtype == torch.float32 else 0
        return MemoryBound(largest, tensor, activations, rows, transforms, 0, allowance,
                           baseline=stages.baseline, peak=stages.peak, peak_since_start=stages.can_reset,
                           stages=stages.stages, stages_after=stages.after)
