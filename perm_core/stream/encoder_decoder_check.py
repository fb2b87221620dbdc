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

The whole-model check measures a symmetry the architecture lacks (T5's tokens: its relative position bias reads
sequence order) by the break of its element; streamed, the transformed model runs stage by stage on its own
activations, and its forward records are compared with the original run's (encoder_decoder.measure_break).

A block's stage with a tensor over its dtype's base tolerance gets its own measured round-off as its allowance
(stream.allowance, as one stack's blocks do); the embedding's, the head's and the sums' are not measured, and the
report's notes say where that made a tensor fail.
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
    measure_break,
)
from perm_core.stream.memory import MemoryBound, StagePeaks
from perm_core.stream.reverse import (
    Element,
    as_leaf,
    cast,
    gradient_hook,
    measure_roundoff,
    with_head_rows,
)
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


def _run_stage(model: EncoderDecoderModel, layer: int, weights: dict[str, torch.Tensor], table: torch.Tensor,
               hidden: torch.Tensor, encoder_out: torch.Tensor | None, grad_out: torch.Tensor | None, kwargs: dict,
               backward: bool, found, element: Element | None = None) -> dict[str, torch.Tensor]:
    """One run of block `layer` with `weights` and its stack's position `table` on `hidden` (and a decoder block's
    `encoder_out`), moved by `element` if one is given (stream.reverse._run_block, with two more inputs): its
    tensors, restored to the original's frame, handed to found(name, tensor) as they are made. Returns, backward,
    its parts of the sums: the table's gradient and a decoder block's gradient at the encoder's output."""
    stack, _ = model.stack_of(layer)
    names = block_tensor_names(model, layer)
    axes = hidden_axes(stack)
    moved = element.moved if element is not None else lambda t, axes, layer=None: t
    restored = element.restored if element is not None else lambda t, axes, layer=None: t.detach()
    leaves = {n: as_leaf(w, backward) for n, w in weights.items()}
    weights.clear()  # the leaves are the only copy
    table = as_leaf(table, backward)
    handles = [w.register_post_accumulate_grad_hook(gradient_hook(found, n, model.claims[n], restored))
               for n, w in leaves.items()] if backward else []
    try:
        inputs = as_leaf(moved(hidden, axes), backward)
        encoder = None if encoder_out is None else as_leaf(moved(encoder_out, TOKEN_RESID), backward)
        out, attention, cross = model.block(layer, leaves, inputs, kwargs, table, encoder)
        found(names["hidden"], restored(out, axes))
        found(names["attn"], restored(attention, attention_axes(layer, stack), layer))
        if cross is not None:
            found(names["cross"], restored(cross, cross_axes(layer), layer))
        if not backward:
            return {}
        extra = [table] + ([encoder] if encoder is not None else [])
        torch.autograd.backward(out, moved(grad_out, axes), inputs=[inputs, *extra, *leaves.values()])
        found(names["grad_in"], restored(inputs.grad, axes))
        claim = model.claims[model.table(layer)]
        parts = {trace_names.param_grad(model.table(layer)): restored(table.grad, claim.rule.axes, claim.layer)}
        if encoder is not None:
            parts[trace_names.grad(trace_names.hidden(model.n_encoder - 1))] = restored(encoder.grad, TOKEN_RESID)
        return parts
    finally:
        for handle in handles:
            handle.remove()


def stage_tensors(model: EncoderDecoderModel, layer: int, backward: bool = True) -> list[str]:
    """Every tensor block `layer`'s stage compares itself (stream.reverse.block_stage_tensors): its output, its
    attention and cross-attention and, backward, its input's gradient and its own parameters' gradients (the sums
    it adds to are compared once complete, outside any one stage)."""
    names = block_tensor_names(model, layer)
    forward = [names[k] for k in ("hidden", "attn", "cross") if k in names]
    return forward + ([names["grad_in"], *map(trace_names.param_grad, model.block_names(layer))] if backward else [])


def block_stage(model: EncoderDecoderModel, layer: int, run: EncoderDecoderRun, elements: dict[str, Element],
                backward: bool, grad_out: torch.Tensor | None, original_kwargs: dict, sums: Sums,
                allowance: Allowances | None = None) -> torch.Tensor | None:
    """Compare block `layer` under every element, with the stage's round-off allowance measured where a tensor
    needs it (`allowance`, as stream.reverse.block_stage does); its parts of the sums added to `sums`. Returns the
    original's gradient at its hidden input."""
    stack, _ = model.stack_of(layer)
    names = model.block_names(layer)
    table_name = model.table(layer)
    tensor_names = block_tensor_names(model, layer)
    hidden = run.block_inputs[layer]
    encoder_out = run.encoder_out if stack == "decoder" else None
    original = {tensor_names[k]: run.records[tensor_names[k]] for k in ("hidden", "attn", "cross")
                if k in tensor_names}

    def keep(name: str, tensor: torch.Tensor) -> None:
        if trace_names.is_grad(name):  # the forward's are the original run's records already
            original[name] = tensor
            run.scales.add(name, tensor)

    if backward:
        weights, table = model.stage_weights(layer)
        sums.add(None, _run_stage(model, layer, weights, table, hidden, encoder_out, grad_out, original_kwargs,
                                  True, keep))
    grad_in = original.get(tensor_names["grad_in"])
    claims = model.claims

    def transformed(element: Element | None, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The block's weights and its stack's table moved by `element`'s scramble (None: as stored), in `dtype`."""
        def one(n: str) -> torch.Tensor:
            stored = model.reader.read(n, model.dtype)
            return (stored if element is None else transform_param(stored, claims[n], element.scramble)).to(dtype)
        return {n: one(n) for n in names}, one(table_name)

    for label, element in elements.items():
        sums.add(label, _run_stage(model, layer, *transformed(element, model.dtype), hidden, encoder_out, grad_out,
                                   element.layer_kwargs[layer], backward,
                                   lambda name, tensor, tally=element.tally: tally.add(name, original[name], tensor),
                                   element))
    if allowance is None:
        return grad_in

    def run_once(on: EncoderDecoderModel, transform: Element | None, dtype: torch.dtype, element: Element | None,
                 kwargs: dict, found) -> None:  # its parts of the sums are not measured (the module docstring)
        _run_stage(on, layer, *transformed(transform, dtype), cast(hidden, dtype), cast(encoder_out, dtype),
                   cast(grad_out, dtype), kwargs, backward, found, element)

    measure_roundoff(allowance, layer, elements, original, run.scales, stage_tensors(model, layer, backward), run_once)
    return grad_in


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
    walk leaves the decoder, the encoder's table before the embedding), then the encoder's; a symmetry the
    architecture lacks measured by its element's break (measure_break)."""

    model_class = EncoderDecoderModel
    measures_lacking = True
    stage_tensors = staticmethod(stage_tensors)
    forward_pass = staticmethod(forward_pass)
    note_places = ("the blocks' own tensors", "the embedding, the head or in a sum over blocks")

    def __init__(self, model: EncoderDecoderModel):
        self.model = model
        self.sums: Sums | None = None
        self.decoder_grad: torch.Tensor | None = None

    def largest(self) -> int:
        m = self.model
        return max(m.bytes_of([*m.block_names(layer), m.table(layer)]) for layer in range(m.n_layers))

    def measure_break(self, inputs: dict, scramble: Scramble, run: EncoderDecoderRun) -> float:
        return measure_break(self.model, inputs, scramble, run)

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
        grad = block_stage(m, layer, run, elements, backward, grad, kwargs, self.sums, allowance)
        if layer == m.n_encoder:  # the decoder's first block: its input gradient is the decoder embedding's
            self.decoder_grad, grad = grad, None
        return grad

    def embedding(self, run: EncoderDecoderRun, elements: dict[str, Element], backward: bool,
                  grad: torch.Tensor | None, stash: dict, original_inputs: dict) -> None:
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
