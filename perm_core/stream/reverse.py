"""The checks of a streamed check: stage by stage from the head back to the embeddings.

At each stage the original's gradient at the stage's output is known (the head's comes from the invariant loss on
the original logits), so one read of the stage's weights serves every element: the original stage runs forward
and backward once, then each element's transformed stage runs on the original's input and output gradient,
transformed as the element says, and its un-scrambled output, attention, input gradient and parameter gradients
are compared with the original's. A stage holds two copies of its weights and a few of its tensors: the original
weights and their gradients while the original runs; then the gradients and one element's transformed weights,
each parameter read again and transformed in turn (the shards are in the page cache by then), and each transformed
parameter's gradient compared as backward makes it and dropped (as verify.check.StreamedGradients does).
"""

from __future__ import annotations

import contextlib

import torch

from perm_core.engine.spec import PIXELS, Scramble, apply_axes, transform_param
from perm_core.engine.tokens import model_inputs
from perm_core.run import trace_names
from perm_core.run.trace import TOKEN_RESID, handing_over_grads, invariant_loss
from perm_core.stream.allowance import Allowances
from perm_core.stream.forward import OriginalRun, attention_axes
from perm_core.stream.layout import StreamedModel
from perm_core.stream.tally import Tally


class Element:
    """One checked element with what its transformed stages are given."""

    def __init__(self, model: StreamedModel, inputs: dict, scramble: Scramble):
        kwargs = model_inputs(inputs, model.geometry, scramble, model.dtype)
        self.scramble, self.inverse = scramble, scramble.inverse()
        self.layer_kwargs, self.kwargs = model.layer_kwargs(kwargs), kwargs
        self.tally = Tally()
        self.patch_size = model.geometry.patch_size  # an image's pixels move patch by patch

    def moved(self, tensor: torch.Tensor, axes, layer: int | None = None) -> torch.Tensor:
        return apply_axes(tensor, axes, self.scramble, layer, self.patch_size)

    def restored(self, tensor: torch.Tensor, axes, layer: int | None = None) -> torch.Tensor:
        return apply_axes(tensor.detach(), axes, self.inverse, layer, self.patch_size)


def as_leaf(tensor: torch.Tensor, grad: bool) -> torch.Tensor:
    """A stage's input cut from what made it: the stage's backward stops at it (and fills its .grad if asked)."""
    return tensor.detach().requires_grad_(grad)


def head_stage(model: StreamedModel, run: OriginalRun, elements: dict[str, Element], backward: bool,
               chunks: list[tuple[int, int]]) -> tuple[torch.Tensor | None, dict]:
    """Compare the logits and the head's gradients chunk by chunk (the head's parameters besides its vocabulary rows,
    BERT's transform, whole: their gradients summed over the chunks, compared at the end). Returns the original's
    gradient at the head's input and, for a head tied to the embedding, its gradient rows at the looked-up tokens
    (original, and each element's un-scrambled), which the embedding stage adds its own to."""
    top = run.records[trace_names.hidden(model.n_layers - 1)]
    axes, primary = model.output_axes, model.primary
    logits = run.records[primary]  # what the invariant loss reads (a headless model's last hidden state)
    claims = model.claims
    stash: dict = {}
    whole = {n: as_leaf(w, backward) for n, w in model.read(model.head_whole).items()}
    moved_whole = {label: {n: as_leaf(transform_param(w, claims[n], element.scramble), backward)
                           for n, w in whole.items()} for label, element in elements.items()}
    if backward:
        leaf = as_leaf(logits, True)
        grad_logits = torch.autograd.grad(invariant_loss(leaf), leaf)[0]
        grad_top = torch.zeros_like(top)
        moved_grad_top = {label: torch.zeros_like(top) for label in elements}
    for start, stop in chunks:
        chunk = model.head_chunk(start, stop)
        tied_rows = [r - start for r in run.looked_up if start <= r < stop] if model.tied else []

        def piece(tensor: torch.Tensor, start=start, stop=stop) -> torch.Tensor:
            """This chunk's vocabulary entries of an output (a headless model's outputs whole)."""
            return tensor[..., start:stop] if model.head_chunked else tensor

        grads = {}
        if backward:
            weights, inputs = {n: as_leaf(w, True) for n, w in chunk.items()}, as_leaf(top, True)
            torch.autograd.backward(model.head(weights, whole, inputs)[primary], piece(grad_logits),
                                    inputs=[*weights.values(), *whole.values(), inputs])
            grad_top += inputs.grad
            for name, weight in weights.items():
                grads[name] = weight.grad
                if name == model.embed_name:
                    grads[name] = _set_aside(weight.grad, tied_rows, stash, "original", start)
                run.scales.add(trace_names.param_grad(name), grads[name])
            del weights
        for label, element in elements.items():
            weights = {n: as_leaf(transform_param(w, claims[n], element.scramble), backward) for n, w in chunk.items()}
            inputs = as_leaf(element.moved(top, TOKEN_RESID), backward)
            outputs = model.head(weights, moved_whole[label], inputs)
            for name, out in outputs.items():
                element.tally.add(name, piece(run.records[name]), element.restored(out, axes[name]))
            if backward:
                torch.autograd.backward(outputs[primary], element.moved(piece(grad_logits), axes[primary]),
                                        inputs=[*weights.values(), *moved_whole[label].values(), inputs])
                moved_grad_top[label] += inputs.grad
                for name, weight in weights.items():
                    moved, weight.grad = weight.grad, None
                    restored = element.restored(moved, claims[name].rule.axes, claims[name].layer)
                    del moved
                    if name == model.embed_name:
                        restored = _set_aside(restored, tied_rows, stash, label, start)
                    element.tally.add(trace_names.param_grad(name), grads[name], restored)
                    del restored
            del weights, outputs
        del chunk, grads
    if not backward:
        return None, stash
    for name, weight in whole.items():
        if weight.grad is None:  # outside what the loss reads (a pooler): the whole-model trace records none
            continue
        run.scales.add(trace_names.param_grad(name), weight.grad)
        for label, element in elements.items():
            moved = moved_whole[label][name].grad  # none where the transformed head left it out of the loss: zeros,
            moved = moved if moved is not None else torch.zeros_like(weight.grad)  # as the embedding stage takes it
            element.tally.add(trace_names.param_grad(name), weight.grad,
                              element.restored(moved, claims[name].rule.axes, claims[name].layer))
    name = trace_names.grad(trace_names.hidden(model.n_layers - 1))
    run.scales.add(name, grad_top)
    for label, element in elements.items():
        element.tally.add(name, grad_top, element.restored(moved_grad_top[label], TOKEN_RESID))
    return grad_top, stash


def _set_aside(grad: torch.Tensor, rows: list[int], stash: dict, owner: str, start: int) -> torch.Tensor:
    """A tied head's gradient rows at looked-up tokens are kept apart (the embedding stage completes them) and
    zeroed here, so that this chunk's comparison and scale see only the rows that are final."""
    if rows:
        index = torch.tensor(rows)
        stash.setdefault(owner, {}).update({start + r: row for r, row in zip(rows, grad[index].clone(), strict=True)})
        grad[index] = 0.0
    return grad


def _block_tensor_names(model: StreamedModel, layer: int) -> tuple[str, str, str]:
    """(its output, its attention, its input's gradient): the embedding's output gradient for block 0, the input's
    for text, where the embedding output is the model's input (an image's input is its pixels)."""
    first = trace_names.grad(trace_names.EMBED) if model.pixels else trace_names.GRAD_INPUT
    in_name = trace_names.grad(trace_names.hidden(layer - 1)) if layer else first
    return trace_names.hidden(layer), trace_names.attn(layer), in_name


def block_stage_tensors(model: StreamedModel, layer: int, backward: bool = True) -> list[str]:
    """Every tensor block `layer`'s stage compares: its output and attention and, backward, its input's gradient and
    its parameters' gradients."""
    out_name, attn_name, in_name = _block_tensor_names(model, layer)
    return [out_name, attn_name, *([in_name] if backward else []),
            *(trace_names.param_grad(n) for n in model.block_names(layer) if backward)]


def handed_over(leaves: dict[str, torch.Tensor], claims, found, restored, backward: bool):
    """run.trace.handing_over_grads for a stage (with `backward`): each parameter's gradient, un-scrambled by
    `restored`, handed to found("grad.param.NAME", ...) as backward fills it."""
    if not backward:
        return contextlib.nullcontext()
    return handing_over_grads(leaves, claims, lambda name, record: found(
        trace_names.param_grad(name), restored(record.tensor, record.axes, record.layer)))


class BlockStage:
    """A one-stack block's stage for block_stage: the tensors it compares (the original's forward ones recorded by
    the original run), the weights it reads and one run of it (an encoder-decoder's: encoder_decoder_check)."""

    def __init__(self, model: StreamedModel, layer: int, run: OriginalRun):
        self.model, self.layer, self.hidden = model, layer, run.block_inputs[layer]
        self.out, self.attn, self.grad_in = _block_tensor_names(model, layer)
        self.records = {self.out: run.records[self.out], self.attn: run.records[self.attn]}
        self.weight_names = model.block_names(layer)

    def tensors(self, backward: bool) -> list[str]:
        return block_stage_tensors(self.model, self.layer, backward)

    def add(self, owner: str | None, parts: dict) -> None:
        """Nothing is summed over several stages: each stage's gradients are complete when it ends."""

    def run(self, on: StreamedModel, weights: dict[str, torch.Tensor], dtype: torch.dtype,
            grad_out: torch.Tensor | None, kwargs: dict, backward: bool, found, element: Element | None) -> dict:
        """One run of the block on `on` (the checked model or its twin in the other dtype) with `weights`, on the
        original's input and output gradient in `dtype`, moved by `element` if one is given: each of its tensors,
        restored to the original's frame, handed to found(name, tensor) as it is made, a parameter's gradient as
        backward makes it (then dropped)."""
        moved, restored = frames(element)
        leaves = {n: as_leaf(w, backward) for n, w in weights.items()}
        weights.clear()  # the leaves are the only copy
        with handed_over(leaves, on.claims, found, restored, backward):
            inputs = as_leaf(moved(cast(self.hidden, dtype), TOKEN_RESID), backward)
            out, attention = on.block(self.layer, leaves, inputs, kwargs)
            found(self.out, restored(out, TOKEN_RESID))
            found(self.attn, restored(attention, attention_axes(self.layer), self.layer))
            if backward:
                torch.autograd.backward(out, moved(cast(grad_out, dtype), TOKEN_RESID),
                                        inputs=[inputs, *leaves.values()])
                found(self.grad_in, restored(inputs.grad, TOKEN_RESID))
        return {}


def frames(element: Element | None):
    """(moved, restored): a stage's inputs into `element`'s frame and its tensors back (None: as they are)."""
    if element is None:
        return (lambda t, axes, layer=None: t), (lambda t, axes, layer=None: t.detach())
    return element.moved, element.restored


def block_stage(stage, run: OriginalRun, elements: dict[str, Element], backward: bool, grad_out: torch.Tensor | None,
                original_kwargs: dict, allowance: Allowances | None = None) -> torch.Tensor | None:
    """Compare a block's `stage` (BlockStage, or an encoder-decoder's) under every element, the same steps for
    every layout: the original block run backward once on the original's input and output gradient (its forward
    tensors are the original run's records), then each element's transformed block on them, moved, its tensors
    un-scrambled and compared; the stage's round-off allowance measured where a tensor needs it (`allowance`); each
    run's parts of sums over several stages handed to stage.add. `original_kwargs`: what the original block is given
    besides its input. Returns the original's gradient at its input."""
    model, layer = stage.model, stage.layer
    original = dict(stage.records)

    def keep(name: str, tensor: torch.Tensor) -> None:
        if trace_names.is_grad(name):  # the forward's are the original run's records already
            original[name] = tensor
            run.scales.add(name, tensor)

    def transformed(element: Element | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The stage's weights moved by `element`'s scramble (None: as stored), in `dtype`."""
        return {n: (w if element is None else transform_param(w, model.claims[n], element.scramble)).to(dtype)
                for n, w in ((n, model.reader.read(n, model.dtype)) for n in stage.weight_names)}

    def run_once(on: StreamedModel, transform: Element | None, dtype: torch.dtype, element: Element | None,
                 kwargs: dict, found) -> dict:
        return stage.run(on, transformed(transform, dtype), dtype, grad_out, kwargs, backward, found, element)

    if backward:
        stage.add(None, run_once(model, None, model.dtype, None, original_kwargs, keep))
    grad_in = original.get(stage.grad_in)
    for label, element in elements.items():
        stage.add(label, run_once(model, element, model.dtype, element, element.layer_kwargs[layer],
                                  lambda name, tensor, tally=element.tally: tally.add(name, original[name], tensor)))
    if allowance is not None:  # the parts of sums a rerun gives are not measured (encoder_decoder_check)
        measure_roundoff(allowance, layer, elements, original, run.scales, stage.tensors(backward), run_once)
    return grad_in


def cast(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """`tensor` in `dtype` (itself where it is in `dtype` already); None stays None."""
    return None if tensor is None else tensor.to(dtype)


def measure_roundoff(allowance: Allowances, layer: int, elements: dict[str, Element], original: dict[str, torch.Tensor],
                     scales, names: list[str], run_once) -> None:
    """Block `layer`'s stage's round-off, measured where a tensor of `names` needs it (stream.allowance), the same
    rule for every streamed path: the original block rerun in the other dtype against its checked tensors
    (`original`, by name; its parameters' gradients dropped before the elements'), and each element's transformed
    block rerun in the other dtype against its own checked run. run_once(on, transform, dtype, element, kwargs,
    found) runs the stage once on model `on`: its weights moved by `transform`'s scramble (None: as stored) and its
    inputs, both in `dtype`, moved and restored by `element` (None: the original's frame), each tensor handed to
    found(name, tensor)."""
    other, checked = allowance.other, allowance.model

    def original_roundoff() -> Tally:
        """The original block rerun in the other dtype (its weights, inputs and output gradient cast)."""
        tally = Tally()
        run_once(allowance.other_model, None, other, None, allowance.original_kwargs[layer],
                 lambda n, t: tally.add(n, original[n], t))
        return tally

    def drop_originals() -> None:  # the element's round-off is measured between its own two runs
        for name in [n for n in original if trace_names.is_param_grad(n)]:
            del original[name]

    def element_roundoff(label: str) -> Tally:
        """The element's transformed block, rerun in the other dtype and un-scrambled, against its checked run."""
        kept, tally = {}, Tally()
        mine, theirs = elements[label], allowance.other_element(label)
        run_once(allowance.other_model, mine, other, theirs, theirs.layer_kwargs[layer], kept.__setitem__)
        run_once(checked, mine, checked.dtype, mine, mine.layer_kwargs[layer],
                 lambda n, t: tally.add(n, kept.pop(n), t))
        return tally

    allowance.measure(f"block {layer}", names, scales, original_roundoff, element_roundoff, drop_originals)


def embedding_stage(model: StreamedModel, run: OriginalRun, elements: dict[str, Element], backward: bool,
                    grad_out: torch.Tensor | None, stash: dict, kwargs: dict) -> None:
    """Compare the embedding output and the gradients of its weights: the token table's looked-up rows (a tied
    head's rows completed) and its other parameters (position embeddings) whole; an image model's pixels' gradient
    too ("grad.input"). `kwargs`: the original's model inputs."""
    weights = model.embedding_weights(run.looked_up)
    originals: dict[str, torch.Tensor] = {}
    if backward:
        leaves = {n: as_leaf(w, True) for n, w in weights.items()}
        kwargs, pixels = _with_pixels(model, kwargs, True)
        torch.autograd.backward(model.embed(leaves, run.looked_up, kwargs), grad_out,
                                inputs=list(leaves.values()) + pixels)
        if pixels:
            originals[trace_names.GRAD_INPUT] = pixels[0].grad
            run.scales.add(trace_names.GRAD_INPUT, pixels[0].grad)
        for name, leaf in leaves.items():
            if leaf.grad is None and name != model.embed_name:  # unused (DINOv2's mask token): the whole-model
                continue  # trace records no gradient for it either
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            originals[name] = with_head_rows(grad, stash.get("original"), run.looked_up) if name == model.embed_name \
                else grad
            run.scales.add(trace_names.param_grad(name), originals[name])
        del leaves
    for label, element in elements.items():
        leaves = {n: as_leaf(transform_param(w, model.claims[n], element.scramble), backward)
                  for n, w in weights.items()}
        kwargs, pixels = _with_pixels(model, element.kwargs, backward)
        out = model.embed(leaves, run.looked_up, kwargs)
        element.tally.add(trace_names.EMBED, run.records[trace_names.EMBED], element.restored(out, TOKEN_RESID))
        if backward:
            torch.autograd.backward(out, element.moved(grad_out, TOKEN_RESID), inputs=list(leaves.values()) + pixels)
            if pixels:
                element.tally.add(trace_names.GRAD_INPUT, originals[trace_names.GRAD_INPUT],
                                  element.restored(pixels[0].grad, PIXELS))
            for name, leaf in leaves.items():
                if name not in originals:
                    continue
                claim = model.claims[name]
                grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                restored = element.restored(grad, claim.rule.axes, claim.layer)
                if name == model.embed_name:
                    restored = with_head_rows(restored, stash.get(label), run.looked_up)
                element.tally.add(trace_names.param_grad(name), originals[name], restored)
        del leaves, out


def _with_pixels(model: StreamedModel, kwargs: dict, grad: bool) -> tuple[dict, list[torch.Tensor]]:
    """An image model's inputs with its pixels as a leaf (their gradient is the model's input gradient), and that
    leaf in a list; text inputs as they are, and an empty list."""
    if not (model.pixels and grad):
        return kwargs, []
    pixels = as_leaf(kwargs["pixel_values"], True)
    return {**kwargs, "pixel_values": pixels}, [pixels]


def with_head_rows(grad_rows: torch.Tensor, head_rows: dict | None, looked_up: list[int]) -> torch.Tensor:
    """The looked-up rows' gradient with a tied head's part added (head_rows: token -> its row's gradient)."""
    if not head_rows:
        return grad_rows
    return grad_rows + torch.stack([head_rows[token] for token in looked_up])
