"""One Explore result's views of a chosen block, head and weight matrix, all computed together before any is used:
the input (pixels, or the token order), the hidden state and attention map of that block, the class token's
attention over the patch grid, the MLP's neurons, the weight, every head of up to a dozen blocks, the outputs, and
one row per compared tensor.

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


@dataclass
class ExplorePageData:
    result: ExploreResult
    choice: PageChoice
    pictures: tuple | None  # image models: pixel batches (original, scrambled, un-scrambled)
    token_order: list[int] | None  # text models: the original position of each scrambled position
    hidden: tuple  # [1, T, D] after the chosen block
    attention: tuple  # [1, T, T] of the chosen head in the chosen block
    class_attention: tuple | None  # image models with a patch grid: the class token's attention, [rows, cols]
    mlp: MlpView | None
    weight: WeightTriple | None
    heads: HeadGrid | None  # every head of (up to) a dozen layers, when the model has more than one head
    outputs: Outputs
    proof_rows: list[dict]  # one per compared tensor: layer, kind, abs, rel, tolerance


def page_data(explorer: Exploration, result: ExploreResult, choice: PageChoice, mlp: MlpView | None,
              inputs: dict, labels, tokenizer, keys_by_symmetry: dict[str, int],
              control: str | None) -> ExplorePageData:
    geometry = explorer.geometry
    original, scrambled, restored = explorer.original, result.scrambled, result.restored
    tokens = result.scramble.tokens
    layer, head = choice.layer, choice.head

    pictures = token_order = class_attention = None
    if geometry.input_kind == "image":
        pixels = inputs["pixel_values"]
        shuffled = shuffle_patches(pixels, tokens, geometry.patch_size) if tokens is not None else pixels
        back = shuffle_patches(shuffled, tokens.inverse(), geometry.patch_size) if tokens is not None else shuffled
        pictures = (pixels, shuffled, back)
        grid = patch_grid(geometry, pixels.shape, explorer.n_tokens)
        if grid is not None:
            attn = trace_names.attn(layer)
            class_attention = tuple(class_attention_grid(a, grid, geometry.fixed_tokens) for a in
                                    (original[attn].tensor, scrambled[attn].tensor, restored[attn]))
    else:
        n = inputs["input_ids"].shape[1]
        token_order = tokens.index.tolist() if tokens is not None else list(range(n))

    hidden_name, attn_name = trace_names.hidden(layer), trace_names.attn(layer)
    hidden = (original[hidden_name].tensor, scrambled[hidden_name].tensor, restored[hidden_name])
    attention = tuple(t[0, head][None] for t in (original[attn_name].tensor, scrambled[attn_name].tensor,
                                                 restored[attn_name]))
    weight = None
    if choice.weight is not None and choice.weight in weight_names(explorer, layer):
        w, w_scrambled, w_back = weight_view(explorer, result, keys_by_symmetry, control, choice.weight)
        weight = WeightTriple(choice.weight, (w, w_scrambled, w_back), (w_scrambled - w).abs().max().item(),
                              (w_back - w).abs().max().item())
    heads = head_grid(explorer, result) if geometry.n_heads > 1 else None
    return ExplorePageData(result, choice, pictures, token_order, hidden, attention, class_attention, mlp, weight,
                           heads, _outputs(explorer, result, inputs, labels, tokenizer),
                           _proof_rows(explorer, result))


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
