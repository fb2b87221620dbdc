"""The original run of a streamed check, stage by stage, with what rides along on the same read of each block:
the negative controls and the stock model's own forward (the oracle).

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
from perm_core.verify.tolerances import BROKEN_AT


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


@dataclass
class ControlRun:
    """A negative control followed stage by stage until some tensor breaks by more than BROKEN_AT."""

    control: Control
    inverse: Scramble
    layer_kwargs: list[dict]
    kwargs: dict  # its model inputs
    tally: Tally = field(default_factory=Tally)
    broken_at: str = ""
    worst: float = 0.0

    def judge(self, names: list[str], scales: Scales, where: str) -> None:
        for name in names:
            diff, scale = self.tally.diffs.get(name, math.inf), scales.own.get(name, math.nan)
            rel = diff / scale if scale > 0 and math.isfinite(diff) else (0.0 if diff == 0 else math.inf)
            self.worst = rel if not rel <= self.worst else self.worst
        if not self.broken_at and not self.worst <= BROKEN_AT:
            self.broken_at = where


def forward_pass(model: StreamedModel, inputs: dict, controls: list[Control] = (), stock: bool = True,
                 head_chunks: list[tuple[int, int]] | None = None, progress=None) -> tuple[OriginalRun, list]:
    """The original run (and, with `stock`, transformers' own forward beside it), each control compared at every
    stage until it breaks. Returns the run and the ControlRuns."""
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
    _keep(run, trace_names.EMBED, hidden)
    if stock:
        stock_layers, stock_hidden = stock_start(model, inputs, embedding, run.looked_up)
    runs = control_runs(model, inputs, controls)
    for c in runs:
        moved = transform_params(embedding, model.spec, c.control.scramble, model.claims)
        restored = apply_axes(model.embed(moved, run.looked_up, c.kwargs), TOKEN_RESID, c.inverse)
        c.tally.add(trace_names.EMBED, hidden, restored)
        c.judge([trace_names.EMBED], run.scales, "the embeddings")
        del moved
    del embedding
    for layer in range(model.n_layers):
        if progress:
            progress(layer / (model.n_layers + 1), f"original run: block {layer}")
        weights = model.read(model.block_names(layer))
        out, attention = model.block(layer, weights, hidden, layer_kwargs[layer])
        names = [trace_names.hidden(layer), trace_names.attn(layer)]
        _keep(run, names[0], out)
        _keep(run, names[1], attention)
        for c in runs:
            if c.broken_at:
                continue
            moved = transform_params(weights, model.spec, c.control.scramble, model.claims)
            c_out, c_attention = model.block(layer, moved, apply_axes(hidden, TOKEN_RESID, c.control.scramble),
                                             c.layer_kwargs[layer])
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
            if not c.broken_at:
                moved = transform_params(chunk, model.spec, c.control.scramble, model.claims)
                c_outputs = model.head(moved, c_whole, apply_axes(hidden, TOKEN_RESID, c.control.scramble))
                for name, tensor in c_outputs.items():
                    c.tally.add(name, outputs[name], apply_axes(tensor, axes[name], c.inverse))
        del chunk
    del whole, moved_whole
    for name in axes:
        _keep(run, name, _joined(pieces, name))
    for c in runs:
        if not c.broken_at:
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


def control_runs(model: StreamedModel, inputs: dict, controls: list[Control]) -> list[ControlRun]:
    """Each negative control, not yet run: its inverse, model inputs and what each of its blocks is given."""
    runs = []
    for control in controls:
        scramble = control.scramble
        kwargs = model_inputs(inputs, model.geometry, scramble, model.dtype)
        runs.append(ControlRun(control, scramble.inverse(), model.layer_kwargs(kwargs), kwargs))
    return runs


def _vocab(model: StreamedModel) -> int:
    return model.reader.entries[model.head_name].shape[0] if model.head_name is not None else 0


def _joined(pieces: list[dict], name: str) -> torch.Tensor:
    """An output from its chunks: the logits' vocabulary entries, one after the other."""
    return pieces[0][name] if len(pieces) == 1 else torch.cat([p[name] for p in pieces], dim=-1)


def _keep(run: OriginalRun, name: str, tensor: torch.Tensor) -> None:
    run.records[name] = tensor.detach()
    run.scales.add(name, run.records[name])
