"""One Explore result's views of a chosen block, head and weight matrix, all computed together before any is used:
the input (pixels, or the token order), the hidden state and attention map of that block, the class token's
attention over the patch grid, the MLP's neurons (or a mixture of experts' routing), the weight, every head of up
to a dozen blocks, the outputs, and one row per compared tensor. block_views (and attention_view, weight_triple)
give the chosen block's alone: what a display change (another block, head or weight matrix) redraws, each a slice
of the same result.

Each view is a triple (original, scrambled, un-scrambled), the un-scrambled one the inverse applied to what the
scrambled model produced. Only the chosen block, head and weight matrix are un-scrambled; the rest of the result's
tensors stay as the scrambled run left them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perm_core.engine.patches import shuffle_patches
from perm_core.explore.exploration import (
    Exploration,
    ExploreResult,
    HeadGrid,
    class_attention_grid,
    cosine,
    head_grid,
    kind_label,
    layer_of,
    output_summary,
    patch_grid,
    weight_names,
    weight_view,
)
from perm_core.explore.mlp_view import MlpView
from perm_core.explore.path import AxisPath, axis_path, default_column, default_token, tensor_paths
from perm_core.explore.routing import RoutingView, routing_view
from perm_core.run import trace_names


@dataclass(frozen=True)
class PageChoice:
    """The views asked for: a block and a head, and one weight matrix of that block."""

    layer: int
    head: int
    weight: str | None


@dataclass(frozen=True)
class Outputs:
    kind: str  # output_summary's kinds: "classes", "next-token", "image-embedding", "embedding"
    summaries: tuple  # per column: (labels, values)
    rows: tuple[int, int, int]  # next-token: the row read in each column (the last token, moved in the scrambled)
    cosines: tuple[float, float, float] | None  # embeddings: each column's cosine to the original


@dataclass(frozen=True)
class WeightTriple:
    name: str
    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # W, W' as the scrambled model holds it, W' un-scrambled
    changed: float  # max |W' - W|
    restored: float  # max |un-scrambled W' - W|
    paths: tuple[AxisPath, AxisPath]  # where the element put each row and each column (perm_core.explore.path)


@dataclass
class BlockViews:
    """What the page shows of its chosen block, head and weight: each a slice of the one run's trace (every block's
    hidden states and attention maps are in it), so a step of the layer slider computes no forward."""

    choice: PageChoice
    hidden: tuple  # [1, T, D] after the chosen block
    attention: tuple  # [1, T, T] of the chosen head in the chosen block
    class_attention: tuple | None  # image models with a patch grid: the class token's attention, [rows, cols]
    pictures: tuple | None  # image models: the input as the three columns see it (ExplorePageData.pictures)
    mlp: MlpView | None
    weight: WeightTriple | None
    hidden_paths: tuple[AxisPath, AxisPath]  # the hidden state's rows (tokens) and columns (channels)
    attention_paths: tuple[AxisPath, AxisPath]  # the attention map's rows (query tokens) and columns (key tokens)
    tokens: AxisPath  # the input's tokens: where each patch or word went (the pictures, the chips, the overlays)
    routing: RoutingView | None = None  # a mixture-of-experts block: which experts each token chose


@dataclass
class ExplorePageData:
    result: ExploreResult
    pictures: tuple | None  # image models: pixel batches (original, scrambled, un-scrambled)
    token_order: list[int] | None  # text models: the original position of each scrambled position
    heads: HeadGrid | None  # every head of (up to) a dozen layers, when the model has more than one head
    outputs: Outputs
    proof_rows: list[dict]  # one per compared tensor: layer, kind, abs, rel, tolerance
    block: BlockViews  # the chosen block's views

    @property
    def choice(self) -> PageChoice:
        return self.block.choice


def page_data(explorer: Exploration, result: ExploreResult, choice: PageChoice, mlp: MlpView | None,
              inputs: dict, labels, tokenizer, keys_by_symmetry: dict[str, int],
              control: str | None) -> ExplorePageData:
    geometry = explorer.geometry
    tokens = result.scramble.tokens
    token_order = None
    block = block_views(explorer, result, choice, mlp, inputs, keys_by_symmetry, control)
    if geometry.input_kind != "image":
        n = inputs["input_ids"].shape[1]
        token_order = tokens.index.tolist() if tokens is not None else list(range(n))
    heads = head_grid(explorer, result) if geometry.n_heads > 1 else None
    return ExplorePageData(result, block.pictures, token_order, heads,
                           _outputs(explorer, result, inputs, labels, tokenizer), _proof_rows(explorer, result), block)


def block_views(explorer: Exploration, result: ExploreResult, choice: PageChoice, mlp: MlpView | None,
                inputs: dict, keys_by_symmetry: dict[str, int], control: str | None) -> BlockViews:
    """The chosen block's views (BlockViews); mlp: that block's MLP view, made by the caller (it may need a run)."""
    geometry = explorer.geometry
    original, scrambled, restored = explorer.original, result.scrambled, result.restored
    layer = choice.layer
    class_attention = pictures = None
    if geometry.input_kind == "image":
        pictures = scrambled_pictures(geometry, result, inputs["pixel_values"])
        grid = patch_grid(geometry, inputs["pixel_values"].shape, explorer.n_tokens)
        if grid is not None:
            attn = trace_names.attn(layer)
            class_attention = tuple(class_attention_grid(a, grid, geometry.fixed_tokens) for a in
                                    (original[attn].tensor, scrambled[attn].tensor, restored[attn]))
    hidden_name, attn_name = trace_names.hidden(layer), trace_names.attn(layer)
    hidden = (original[hidden_name].tensor, scrambled[hidden_name].tensor, restored[hidden_name])
    return BlockViews(choice, hidden, attention_view(explorer, result, layer, choice.head), class_attention,
                      pictures, mlp, weight_triple(explorer, result, layer, choice.weight, keys_by_symmetry, control),
                      _record_paths(original[hidden_name], result), _record_paths(original[attn_name], result),
                      axis_path("tokens", explorer.n_tokens, result.scramble), routing_view(explorer, result, layer))


def _record_paths(record, result: ExploreResult) -> tuple[AxisPath, AxisPath]:
    """The paths along the last two axes of a traced tensor (the rows and columns of the map the page draws)."""
    return tensor_paths(record.axes[-2:], record.tensor.shape[-2:], result.scramble, record.layer)


def default_follow(explorer: Exploration, inputs: dict, block: BlockViews | None = None) -> dict[str, int]:
    """What the page follows until a student picks: the patch the class token attends to most in the last block
    (else the first token that can move), the channel with the largest mean |value| after the last block, and the
    shown block's MLP neuron with the largest mean |value|; each the first such that the block's element moves
    (perm_core.explore.path), so that its highlight travels."""
    geometry, last = explorer.geometry, explorer.geometry.n_layers - 1
    grid = None
    if geometry.input_kind == "image":
        cells = patch_grid(geometry, inputs["pixel_values"].shape, explorer.n_tokens)
        if cells is not None:
            grid = class_attention_grid(explorer.original[trace_names.attn(last)].tensor, cells,
                                        geometry.fixed_tokens).double().numpy()
    hidden = explorer.original[trace_names.hidden(last)].tensor[0]
    tokens, channels = (None, None) if block is None else (block.tokens, block.hidden_paths[1])
    picks = {"token": default_token(explorer.n_tokens, geometry.fixed_tokens, grid, tokens),
             "channel": default_column(hidden, channels)}
    if block is not None and block.mlp is not None:
        picks["neuron"] = default_column(block.mlp.original, block.mlp.paths[1] if block.mlp.paths else None)
    return picks


def scrambled_pictures(geometry, result: ExploreResult, pixels: torch.Tensor) -> tuple:
    """The input as the three columns see it: original, patches shuffled by the token key, shuffled back."""
    tokens = result.scramble.tokens
    shuffled = shuffle_patches(pixels, tokens, geometry.patch_size) if tokens is not None else pixels
    back = shuffle_patches(shuffled, tokens.inverse(), geometry.patch_size) if tokens is not None else shuffled
    return pixels, shuffled, back


def attention_view(explorer: Exploration, result: ExploreResult, layer: int, head: int) -> tuple:
    """One head's attention map in one block: (original, scrambled, un-scrambled), each [1, T, T]."""
    name = trace_names.attn(layer)
    return tuple(t[0, head][None] for t in (explorer.original[name].tensor, result.scrambled[name].tensor,
                                            result.restored[name]))


def weight_triple(explorer: Exploration, result: ExploreResult, layer: int, weight: str | None,
                  keys_by_symmetry: dict[str, int], control: str | None) -> WeightTriple | None:
    """One weight matrix of the block as trained, as the scrambled model holds it and un-scrambled; None when
    `weight` is not one of the block's matrices."""
    if weight is None or weight not in weight_names(explorer, layer):
        return None
    w, w_scrambled, w_back = weight_view(explorer, result, keys_by_symmetry, control, weight)
    claim = explorer.subject.claims[weight]
    return WeightTriple(weight, (w, w_scrambled, w_back), (w_scrambled - w).abs().max().item(),
                        (w_back - w).abs().max().item(),
                        tensor_paths(claim.rule.axes, w.shape, result.scramble, claim.layer))


def _outputs(explorer: Exploration, result: ExploreResult, inputs: dict, labels, tokenizer) -> Outputs:
    tokens = result.scramble.tokens
    last = explorer.n_tokens - 1
    moved_last = tokens.index.tolist().index(last) if tokens is not None else last
    mask = inputs.get("attention_mask")
    scrambled_mask = mask[:, tokens.index] if (mask is not None and tokens is not None) else mask
    columns = (({k: r.tensor for k, r in explorer.original.items()}, last, mask),
               ({k: r.tensor for k, r in result.scrambled.items()}, moved_last, scrambled_mask),
               (result.restored, last, mask))
    image = explorer.geometry.input_kind == "image"
    summaries = [output_summary(t, labels, tokenizer, m, row, image=image) for t, row, m in columns]
    kind = summaries[0][0]
    cosines = None
    if kind in ("image-embedding", "embedding"):
        cosines = tuple(cosine(values, summaries[0][2]) for _, _, values in summaries)
    return Outputs(kind, tuple((names, values) for _, names, values in summaries), (last, moved_last, last),
                   cosines)


def _proof_rows(explorer: Exploration, result: ExploreResult) -> list[dict]:
    n_layers = explorer.geometry.n_layers
    return [{"layer": n_layers if layer_of(e.name) is None else layer_of(e.name), "kind": kind_label(e.name),
             "abs": e.max_abs_error, "rel": e.max_rel_error, "tolerance": e.tolerance} for e in result.errors]
