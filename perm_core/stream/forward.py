"""The original run of a streamed check, stage by stage, with what rides along on the same read of each block:
the negative controls, the elements of symmetries the architecture lacks (on their own activations: their measured
break) and the stock model's own forward (the oracle).

Each stage's weights are read, run and dropped before the next stage is read. What is kept is per token: each
block's input and output hidden state, its attention probabilities and the logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from perm_core.engine.spec import Scramble, apply_axes, transform_params
from perm_core.engine.symmetries import Control
from perm_core.engine.tokens import model_inputs
from perm_core.run import trace_names
from perm_core.run.trace import TOKEN_RESID
from perm_core.stream.layout import StreamedModel
from perm_core.stream.tally import Scales, Tally
from perm_core.verify import oracle
from perm_core.verify.tolerances import BROKEN_AT, relative


def attention_axes(layer: int) -> tuple:
    return (None, ("heads", layer), "tokens", "tokens")


@dataclass
class OriginalRun:
    block_inputs: list[torch.Tensor] = field(default_factory=list)  # block i's input hidden state
    records: dict[str, torch.Tensor] = field(default_factory=dict)  # the whole-model trace's forward names
    scales: Scales = field(default_factory=Scales)
    looked_up: list[int] = field(default_factory=list)  # the embedding rows the input reads, ascending (none for
    # pixels)
    stock_outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # transformers' own, by output name
    pixel_bytes: int = 0  # an image model's input in the checked dtype

    @property
    def stock_logits(self) -> torch.Tensor | None:
        return self.stock_outputs.get(trace_names.LOGITS)

    def keep(self, name: str, tensor: torch.Tensor) -> None:
        """A traced forward tensor of the original run, with its scale."""
        self.records[name] = tensor.detach()
        self.scales.add(name, self.records[name])


@dataclass
class ControlRun:
    """A negative control followed stage by stage until some tensor breaks by more than BROKEN_AT, each stage run on
    the original's input there; or (`own`) an element the architecture lacks as a symmetry, run to the end on its own
    activations, as the whole-model check measures its break (verify.controls.measure_break)."""

    control: Control
    inverse: Scramble
    layer_kwargs: list[dict]
    kwargs: dict  # its model inputs
    tally: Tally = field(default_factory=Tally)
    broken_at: str = ""
    worst: float = 0.0
    own: bool = False
    hidden: torch.Tensor | None = None  # with `own`: its last stage's output, in its own frame
    encoder_out: torch.Tensor | None = None  # with `own`, an encoder-decoder's: its encoder's output,
    decoder_start: torch.Tensor | None = None  # and its decoder embedding's until the decoder starts

    @property
    def follows(self) -> bool:
        """Whether its next stage is run: always with `own`, else until it breaks."""
        return self.own or not self.broken_at

    def input_at(self, original: torch.Tensor, axes) -> torch.Tensor:
        """A stage's input under this run: its own last output, or the original's input there moved."""
        return self.hidden if self.own else apply_axes(original, axes, self.control.scramble)

    def judge(self, names: list[str], scales: Scales, where: str) -> None:
        for name in names:  # tolerances.relative: a non-finite tensor in either run breaks it, as whole-model
            rel = relative(self.tally.diffs.get(name, math.inf), scales.own.get(name, math.nan))[1]
            self.worst = rel if not rel <= self.worst else self.worst
        if not self.broken_at and not self.worst <= BROKEN_AT:
            self.broken_at = where


def forward_pass(model: StreamedModel, inputs: dict, controls: list[Control] = (), stock: bool = True,
                 head_chunks: list[tuple[int, int]] | None = None, progress=None, lacking: list[Control] = ()
                 ) -> tuple[OriginalRun, list]:
    """The original run (and, with `stock`, transformers' own forward beside it), each control compared at every
    stage until it breaks, each of `lacking` (symmetries the architecture lacks) on its own activations to the end.
    Returns the run and the ControlRuns (the controls', then the lacking ones')."""
    g, dtype = model.geometry, model.dtype
    kwargs = model_inputs(inputs, g, Scramble(), dtype)
    layer_kwargs = model.layer_kwargs(kwargs)
    run = OriginalRun()
    if model.pixels:
        run.pixel_bytes = kwargs["pixel_values"].numel() * dtype.itemsize
    else:
        run.looked_up = sorted(set(kwargs["input_ids"].flatten().tolist()))
    embedding = model.embedding_weights(run.looked_up)
    hidden = model.embed(embedding, run.looked_up, kwargs)
    run.keep(trace_names.EMBED, hidden)
    if stock:
        stock_layers, stock_hidden = stock_start(model, inputs, embedding, run.looked_up)
    runs = control_runs(model, inputs, controls) + control_runs(model, inputs, lacking, own=True)
    for c in runs:
        moved = transform_params(embedding, model.spec, c.control.scramble, model.claims)
        out = model.embed(moved, run.looked_up, c.kwargs)
        c.tally.add(trace_names.EMBED, hidden, apply_axes(out, TOKEN_RESID, c.inverse))
        c.hidden = out if c.own else None
        c.judge([trace_names.EMBED], run.scales, "the embeddings")
        del moved
    del embedding
    for layer in range(model.n_layers):
        if progress:
            progress(layer / (model.n_layers + 1), f"original run: block {layer}")
        weights = model.read(model.block_names(layer))
        out, attention = model.block(layer, weights, hidden, layer_kwargs[layer])
        names = [trace_names.hidden(layer), trace_names.attn(layer)]
        run.keep(names[0], out)
        run.keep(names[1], attention)
        for c in runs:
            if not c.follows:
                continue
            moved = transform_params(weights, model.spec, c.control.scramble, model.claims)
            c_out, c_attention = model.block(layer, moved, c.input_at(hidden, TOKEN_RESID), c.layer_kwargs[layer])
            c.hidden = c_out if c.own else None
            del moved
            c.tally.add(names[0], out, apply_axes(c_out, TOKEN_RESID, c.inverse))
            c.tally.add(names[1], attention, apply_axes(c_attention, attention_axes(layer), c.inverse, layer))
            c.judge(names, run.scales, f"block {layer}")
        if stock:
            stock_hidden, _ = model.block(layer, weights, stock_hidden, stock_layers[layer], stock=True)
        run.block_inputs.append(hidden)
        hidden = out
        del weights
    if progress:
        progress(model.n_layers / (model.n_layers + 1), "original run: the head")
    pieces, stock_pieces = [], []  # each chunk's outputs (one chunk for a headless model)
    whole = model.read(model.head_whole)  # the head's parameters besides its vocabulary rows (BERT's transform)
    moved_whole = [transform_params(whole, model.spec, c.control.scramble, model.claims) for c in runs]
    axes = model.output_axes
    for start, stop in head_chunks or [(0, _vocab(model))]:
        chunk = model.head_chunk(start, stop)
        outputs = model.head(chunk, whole, hidden)
        pieces.append(outputs)
        if stock:
            stock_pieces.append(model.head(chunk, whole, stock_hidden, stock=True))
        for c, c_whole in zip(runs, moved_whole, strict=True):
            if c.follows:
                moved = transform_params(chunk, model.spec, c.control.scramble, model.claims)
                c_outputs = model.head(moved, c_whole, c.input_at(hidden, TOKEN_RESID))
                for name, tensor in c_outputs.items():
                    c.tally.add(name, outputs[name], apply_axes(tensor, axes[name], c.inverse))
        del chunk
    del whole, moved_whole
    for name in axes:
        run.keep(name, _joined(pieces, name))
    for c in runs:
        c.hidden = None  # its outputs are compared: nothing of it is run again
        if c.follows:
            c.judge(list(axes), run.scales, "the head")
    if stock:
        run.stock_outputs = {name: _joined(stock_pieces, name) for name in axes}
    return run, runs


def stock_start(model: StreamedModel, inputs: dict, embedding: dict[str, torch.Tensor], looked_up: list[int]
                ) -> tuple[list[dict], object]:
    """transformers' own forward, begun beside the original run (the oracle): what each of its blocks is given, and
    its embedding stage's output on the same embedding weights (a tuple where the model embeds two stacks)."""
    kwargs = oracle.stock_kwargs(inputs, model.geometry, model.dtype)
    return model.layer_kwargs(kwargs, stock=True), model.embed(embedding, looked_up, kwargs, stock=True)


def control_runs(model: StreamedModel, inputs: dict, controls: list[Control], own: bool = False
                 ) -> list[ControlRun]:
    """Each negative control (with `own`, each lacking symmetry's element), not yet run: its inverse, model inputs
    and what each of its blocks is given."""
    runs = []
    for control in controls:
        scramble = control.scramble
        kwargs = model_inputs(inputs, model.geometry, scramble, model.dtype)
        runs.append(ControlRun(control, scramble.inverse(), model.layer_kwargs(kwargs), kwargs, own=own))
    return runs


def _vocab(model: StreamedModel) -> int:
    return model.reader.entries[model.head_name].shape[0] if model.head_name is not None else 0


def _joined(pieces: list[dict], name: str) -> torch.Tensor:
    """An output from its chunks: the logits' vocabulary entries, one after the other."""
    return pieces[0][name] if len(pieces) == 1 else torch.cat([p[name] for p in pieces], dim=-1)

