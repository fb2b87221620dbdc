"""The checks of a streamed check's blocks and embedding, for every layout, walked back from the head (stream.head).

At each stage the original's gradient at the stage's output is known (the head's comes from the invariant loss on
the original logits), so one read of the stage's weights serves every element: the original stage runs forward
and backward once, then each element's transformed stage runs on the original's input and output gradient,
transformed as the element says, and its un-scrambled output, attention, input gradient and parameter gradients
are compared with the original's. A stage holds two copies of its weights and a few of its tensors: the original
weights and their gradients while the original runs; then the gradients and one element's transformed weights,
each parameter read again and transformed in turn (the shards are in the page cache by then), and each transformed
parameter's gradient compared as backward makes it and dropped (as verify.check.StreamedGradients does).

An encoder-decoder's chain of stages is not a single line backward: every decoder block's cross-attention reads the
encoder's output, and every block of a stack its stack's relative position table (block 0's). So a decoder block's
stage also gives a gradient at the encoder's output, and every block's one at its table: sums over the stages that
read them (Sums), each stage adding its part (the original's, and each element's un-scrambled), compared once
complete (stream.check: the encoder's output gradient where the walk leaves the decoder, then the encoder is walked
on it). Each stage is still checked on the original's own input and output gradient, so the induction of
stream.check holds stage by stage, and a part that one stage gets wrong shows in the sum it is added to.
"""

from __future__ import annotations

import contextlib

import torch

from perm_core.engine.spec import PIXELS, Scramble, apply_axes, transform_param
from perm_core.engine.tokens import model_inputs
from perm_core.run import trace_names
from perm_core.run.trace import TOKEN_RESID, handing_over_grads
from perm_core.stream.allowance import Allowances
from perm_core.stream.forward import OriginalRun
from perm_core.stream.head import as_leaf, cast, frames
from perm_core.stream.layout import StreamedModel
from perm_core.stream.tally import Tally
from perm_core.verify import experts


class Element:
    """One checked element with what its transformed stages are given."""

    def __init__(self, model: StreamedModel, inputs: dict, scramble: Scramble):
        kwargs = model_inputs(inputs, model.geometry, scramble, model.dtype)
        self.scramble, self.inverse = scramble, scramble.inverse()
        self.layer_kwargs, self.kwargs = model.layer_kwargs(kwargs), kwargs
        self.tally = Tally(experts.expert_tensors(model))  # a mixture of experts' errors per expert too
        self.patch_size = model.geometry.patch_size  # an image's pixels move patch by patch

    def moved(self, tensor: torch.Tensor, axes, layer: int | None = None) -> torch.Tensor:
        return apply_axes(tensor, axes, self.scramble, layer, self.patch_size)

    def restored(self, tensor: torch.Tensor, axes, layer: int | None = None) -> torch.Tensor:
        return apply_axes(tensor.detach(), axes, self.inverse, layer, self.patch_size)


def handed_over(leaves: dict[str, torch.Tensor], claims, found, restored, backward: bool):
    """run.trace.handing_over_grads for a stage (with `backward`): each parameter's gradient, un-scrambled by
    `restored`, handed to found("grad.param.NAME", ...) as backward fills it."""
    if not backward:
        return contextlib.nullcontext()
    return handing_over_grads(leaves, claims, lambda name, record: found(
        trace_names.param_grad(name), restored(record.tensor, record.axes, record.layer)))


class Sums:
    """Gradients that several block stages add to (an encoder-decoder's: a stack's position table, the encoder's
    output): the original's and each element's un-scrambled, compared once complete."""

    def __init__(self, run: OriginalRun, elements: dict[str, Element], allowance: Allowances | None = None):
        self.run, self.elements, self.allowance = run, elements, allowance
        self.parts: dict[str | None, dict[str, torch.Tensor]] = {None: {}, **{label: {} for label in elements}}
        self.reruns: list[tuple[int, object]] = []  # (block, its stage's run_once) of every stage that added parts

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
        theirs = {label: self.parts[label].pop(name) for label in self.elements}
        for label, element in self.elements.items():
            element.tally.add(name, total, theirs[label])
        if self.allowance is not None:
            self._measure(name, total, theirs)
        return total

    def _measure(self, name: str, total: torch.Tensor, theirs: dict[str, torch.Tensor]) -> None:
        """The sum's round-off, where it needs one (stream.allowance): every stage that added to it rerun in the
        other dtype, the original's and each element's own, their parts summed in the same order and compared with
        the checked sums (`total`, the original's; `theirs`, each element's)."""
        a = self.allowance

        def summed(on, transform, dtype, element, kwargs) -> torch.Tensor:
            parts = [rerun(on, transform, dtype, element, kwargs(layer), lambda n, t: None).get(name)
                     for layer, rerun in self.reruns]
            parts = [p for p in parts if p is not None]
            return sum(parts[1:], parts[0])

        def original() -> Tally:
            tally = Tally()
            tally.add(name, total, summed(a.other_model, None, a.other, None, a.original_kwargs.__getitem__))
            return tally

        def element(label: str) -> Tally:
            tally, other = Tally(), a.other_element(label)
            tally.add(name, summed(a.other_model, self.elements[label], a.other, other,
                                   lambda layer: other.layer_kwargs[layer]), theirs[label])
            return tally

        a.measure(f"the sum {name}", [name], self.run.scales, original, element)


class BlockStage:
    """A block's stage for block_stage: the tensors it compares (the original's forward ones recorded by the original
    run), the weights it reads and one run of it. Besides its hidden input, an encoder-decoder's block reads its
    stack's position table and a decoder block the encoder's output; their gradients are its parts of sums over
    blocks (Sums)."""

    def __init__(self, model: StreamedModel, layer: int, run: OriginalRun, sums: Sums | None = None):
        self.model, self.layer, self.hidden, self.sums = model, layer, run.block_inputs[layer], sums
        self.axes, self.outputs = model.hidden_axes(layer), model.block_axes(layer)
        self.out, self.grad_in = trace_names.hidden(layer), model.grad_in(layer)
        reads_encoder = model.encoder_layer is not None and layer > model.encoder_layer  # a decoder block
        self.encoder_out = run.encoder_out if reads_encoder else None
        self.records = {name: run.records[name] for name in self.outputs}
        self.summed, self.weight_names = model.summed(layer), model.stage_names(layer)

    def add(self, owner: str | None, parts: dict) -> None:
        """A run's parts of sums over blocks (owner None: the original's), added to `sums`."""
        if parts:
            self.sums.add(owner, parts)

    def tensors(self, backward: bool) -> list[str]:
        """Every tensor it compares itself: its forward ones and, backward, its input's gradient and its own
        parameters' gradients (the sums it adds to are compared once complete, outside any one stage)."""
        grads = [self.grad_in, *map(trace_names.param_grad, self.model.block_names(self.layer))] if backward else []
        return [*self.outputs, *grads]

    def run(self, on: StreamedModel, weights: dict[str, torch.Tensor], dtype: torch.dtype,
            grad_out: torch.Tensor | None, kwargs: dict, backward: bool, found, element: Element | None) -> dict:
        """One run of the block on `on` (the checked model or its twin in the other dtype) with `weights`, on the
        original's input and output gradient in `dtype`, moved by `element` if one is given: each of its tensors,
        restored to the original's frame, handed to found(name, tensor) as it is made, a parameter's gradient as
        backward makes it (then dropped). Returns, backward, its parts of sums over blocks."""
        moved, restored = frames(element)
        summed = {n: as_leaf(weights.pop(n), backward) for n in self.summed}
        leaves = {n: as_leaf(w, backward) for n, w in weights.items()}
        weights.clear()  # the leaves are the only copy
        with handed_over(leaves, on.claims, found, restored, backward):
            inputs = as_leaf(moved(cast(self.hidden, dtype), self.axes), backward)
            encoder = None if self.encoder_out is None else as_leaf(moved(cast(self.encoder_out, dtype), TOKEN_RESID),
                                                                    backward)
            outputs = on.block(self.layer, {**leaves, **summed}, inputs, kwargs, encoder)
            for name, axes in self.outputs.items():
                found(name, restored(outputs[name], axes, self.layer))
            if not backward:
                return {}
            extra = [*summed.values(), *([encoder] if encoder is not None else [])]
            torch.autograd.backward(outputs[self.out], moved(cast(grad_out, dtype), self.axes),
                                    inputs=[inputs, *extra, *leaves.values()])
            found(self.grad_in, restored(inputs.grad, self.axes))
            claims = on.claims
            parts = {trace_names.param_grad(n): restored(t.grad, claims[n].rule.axes, claims[n].layer)
                     for n, t in summed.items()}
            if encoder is not None:
                parts[trace_names.grad(trace_names.hidden(on.encoder_layer))] = restored(encoder.grad, TOKEN_RESID)
            return parts


def block_stage(stage, run: OriginalRun, elements: dict[str, Element], backward: bool, grad_out: torch.Tensor | None,
                original_kwargs: dict, allowance: Allowances | None = None) -> torch.Tensor | None:
    """Compare a block's `stage` (BlockStage) under every element, the same steps for every layout: the original
    block run backward once on the original's input and output gradient (its forward tensors are the original run's
    records), then each element's transformed block on them, moved, its tensors un-scrambled and compared; the
    stage's round-off allowance measured where a tensor needs it (`allowance`); each run's parts of sums over several
    stages handed to stage.add, and the stage kept for a sum's round-off rerun (Sums). `original_kwargs`: what the
    original block is given besides its input. Returns the original's gradient at its input."""
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
        parts = run_once(model, None, model.dtype, None, original_kwargs, keep)
        stage.add(None, parts)
        if parts:  # the sums it adds to are measured, if they need it, by rerunning it (Sums)
            stage.sums.reruns.append((layer, run_once))
    grad_in = original.get(stage.grad_in)
    for label, element in elements.items():
        stage.add(label, run_once(model, element, model.dtype, element, element.layer_kwargs[layer],
                                  lambda name, tensor, tally=element.tally: tally.add(name, original[name], tensor)))
    if allowance is not None:  # the parts of sums a rerun gives are measured once the sums are complete (Sums)
        measure_roundoff(allowance, layer, elements, original, run.scales, stage.tensors(backward), run_once)
    return grad_in


def measure_roundoff(allowance: Allowances, layer: int, elements: dict[str, Element], original: dict[str, torch.Tensor],
                     scales, names: list[str], run_once) -> None:
    """Block `layer`'s stage's round-off, measured where a tensor of `names` needs it (stream.allowance), the same
    rule for every layout: the original block rerun in the other dtype against its checked tensors
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


class EmbeddingStage:
    """The embedding stage, rerunnable as a block's stage is: the original's gradient at its output, the looked-up
    rows, and the tensors it compares."""

    def __init__(self, model: StreamedModel, run: OriginalRun, backward: bool,
                 grads_out: dict[str, torch.Tensor] | None):
        self.model, self.looked_up, self.backward, self.grads_out = model, run.looked_up, backward, grads_out

    def tensors(self) -> list[str]:
        """Its outputs (one per stack) and, backward, its parameters' gradients (and an image's pixels')."""
        m = self.model
        grads = [*([trace_names.GRAD_INPUT] if m.pixels else []), *map(trace_names.param_grad, m.embedding_names)]
        return [*m.embedding_axes, *(grads if self.backward else [])]

    def run(self, on: StreamedModel, weights: dict[str, torch.Tensor], transform: Element | None, dtype: torch.dtype,
            element: Element | None, kwargs: dict, found, expected=()) -> None:
        """One run on `on` (the checked model or its twin in the other dtype): `weights` (as stored) moved by
        `transform`'s scramble (None: as they are) and cast to `dtype`, on `kwargs` (model inputs in `dtype`) and
        the original's output gradient moved by `element` (None: as it is), each tensor restored and handed to
        found(name, tensor): its outputs, and backward its pixels' gradient and each parameter's (one the forward
        leaves unused is none, as the whole-model trace records none, unless it is the token table's or
        `expected`: zeros)."""
        moved, restored = frames(element)
        claims, backward = self.model.claims, self.backward
        leaves = {n: as_leaf((w if transform is None else transform_param(w, claims[n], transform.scramble)).to(dtype),
                             backward) for n, w in weights.items()}
        kwargs, pixels = _with_pixels(self.model, kwargs, backward)
        outs, axes = on.embed(leaves, self.looked_up, kwargs), self.model.embedding_axes
        for name, out in outs.items():
            found(name, restored(out, axes[name]))
        if not backward:
            return
        torch.autograd.backward([outs[n] for n in axes], [moved(cast(self.grads_out[n], dtype), axes[n]) for n in axes],
                                inputs=list(leaves.values()) + pixels)
        if pixels:
            found(trace_names.GRAD_INPUT, restored(pixels[0].grad, PIXELS))
        for name, leaf in leaves.items():
            grad_name = trace_names.param_grad(name)
            if leaf.grad is None and name != self.model.embed_name and grad_name not in expected:
                continue
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            found(grad_name, restored(grad, claims[name].rule.axes, claims[name].layer))


def embedding_stage(model: StreamedModel, run: OriginalRun, elements: dict[str, Element], backward: bool,
                    grads_out: dict[str, torch.Tensor] | None, stash: dict, kwargs: dict,
                    allowance: Allowances | None = None) -> None:
    """Compare the embedding outputs (each stack's) and the gradients of its weights: the token table's looked-up
    rows (a tied head's rows completed) and its other parameters (position embeddings) whole; an image model's
    pixels' gradient too ("grad.input"). The stage's round-off allowance is measured where a tensor needs it
    (`allowance`). `grads_out`: the original's gradient at each output; `kwargs`: the original's model inputs."""
    stage, weights = EmbeddingStage(model, run, backward, grads_out), model.embedding_weights(run.looked_up)
    table = trace_names.param_grad(model.embed_name) if model.embed_name is not None else None
    originals: dict[str, torch.Tensor] = {}

    def completed(owner: str, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The token table's looked-up rows with a tied head's part added."""
        return with_head_rows(tensor, stash.get(owner), run.looked_up) if name == table else tensor

    def keep(name: str, tensor: torch.Tensor) -> None:
        if trace_names.is_grad(name):  # the output is the original run's record already
            originals[name] = completed("original", name, tensor)
            run.scales.add(name, originals[name])

    if backward:
        stage.run(model, weights, None, model.dtype, None, kwargs, keep)
    originals.update({name: run.records[name] for name in model.embedding_axes})
    for label, element in elements.items():
        def compare(name: str, tensor: torch.Tensor, label=label, tally=element.tally) -> None:
            if name in originals:  # a gradient the original's run has none of is not compared, as whole-model
                tally.add(name, originals[name], completed(label, name, tensor))
        stage.run(model, weights, element, model.dtype, element, element.kwargs, compare, expected=originals)
    if allowance is not None:
        measure_embedding_roundoff(allowance, stage, weights, elements, kwargs, run.scales)


def measure_embedding_roundoff(allowance: Allowances, stage: EmbeddingStage, weights: dict[str, torch.Tensor],
                               elements: dict[str, Element], kwargs: dict, scales) -> None:
    """The embedding stage's round-off, where a tensor needs it (stream.allowance): the original stage run in the
    other dtype and in the checked one, and each element's transformed stage likewise, each pair's distances (a
    tied head's rows left out of both: the head stage measures theirs)."""
    checked, other = allowance.model, allowance.other_model

    def between(transform: Element | None, mine: Element | None, theirs: Element | None) -> Tally:
        """The stage run once in each dtype, `transform`'s weights, moved by `theirs` and `mine` (None: as is)."""
        kept, tally = {}, Tally()
        stage.run(other, weights, transform, allowance.other, theirs,
                  theirs.kwargs if theirs is not None else allowance.original_inputs, kept.__setitem__)
        stage.run(checked, weights, transform, checked.dtype, mine, mine.kwargs if mine is not None else kwargs,
                  lambda n, t: tally.add(n, kept.pop(n), t) if n in kept else None)
        return tally

    allowance.measure("the embedding", stage.tensors(), scales, lambda: between(None, None, None),
                      lambda label: between(elements[label], elements[label], allowance.other_element(label)))

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
