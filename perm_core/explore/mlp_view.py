"""MLP neuron activations of one block, original and scrambled: what the MLP symmetry moves.

The activation is the input of the block's MLP output projection (the spec's "mlp.out" weight), so one
forward pre-hook finds it in every family: [B, T, d_mlp] with axes (None, tokens, mlp of that block).
The scrambled one is recorded during Explore's own traced run when the page names the block beforehand
(Exploration.run's mlp_layer); otherwise, and for the original, by a forward that stops at that block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perm_core.engine.spec import Scramble, apply_axes
from perm_core.explore.exploration import Exploration, ExploreResult
from perm_core.explore.path import AxisPath, tensor_paths
from perm_core.run import capture
from perm_core.verify.tolerances import relative_differences


@dataclass
class MlpView:
    layer: int
    module: str  # the output projection whose input is shown
    original: torch.Tensor  # [T, d_mlp]
    scrambled: torch.Tensor  # [T', d_mlp] as the scrambled model computes it (tokens and neurons moved)
    restored: torch.Tensor  # the inverse applied to `scrambled`
    held: torch.Tensor | None  # new neuron i holds original neuron held[i] (None when the MLP key is off)
    max_rel_error: float  # restored vs original, on the original's scale
    paths: tuple[AxisPath, AxisPath] | None = None  # where the element put each row (token) and column (neuron)


def output_projection(explorer: Exploration, layer: int) -> str:
    return capture.output_projection(explorer.subject, layer)


def _activation(explorer: Exploration, params: dict, scramble: Scramble, module_name: str) -> torch.Tensor:
    return capture.stopped_input(explorer.subject, params, scramble, module_name)


def _original_activation(explorer: Exploration, module_name: str) -> torch.Tensor:
    """The original model's activation, kept on the exploration (one per block shown): every key change of
    every session on this model and input needs the same one."""
    kept = explorer.mlp_originals
    if module_name not in kept:
        kept[module_name] = _activation(explorer, explorer.subject.params, Scramble(), module_name)
    return kept[module_name]


def mlp_view(explorer: Exploration, result: ExploreResult, params: dict | None, layer: int) -> MlpView:
    """params: the scrambled model's parameters (Exploration.params_for of the same element); None when the
    result recorded this block's activation in its own run."""
    module = output_projection(explorer, layer)
    original = _original_activation(explorer, module)
    scrambled = result.mlp_inputs.get(layer)
    if scrambled is None:
        if params is None:
            raise ValueError(f"block {layer}'s MLP was not recorded in this run: give the scrambled parameters")
        scrambled = _activation(explorer, params, result.scramble, module)
    g = explorer.geometry
    in_decoder = layer >= g.n_layers - g.n_decoder_layers  # an encoder-decoder's decoder tokens never move
    axes = (None, None if in_decoder and g.n_decoder_layers else "tokens", ("mlp", layer))
    restored = apply_axes(scrambled, axes, result.scramble.inverse(), layer)
    scale = {"mlp": original.abs().max().item()}
    _, rel, _ = relative_differences({"mlp": original}, {"mlp": restored}, scale)["mlp"]
    chain = result.scramble.chain("mlp", layer)
    held = chain[0].index if len(chain) == 1 and hasattr(chain[0], "index") else None
    return MlpView(layer, module, original[0], scrambled[0], restored[0], held, rel,
                   tensor_paths(axes[1:], scrambled.shape[1:], result.scramble, layer))
