"""MLP neuron activations of one block, original and scrambled: what the MLP symmetry moves.

The activation is the input of the block's MLP output projection (the spec's "mlp.out" weight), so one
forward pre-hook finds it in every family: [B, T, d_mlp] with axes (None, tokens, mlp of that block).
Recorded only when a page asks for it, by one forward of each model with only that hook.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perm_core.compare import relative_differences
from perm_core.explore import Exploration, ExploreResult
from perm_core.spec import Scramble, apply_axes
from perm_core.stateless import functional_call, model_lock
from perm_core.tokens import model_inputs


@dataclass
class MlpView:
    layer: int
    module: str  # the output projection whose input is shown
    original: torch.Tensor  # [T, d_mlp]
    scrambled: torch.Tensor  # [T', d_mlp] as the scrambled model computes it (tokens and neurons moved)
    restored: torch.Tensor  # the inverse applied to `scrambled`
    held: torch.Tensor | None  # new neuron i holds original neuron held[i] (None when the MLP key is off)
    max_rel_error: float  # restored vs original, on the original's scale


def output_projection(explorer: Exploration, layer: int) -> str:
    subject = explorer.subject
    for name, claim in subject.claims.items():
        if claim.layer == layer and claim.rule.tag == "mlp.out" and subject.params[name].dim() == 2:
            return name.rsplit(".", 1)[0]
    raise ValueError(f"block {layer} of {subject.family.name} has no MLP output projection")


class _Captured(Exception):
    """Raised by the hook once it holds the activation: the blocks after it (and a language model's head) would
    compute nothing that is shown."""


def _activation(explorer: Exploration, params: dict, scramble: Scramble, module_name: str) -> torch.Tensor:
    subject = explorer.subject
    captured = {}

    def capture(_module, args):
        captured["x"] = args[0].detach()
        raise _Captured

    module = subject.model.get_submodule(module_name)
    with model_lock(subject.model):  # a shared model: the hook must see this run only
        handle = module.register_forward_pre_hook(capture)
        try:
            with torch.no_grad():
                functional_call(subject.model, params, args=(),
                                kwargs=model_inputs(subject.inputs, subject.geometry, scramble, subject.dtype),
                                strict=False)
        except _Captured:
            pass
        finally:
            handle.remove()
    if "x" not in captured:
        raise RuntimeError(f"{module_name} was not called in the forward pass")
    return captured["x"]


def _original_activation(explorer: Exploration, module_name: str) -> torch.Tensor:
    """The original model's activation, kept on the exploration (one per block shown): every key change of
    every session on this model and input needs the same one."""
    kept = explorer.mlp_originals
    if module_name not in kept:
        kept[module_name] = _activation(explorer, explorer.subject.params, Scramble(), module_name)
    return kept[module_name]


def mlp_view(explorer: Exploration, result: ExploreResult, params: dict, layer: int) -> MlpView:
    """params: the scrambled model's parameters (Exploration.params_for of the same element)."""
    module = output_projection(explorer, layer)
    original = _original_activation(explorer, module)
    scrambled = _activation(explorer, params, result.scramble, module)
    g = explorer.geometry
    in_decoder = layer >= g.n_layers - g.n_decoder_layers  # an encoder-decoder's decoder tokens never move
    axes = (None, None if in_decoder and g.n_decoder_layers else "tokens", ("mlp", layer))
    restored = apply_axes(scrambled, axes, result.scramble.inverse(), layer)
    scale = {"mlp": original.abs().max().item()}
    _, rel, _ = relative_differences({"mlp": original}, {"mlp": restored}, scale)["mlp"]
    chain = result.scramble.chain("mlp", layer)
    held = chain[0].index if len(chain) == 1 and hasattr(chain[0], "index") else None
    return MlpView(layer, module, original[0], scrambled[0], restored[0], held, rel)
