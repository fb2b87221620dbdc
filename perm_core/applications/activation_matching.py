"""Activation matching: align B to A from what their units compute on the same held-out inputs.

What is matched, and by what (every map a Scramble, so the aligned B is B's own function by construction):
  resid  one permutation of the residual stream: LSA on the correlation of every hidden state (the embedding's
         output and every block's, every token) of A and B.
  mlp    per layer, MLP neurons: LSA on the correlation of their activations (fc2's input, after the nonlinearity).
  heads  per layer, by the activations of each head's queries and keys (the Q/K side) and values (the V/O side),
         as matching.match_head_blocks matches weights: heads by the best in-head value, then channels by LSA
         on the correlation (permutation), or one orthogonal map per head and side by Procrustes on the
         centred activations (rotation: correlation would not be rotation-equivariant).
Activations are B's own: a unit's activation does not depend on where the other spaces put their units, so
they are recorded once per model.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from perm_core.applications.matching import assignment, match_head_blocks
from perm_core.engine.spec import Scramble
from perm_core.engine.transforms import Permutation
from perm_core.families import Geometry
from perm_core.run.stateless import functional_call

PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def _standardized(x: torch.Tensor) -> torch.Tensor:
    """[samples, units] -> each unit centred and scaled to unit variance (a dead unit stays zero)."""
    x = x.to(torch.float64) - x.to(torch.float64).mean(0)
    return x / (x.std(0) + 1e-12)


def correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[units_a, units_b] Pearson correlation of two [samples, units] activations on the same samples."""
    return _standardized(a).T @ _standardized(b) / len(a)


@torch.no_grad()
def record_activations(model, images: torch.Tensor, params: dict | None = None) -> dict[str, torch.Tensor]:
    """Every activation matching reads, as [samples * tokens, units]: "hidden" (all hidden states stacked),
    "{layer}.{q_proj|k_proj|v_proj}" and "{layer}.mlp", of `model` run with its own weights or `params`. The
    model must be this run's own (hooks are added and removed around one forward), and a ViT
    (vit.layers.N.attention.*_proj, mlp.fc2)."""
    found: dict[str, torch.Tensor] = {}

    def keep(name, use_input):
        def hook(module, args, output):
            tensor = args[0] if use_input else output
            found[name] = tensor.detach().reshape(-1, tensor.shape[-1])
        return hook

    with ExitStack() as hooks:
        for index, layer in enumerate(model.vit.layers):
            for projection in PROJECTIONS:
                handle = getattr(layer.attention, projection).register_forward_hook(keep(f"{index}.{projection}",
                                                                                         False))
                hooks.callback(handle.remove)
            handle = layer.mlp.fc2.register_forward_hook(keep(f"{index}.mlp", True))
            hooks.callback(handle.remove)
        kwargs = {"pixel_values": images.to(next(model.parameters()).dtype), "output_hidden_states": True}
        out = model(**kwargs) if params is None else functional_call(model, params, args=(), kwargs=kwargs)
    found["hidden"] = torch.cat([h.reshape(-1, h.shape[-1]) for h in out.hidden_states])
    return found


def _head_activation_blocks(acts: dict, layer: int, g: Geometry, rotate: bool) -> dict:
    """{"qk": [heads, head_dim, 2 * samples], "vo": [heads, head_dim, samples]} of one layer."""
    def per_head(name):
        x = acts[f"{layer}.{name}"].to(torch.float64)
        x = x - x.mean(0) if rotate else _standardized(x)
        return x.T.reshape(g.n_heads, g.head_dim, -1)

    return {"qk": torch.cat([per_head("q_proj"), per_head("k_proj")], dim=2), "vo": per_head("v_proj")}


def align_by_activations(method: str, acts_a: dict, acts_b: dict, g: Geometry) -> Scramble:
    """The Scramble that aligns B to A for one method, from their activations on the same inputs."""
    if method == "average":
        return Scramble()
    if g.n_kv_heads != g.n_heads:
        raise ValueError("matching needs one key/value head per query head (no grouped-query attention)")
    rotate = "rotation" in method
    spaces = {("resid", None): (Permutation(assignment(correlation(acts_a["hidden"], acts_b["hidden"]))),)}
    for layer in range(g.n_layers):
        blocks_a = _head_activation_blocks(acts_a, layer, g, rotate)
        blocks_b = _head_activation_blocks(acts_b, layer, g, rotate)
        attention = match_head_blocks(blocks_a, blocks_b, g, channels=True, rotate=rotate, permute_heads=True)
        spaces.update({(role, layer): chain for role, chain in attention.items()})
        neurons = correlation(acts_a[f"{layer}.mlp"], acts_b[f"{layer}.mlp"])
        spaces[("mlp", layer)] = (Permutation(assignment(neurons)),)
    return Scramble(spaces)
