"""The original run of a streamed check, stage by stage, with what rides along on the same read of each stage: the
negative controls, the elements of symmetries the architecture lacks (on their own activations: their measured
break) and the stock model's own forward (the oracle).

One pass for every layout (stream.layout's one stack, stream.encoder_decoder's two): the embedding (its outputs, one
per stack, model.embedding_axes), the blocks in trace order (a stack's first block starts from its embedding output,
model.stack_starts; a decoder block also reads the encoder's output, model.encoder_layer's), the head in vocabulary
chunks. Each stage's weights are read, run and dropped before the next stage is read. What is kept is per token: each
block's input and output hidden state, its attention probabilities and the outputs.
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


@dataclass
class OriginalRun:
    block_inputs: list[torch.Tensor] = field(default_factory=list)  # block i's input hidden state
    records: dict[str, torch.Tensor] = field(default_factory=dict)  # the whole-model trace's forward names
    scales: Scales = field(default_factory=Scales)
    looked_up: list[int] = field(default_factory=list)  # the token table's rows the input reads (every stack's),
    # ascending (none for pixels)
    stock_outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # transformers' own, by output name
    pixel_bytes: int = 0  # an image model's input in the checked dtype
    encoder_out: torch.Tensor | None = None  # an encoder-decoder's encoder output: every decoder block's cross input
    ids: torch.Tensor | None = None  # the input's token ids (none for pixels): a head pooled at the last token that
    # is no padding finds it in them

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
    starts: dict[str, torch.Tensor] = field(default_factory=dict)  # with `own`: its embedding outputs not yet read
    encoder_out: torch.Tensor | None = None  # with `own`, an encoder-decoder's: its encoder's output

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
    run = OriginalRun(looked_up=model.looked_up(kwargs), ids=kwargs.get("input_ids"))
    if model.pixels:
        run.pixel_bytes = kwargs["pixel_values"].numel() * dtype.itemsize
    embedding = model.embedding_weights(run.looked_up)
    embeds = model.embed(embedding, run.looked_up, kwargs)
    for name, embed in embeds.items():
        run.keep(name, embed)
    if stock:
        stock_layers, stock_embeds = stock_start(model, inputs, embedding, run.looked_up)
    runs = control_runs(model, inputs, controls) + control_runs(model, inputs, lacking, own=True)
    for c in runs:
        moved = transform_params(embedding, model.spec, c.control.scramble, model.claims)
        outs = model.embed(moved, run.looked_up, c.kwargs)
        for name, out in outs.items():
            c.tally.add(name, embeds[name], apply_axes(out, model.embedding_axes[name], c.inverse))
        c.starts = outs if c.own else {}
        c.judge(list(embeds), run.scales, "the embeddings")
        del moved
    del embedding
    hidden = stock_hidden = stock_encoder = None
    for layer in range(model.n_layers):
        if progress:
            progress(layer / (model.n_layers + 1), f"original run: block {layer}")
        start, axes = model.stack_starts.get(layer), model.block_axes(layer)
        if start is not None:
            hidden, stock_hidden = embeds[start], stock_embeds[start] if stock else None
        weights = model.read(model.stage_names(layer))
        found = model.block(layer, weights, hidden, layer_kwargs[layer], run.encoder_out)
        for name, tensor in found.items():
            run.keep(name, tensor)
        for c in runs:
            if not c.follows:
                continue
            moved = transform_params(weights, model.spec, c.control.scramble, model.claims)
            if c.own and start is not None:
                c.hidden = c.starts.pop(start)
            encoder = None if run.encoder_out is None else (
                c.encoder_out if c.own else apply_axes(run.encoder_out, TOKEN_RESID, c.control.scramble))
            c_found = model.block(layer, moved, c.input_at(hidden, model.hidden_axes(layer)), c.layer_kwargs[layer],
                                  encoder)
            del moved
            if c.own:
                c.hidden = c_found[trace_names.hidden(layer)]
                c.encoder_out = c.hidden if layer == model.encoder_layer else c.encoder_out
            for name, original in found.items():
                c.tally.add(name, original, apply_axes(c_found[name], axes[name], c.inverse, layer))
            c.judge(list(found), run.scales, f"block {layer}")
        if stock:
            stock_hidden = model.block(layer, weights, stock_hidden, stock_layers[layer], stock_encoder,
                                       stock=True)[trace_names.hidden(layer)]
            stock_encoder = stock_hidden if layer == model.encoder_layer else stock_encoder
        run.block_inputs.append(hidden)
        hidden = found[trace_names.hidden(layer)]
        run.encoder_out = hidden if layer == model.encoder_layer else run.encoder_out
        del weights
    if progress:
        progress(model.n_layers / (model.n_layers + 1), "original run: the head")
    pieces, stock_pieces = [], []  # each chunk's outputs (one chunk for a headless model)
    whole = model.read(model.head_whole)  # the head's parameters besides its vocabulary rows (BERT's transform)
    moved_whole = [transform_params(whole, model.spec, c.control.scramble, model.claims) for c in runs]
    axes, top = model.output_axes, model.hidden_axes(model.n_layers - 1)
    for start, stop in head_chunks or [(0, _vocab(model))]:
        chunk = model.head_chunk(start, stop)
        outputs = model.head(chunk, whole, hidden, ids=run.ids)
        pieces.append(outputs)
        if stock:  # the raw input's ids are the original's
            stock_pieces.append(model.head(chunk, whole, stock_hidden, stock=True, ids=run.ids))
        for c, c_whole in zip(runs, moved_whole, strict=True):
            if c.follows:
                moved = transform_params(chunk, model.spec, c.control.scramble, model.claims)
                c_outputs = model.head(moved, c_whole, c.input_at(hidden, top), ids=c.kwargs.get("input_ids"))
                for name, tensor in c_outputs.items():
                    c.tally.add(name, outputs[name], apply_axes(tensor, axes[name], c.inverse))
        del chunk
    del whole, moved_whole
    for name in axes:
        run.keep(name, _joined(pieces, name))
    for c in runs:
        c.hidden = c.encoder_out = None  # its outputs are compared: nothing of it is run again
        if c.follows:
            c.judge(list(axes), run.scales, "the head")
    if stock:
        run.stock_outputs = {name: _joined(stock_pieces, name) for name in axes}
    return run, runs


def stock_start(model: StreamedModel, inputs: dict, embedding: dict[str, torch.Tensor], looked_up: list[int]
                ) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """transformers' own forward, begun beside the original run (the oracle): what each of its blocks is given, and
    its embedding stage's outputs on the same embedding weights."""
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
