"""The head stage of a streamed check, for every layout: the logits (a headless model's last hidden state and pooled
output) and the head's gradients, vocabulary chunk by chunk, on the original's last hidden state and the invariant
loss's gradient at the original logits.

One run of the stage (HeadRun: the original's or an element's, on the checked model or its twin in the other dtype)
is rerunnable, as a block's stage is (stream.reverse.block_stage): the check runs the original and every element on
each chunk read once, and the stage's round-off allowance (stream.allowance) reruns the original, and each element
still over, in both dtypes chunk by chunk, so the head holds the same few chunk-sized tensors either way.

A tied head's gradient rows at the looked-up tokens are set aside (the embedding stage completes them and compares
them); the head compares the rest of the table's gradient, and so does its round-off rerun, the same rows zeroed in
both of its runs.
"""

from __future__ import annotations

import torch

from perm_core.engine.spec import transform_param
from perm_core.run import trace_names
from perm_core.run.trace import invariant_loss
from perm_core.stream.allowance import Allowances
from perm_core.stream.forward import OriginalRun
from perm_core.stream.tally import Tally


def as_leaf(tensor: torch.Tensor, grad: bool) -> torch.Tensor:
    """A stage's input cut from what made it: the stage's backward stops at it (and fills its .grad if asked)."""
    return tensor.detach().requires_grad_(grad)


def cast(tensor: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """`tensor` in `dtype` (itself where it is in `dtype` already); None stays None."""
    return None if tensor is None else tensor.to(dtype)


def frames(element):
    """(moved, restored): a stage's inputs into `element`'s frame and its tensors back (None: as they are)."""
    if element is None:
        return (lambda t, axes, layer=None: t), (lambda t, axes, layer=None: t.detach())
    return element.moved, element.restored


class HeadStage:
    """What every run of the head stage is given: the original's last hidden state and, backward, the invariant
    loss's gradient at the original's primary output (the logits, else the last hidden state)."""

    def __init__(self, model, run: OriginalRun, backward: bool):
        self.model, self.backward, self.looked_up, self.ids = model, backward, run.looked_up, run.ids
        self.top = run.records[trace_names.hidden(model.n_layers - 1)]
        self.axes = model.hidden_axes(model.n_layers - 1)  # the last stack's (an encoder-decoder's: the decoder's)
        self.grad_top = trace_names.grad(trace_names.hidden(model.n_layers - 1))
        self.grad_logits = None
        if backward:
            leaf = as_leaf(run.records[model.primary], True)
            self.grad_logits = torch.autograd.grad(invariant_loss(leaf), leaf)[0]

    def piece(self, tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Chunk start..stop's vocabulary entries of an output (a headless model's outputs whole)."""
        return tensor[..., start:stop] if self.model.head_chunked else tensor

    def tied_rows(self, start: int, stop: int) -> list[int]:
        """The looked-up tokens among the chunk's rows, relative to its start (none for an untied head)."""
        return [r - start for r in self.looked_up if start <= r < stop] if self.model.tied else []

    def tensors(self) -> list[str]:
        """Every tensor the stage compares."""
        m = self.model
        grads = [*(trace_names.param_grad(n) for n in [*m.head_chunked, *m.head_whole]), self.grad_top]
        return [*m.output_axes, *(grads if self.backward else [])]


class HeadRun:
    """One run of the head stage on `on` (the checked model or its twin in the other dtype): its weights moved by
    `transform`'s scramble (None: as stored) and cast to `dtype`, its inputs moved and its tensors restored by
    `element` (None: the original's frame). The head's parameters besides its vocabulary rows (`whole`) are leaves
    across the chunks, their gradients summed, as is the gradient at the stage's input."""

    def __init__(self, stage: HeadStage, on, whole: dict[str, torch.Tensor], transform, dtype: torch.dtype, element):
        self.stage, self.on, self.transform, self.dtype = stage, on, transform, dtype
        self.moved, self.restored = frames(element)
        self.ids = stage.ids if element is None else element.kwargs.get("input_ids")  # in its own frame
        self.whole = {n: as_leaf(self.weight(n, w), stage.backward) for n, w in whole.items()}
        self.grad_top: torch.Tensor | None = None

    def weight(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        claim = self.stage.model.claims[name]
        return (tensor if self.transform is None else transform_param(tensor, claim, self.transform.scramble)
                ).to(self.dtype)

    def chunk(self, chunk: dict[str, torch.Tensor], start: int, stop: int, found) -> None:
        """Run chunk start..stop (its rows `chunk`, as stored): each output and, backward, each of its rows'
        gradients, restored, handed to found(name, tensor) as it is made."""
        s, backward = self.stage, self.stage.backward
        axes, primary, claims = s.model.output_axes, s.model.primary, s.model.claims
        weights = {n: as_leaf(self.weight(n, w), backward) for n, w in chunk.items()}
        inputs = as_leaf(self.moved(cast(s.top, self.dtype), s.axes), backward)
        outputs = self.on.head(weights, self.whole, inputs, ids=self.ids)
        for name, out in outputs.items():
            found(name, self.restored(out, axes[name]))
        if backward:
            grad = self.moved(cast(s.piece(s.grad_logits, start, stop), self.dtype), axes[primary])
            torch.autograd.backward(outputs[primary], grad, inputs=[*weights.values(), *self.whole.values(), inputs])
            self.grad_top = inputs.grad if self.grad_top is None else self.grad_top + inputs.grad
            for name, weight in weights.items():
                moved, weight.grad = weight.grad, None
                found(trace_names.param_grad(name), self.restored(moved, claims[name].rule.axes, claims[name].layer))
                del moved
        del weights, outputs

    def finish(self, found, expected=()) -> None:
        """Backward: the whole parameters' summed gradients (one outside what the loss reads is none, as the
        whole-model trace records none; zeros where it is `expected`) and the gradient at the stage's input."""
        if not self.stage.backward:
            return
        claims = self.stage.model.claims
        for name, weight in self.whole.items():
            grad = weight.grad
            if grad is None and trace_names.param_grad(name) not in expected:
                continue
            grad = grad if grad is not None else torch.zeros_like(weight)
            found(trace_names.param_grad(name), self.restored(grad, claims[name].rule.axes, claims[name].layer))
        found(self.stage.grad_top, self.restored(self.grad_top, self.stage.axes))


def head_stage(model, run: OriginalRun, elements: dict, backward: bool, chunks: list[tuple[int, int]],
               allowance: Allowances | None = None) -> tuple[torch.Tensor | None, dict]:
    """Compare the head stage under every element, each chunk read once: the original run backward (its outputs are
    the original run's records), then each element's transformed head, its tensors compared with the original's;
    the stage's round-off allowance measured where a tensor needs it (`allowance`). Returns the original's gradient
    at the head's input and, for a tied head, its gradient rows at the looked-up tokens (original, and each
    element's un-scrambled), which the embedding stage adds its own to."""
    stage, stash = HeadStage(model, run, backward), {}
    whole = model.read(model.head_whole)
    original = HeadRun(stage, model, whole, None, model.dtype, None)
    runs = {label: HeadRun(stage, model, whole, element, model.dtype, element) for label, element in elements.items()}
    del whole
    kept: dict[str, torch.Tensor] = {}
    aside = trace_names.param_grad(model.embed_name)

    def keep(name: str, tensor: torch.Tensor) -> None:
        if trace_names.is_grad(name):  # the outputs are the original run's records already
            kept[name] = tensor
            run.scales.add(name, tensor)

    for start, stop in chunks:
        chunk, rows = model.head_chunk(start, stop), stage.tied_rows(start, stop)

        def setting_aside(owner: str, found, start=start, rows=rows):
            return lambda name, t: found(name, _set_aside(t, rows, stash, owner, start) if name == aside else t)

        def compare(label: str, start=start, stop=stop):
            tally = elements[label].tally

            def add(name: str, t: torch.Tensor) -> None:
                if not trace_names.is_grad(name):
                    tally.add(name, stage.piece(run.records[name], start, stop), t)
                elif name in kept:  # a gradient the original's run has none of is not compared, as whole-model
                    tally.add(name, kept[name], t)
            return add

        if backward:
            original.chunk(chunk, start, stop, setting_aside("original", keep))
        for label, element_run in runs.items():
            element_run.chunk(chunk, start, stop, setting_aside(label, compare(label)))
        del chunk
        kept.clear()
    original.finish(keep)
    for label, element_run in runs.items():
        element_run.finish(compare(label), expected=kept)
    if allowance is not None:
        measure_roundoff(allowance, stage, elements, chunks, run.scales)
    return original.grad_top, stash


def measure_roundoff(allowance: Allowances, stage: HeadStage, elements: dict, chunks: list[tuple[int, int]],
                     scales) -> None:
    """The head stage's round-off, where a tensor needs it (stream.allowance): the original head run in the other
    dtype and in the checked one, chunk by chunk, and each element's transformed head likewise, each pair's
    distances (its tied rows set aside in both runs)."""
    checked, other = allowance.model, allowance.other_model
    aside = trace_names.param_grad(checked.embed_name)

    def between(transform, mine, theirs) -> Tally:
        """The head run once in each dtype, `transform`'s weights, moved by `theirs` and `mine` (None: as is)."""
        tally, whole = Tally(), checked.read(checked.head_whole)
        runs = (HeadRun(stage, other, whole, transform, allowance.other, theirs),
                HeadRun(stage, checked, whole, transform, checked.dtype, mine))
        kept: dict[str, torch.Tensor] = {}
        for start, stop in chunks:
            chunk, rows = checked.head_chunk(start, stop), stage.tied_rows(start, stop)

            def zeroed(name: str, t: torch.Tensor, start=start, rows=rows) -> torch.Tensor:
                return _set_aside(t, rows, {}, "", start) if name == aside else t
            runs[0].chunk(chunk, start, stop, lambda n, t: kept.__setitem__(n, zeroed(n, t)))
            runs[1].chunk(chunk, start, stop, lambda n, t: tally.add(n, kept.pop(n), zeroed(n, t)))
        runs[0].finish(kept.__setitem__)
        runs[1].finish(lambda n, t: tally.add(n, kept.pop(n), t))
        return tally

    allowance.measure("the head", stage.tensors(), scales, lambda: between(None, None, None),
                      lambda label: between(elements[label], elements[label], allowance.other_element(label)))


def _set_aside(grad: torch.Tensor, rows: list[int], stash: dict, owner: str, start: int) -> torch.Tensor:
    """A tied head's gradient rows at looked-up tokens are kept apart (the embedding stage completes them) and
    zeroed here, so that this chunk's comparison and scale see only the rows that are final."""
    if rows:
        index = torch.tensor(rows)
        stash.setdefault(owner, {}).update({start + r: row for r, row in zip(rows, grad[index].clone(), strict=True)})
        grad[index] = 0.0
    return grad
