"""The guided walk for a class: five steps, each one live computation on the shipped digits ViT.

Every step is a symmetry applied with the lecturer's key, measured: what moved (how far the scrambled world is
from the original) and what came back (the worst relative error after the inverse). The page turns these
numbers into its two sentences and its figure; nothing a student reads is typed in. The steps that move tokens,
channels or heads also say where one of them went (perm_core.explore.path, as Explore does): `follow` names it,
`paths` holds the element's own transform of its space, from which the page outlines it in every chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from perm_core.explore.exploration import Exploration, ExploreResult, class_attention_grid, head_grid, patch_grid
from perm_core.explore.page_data import scrambled_pictures
from perm_core.explore.path import axis_path, default_column, default_head, default_token, tensor_paths
from perm_core.run import trace_names
from perm_core.verify.tolerances import TOLERANCE, relative_error

STEPS = ("tokens", "channels", "heads", "rotation", "exact")
TITLES = {"tokens": "1. Shuffle the tokens", "channels": "2. Shuffle the channels inside every token",
          "heads": "3. Swap the attention heads", "rotation": "4. Rotate inside every head",
          "exact": "5. Why it is exact (and why not bit for bit)"}


@dataclass
class StepResult:
    step: str
    key: int
    result: ExploreResult
    moved: float  # how far the scrambled run (or weight) is from the original, relative
    restored_error: float  # worst relative error after the inverse
    extra: dict = field(default_factory=dict)


def _probabilities(logits: torch.Tensor) -> torch.Tensor:
    return logits.double().softmax(-1)[0]


def run_step(explorer: Exploration, step: str, key: int, float32: Exploration | None = None) -> StepResult:
    """explorer: the float64 digits model on one digit; float32: the same in float32 (the last step only)."""
    symmetry = "tokens" if step == "exact" else step
    keys = {"tokens": key, "channels": key} if step == "exact" else {symmetry: key}
    result = explorer.run(keys)
    extra: dict = {}
    if step == "tokens":
        original = _probabilities(explorer.original[trace_names.LOGITS].tensor)
        scrambled = _probabilities(result.scrambled[trace_names.LOGITS].tensor)
        extra.update(original=original, scrambled=scrambled, predicted=int(original.argmax()),
                     predicted_scrambled=int(scrambled.argmax()),
                     probability_gap=float((original - scrambled).abs().max()))
        extra.update(_followed_patch(explorer, result))
    elif step == "channels":
        block0 = trace_names.hidden(0)
        original, scrambled, restored = (explorer.original[block0].tensor[0], result.scrambled[block0].tensor[0],
                                         result.restored[block0][0])
        extra["hidden"] = (original, scrambled, restored)
        # The sentence under the block-0 charts speaks of block 0: its numbers come from these very tensors
        extra["block0_moved"] = relative_error(original, scrambled)
        extra["block0_restored"] = relative_error(original, restored)
        record = explorer.original[block0]  # the map's rows are tokens, its columns channels
        paths = tensor_paths(record.axes[-2:], record.tensor.shape[-2:], result.scramble, record.layer)
        extra.update(paths=paths, follow={"channel": default_column(original, paths[1])})
    elif step == "heads":
        grid = head_grid(explorer, result, max_layers=explorer.geometry.n_layers, cells=8)
        n_heads = explorer.geometry.n_heads
        extra.update(grid=grid, paths=grid.paths, follow={"head": default_head(n_heads, grid.paths[0])})
    elif step == "rotation":
        name = next(n for n, c in explorer.subject.claims.items() if c.layer == 0 and c.rule.tag in ("attn.q",
                                                                                                    "attn.qkv"))
        params, _ = explorer.params_for(result.scramble, keys, None)
        before, after = explorer.subject.params[name].detach(), params[name].detach()
        attention = [e.max_rel_error for e in result.errors if trace_names.parse(e.name).kind == "attn"]
        extra.update(weight_name=name, weight=(before, after), attention_error=max(attention),
                     weight_change=float((after - before).abs().max() / before.abs().max()))
    elif step == "exact":
        if float32 is None:
            raise ValueError("the last step compares float64 with float32: pass the float32 exploration")
        single = float32.run(keys)
        extra.update(float32=single, tolerance64=TOLERANCE[torch.float64], tolerance32=TOLERANCE[torch.float32],
                     identical_bits=sum(bool(torch.equal(explorer.original[e.name].tensor, result.restored[e.name]))
                                        for e in result.errors), n_tensors=len(result.errors))
    return StepResult(step, key, result, result.moved, result.worst_rel, extra)


def _followed_patch(explorer: Exploration, result: ExploreResult) -> dict:
    """The tokens step's pictures (original, patches shuffled, shuffled back), the token path, the patch grid's
    (rows, columns), and the token to follow: of the patches the key moves, the one the class token attends to most
    in the last block."""
    g, pixels = explorer.geometry, explorer.subject.inputs["pixel_values"]
    cells = patch_grid(g, pixels.shape, explorer.n_tokens)
    tokens = axis_path("tokens", explorer.n_tokens, result.scramble)
    attention = explorer.original[trace_names.attn(g.n_layers - 1)].tensor
    grid = None if cells is None else class_attention_grid(attention, cells, g.fixed_tokens).double().numpy()
    return dict(pictures=scrambled_pictures(g, result, pixels), tokens=tokens, patch_grid=cells,
                follow={"token": default_token(explorer.n_tokens, g.fixed_tokens, grid, tokens)})
