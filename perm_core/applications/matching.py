"""Align model B to model A with exact symmetries: permutations (linear assignment) and per-head rotations.

Every alignment is a `Scramble`, so the aligned B is `transform_params(B, spec, scramble)`: the same
function as B by construction (and proved by perm_core.verify.check in fusion.prove_alignment).

What is matched, and by what (weight matching unless said otherwise; see DESIGN in fusion.py):
  resid  one permutation of the residual stream, by the correlation of A's and B's hidden states on
         training images (LSA). Kept only if it lowers the final distance (identity otherwise).
  mlp    per layer, MLP neurons by LSA on the weight inner products of fc1 rows, fc1 bias, fc2 columns.
  heads  per layer, heads by LSA on a head-to-head similarity that already allows for what happens
         inside the head: the best channel assignment (permutation) or the best rotation (nuclear norm).
  head channels (permutation only): Q/K channels and V/O channels inside each head by LSA.
  rotation  per head, Q/K by R and V/O by S from the closed-form orthogonal Procrustes solution (SVD).
align_by_weights (the fusion experiment's weight matching) finds the residual permutation from the weights too,
alternating with the other spaces; activation_matching matches every space from activations instead.
Each step maximizes <A, aligned B> over its own group with the others fixed, and the identity is
always a candidate, so no step can increase ||A - B|| (steps also check this and fall back to identity).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from perm_core.engine.spec import Claim, Concat, Scramble, transform_params
from perm_core.engine.transforms import BlockOrthogonal, Permutation
from perm_core.families import Geometry

METHODS = ("average", "permutation", "rotation", "permutation+rotation")


def rows_of(params: dict, claims: dict[str, Claim], role: str, layer: int | None) -> torch.Tensor:
    """Every parameter axis living in space (role, layer), moved to the front: [n, everything else]."""
    pieces = []
    for name, tensor in params.items():
        claim = claims[name]
        for axis, axis_role in enumerate(claim.rule.axes):
            if isinstance(axis_role, Concat):
                raise ValueError("fused q|k|v projections (GPT-2) are not supported by the matcher")
            if axis_role == role and (layer is None or claim.layer == layer):
                pieces.append(tensor.detach().to(torch.float64).movedim(axis, 0).reshape(tensor.shape[axis], -1))
    return torch.cat(pieces, dim=1)


def assignment(similarity: torch.Tensor) -> torch.Tensor:
    """new position i of B holds old position index[i]: the assignment maximizing sum_i S[i, index[i]]."""
    rows, cols = linear_sum_assignment(similarity.numpy(), maximize=True)
    index = torch.as_tensor(cols[np.argsort(rows)], dtype=torch.long)
    if similarity[torch.arange(len(index)), index].sum() < similarity.diagonal().sum():
        return torch.arange(len(index))  # round-off only; the identity is never worse
    return index


def procrustes(cross: torch.Tensor) -> torch.Tensor:
    """argmax over orthogonal M of tr(M cross^T), cross = X_A X_B^T: M = U V^T from cross = U S V^T."""
    u, _, vh = torch.linalg.svd(cross)
    return u @ vh


def _head_blocks(params, claims, roles, layer, g: Geometry) -> torch.Tensor:
    """[heads, head_dim, everything else] for the Q/K (or V/O) side of one layer."""
    stacked = torch.cat([rows_of(params, claims, role, layer) for role in roles], dim=1)
    return stacked.reshape(g.n_heads, g.head_dim, -1)


def _flat_index(head_index: torch.Tensor, channels: torch.Tensor, head_dim: int) -> torch.Tensor:
    return (head_index[:, None] * head_dim + channels).flatten()


SIDES = {"qk": ("q", "k"), "vo": ("v", "o")}


def match_heads(params_a, params_b, claims, layer: int, g: Geometry, channels: bool, rotate: bool,
                permute_heads: bool) -> dict:
    """The attention spaces of one layer, matched on the weights: head permutation, then channel permutation
    or rotation."""
    blocks_a = {side: _head_blocks(params_a, claims, roles, layer, g) for side, roles in SIDES.items()}
    blocks_b = {side: _head_blocks(params_b, claims, roles, layer, g) for side, roles in SIDES.items()}
    return match_head_blocks(blocks_a, blocks_b, g, channels, rotate, permute_heads)


def match_head_blocks(blocks_a: dict, blocks_b: dict, g: Geometry, channels: bool, rotate: bool,
                      permute_heads: bool) -> dict:
    """The attention spaces of one layer from per-side blocks {"qk"|"vo": [heads, head_dim, features]}, whose
    features are anything an in-head map acts on as it acts on the weights' rows (the weights themselves, or
    the heads' activations on the same inputs)."""
    heads = torch.arange(g.n_heads)

    def best_inside(cross):  # the best value reachable inside one head pair
        if rotate:
            return torch.linalg.svdvals(cross).sum()
        if channels:
            return cross[torch.arange(len(cross)), assignment(cross)].sum()
        return cross.trace()

    if permute_heads:
        similarity = torch.zeros(g.n_heads, g.n_heads, dtype=torch.float64)
        for i in range(g.n_heads):
            for j in range(g.n_heads):
                similarity[i, j] = sum(best_inside(blocks_a[s][i] @ blocks_b[s][j].T) for s in SIDES)
        heads = assignment(similarity)
    spaces = {"heads": (Permutation(heads),)}
    for side, (query_role, kv_role) in SIDES.items():
        crosses = [blocks_a[side][h] @ blocks_b[side][heads[h]].T for h in range(g.n_heads)]
        within = torch.arange(g.head_dim).expand(g.n_heads, -1)
        if channels and not rotate:
            within = torch.stack([assignment(c) for c in crosses])
        chain = (Permutation(_flat_index(heads, within, g.head_dim)),)
        if rotate:
            rotations = torch.stack([procrustes(c) for c in crosses])
            # A rotation that does not raise <A, B> (degenerate round-off) falls back to the identity.
            gains = torch.stack([(r * c).sum() - c.trace() for r, c in zip(rotations, crosses, strict=True)])
            rotations[gains < 0] = torch.eye(g.head_dim, dtype=torch.float64)
            chain = chain + (BlockOrthogonal(rotations),)
        spaces[query_role] = spaces[kv_role] = chain
    return spaces


def match_mlp(params_a, params_b, claims, layer: int) -> Permutation:
    cross = rows_of(params_a, claims, "mlp", layer) @ rows_of(params_b, claims, "mlp", layer).T
    return Permutation(assignment(cross))


def match_residual(hidden_a: torch.Tensor, hidden_b: torch.Tensor) -> Permutation:
    """Residual channels by the correlation of hidden states [samples, d] of A and B on the same inputs."""
    def standardize(x):
        x = x.to(torch.float64)
        return (x - x.mean(0)) / (x.std(0) + 1e-12)

    correlation = standardize(hidden_a).T @ standardize(hidden_b) / len(hidden_a)
    return Permutation(assignment(correlation))


def align(method: str, params_a: dict, params_b: dict, spec, claims, g: Geometry,
          residual: Permutation | None = None) -> Scramble:
    """The Scramble that aligns B to A for one method ("average" is the identity)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method == "average":
        return Scramble()
    if g.n_kv_heads != g.n_heads:
        raise ValueError("matching needs one key/value head per query head (no grouped-query attention)")
    permute = "permutation" in method
    rotate = "rotation" in method
    resid = Scramble({("resid", None): (residual,)}) if permute and residual is not None else Scramble()
    base_b = transform_params(params_b, spec, resid, claims) if not resid.is_identity else params_b
    spaces = dict(resid.spaces)
    for layer in range(g.n_layers):
        attention = match_heads(params_a, base_b, claims, layer, g, channels=permute, rotate=rotate,
                                permute_heads=permute)
        spaces.update({(role, layer): chain for role, chain in attention.items()})
        if permute:
            spaces[("mlp", layer)] = (match_mlp(params_a, base_b, claims, layer),)
    return Scramble(spaces)


def distance(params_a: dict, params_b: dict, names=None) -> float:
    """Euclidean distance between two parameter dicts (all parameters, or those named)."""
    names = params_a.keys() if names is None else names
    total = sum(((params_a[n].detach().to(torch.float64) - params_b[n].detach().to(torch.float64)) ** 2).sum()
                for n in names)
    return float(torch.as_tensor(total).sqrt())


UNMOVED = (None, "positions", "tokens")  # axis roles that no weight symmetry moves


def residual_from_unmoved(params_a: dict, params_b: dict, claims) -> Permutation:
    """The residual permutation from the parameters whose other axes nothing moves (embeddings, norms, biases,
    the head): their rows along the residual axis are comparable before any other space is matched."""
    def rows(params):
        return torch.cat([params[name].detach().to(torch.float64).movedim(axes.index("resid"), 0)
                          .reshape(params[name].shape[axes.index("resid")], -1)
                          for name in sorted(params) if (axes := claims[name].rule.axes).count("resid") == 1
                          and all(role in UNMOVED for role in axes if role != "resid")], dim=1)

    return Permutation(assignment(rows(params_a) @ rows(params_b).T))


def align_by_weights(method: str, params_a: dict, params_b: dict, spec, claims, g: Geometry,
                     rounds: int = 5) -> Scramble:
    """Weight matching of every space, the residual stream included (Git Re-Basin's coordinate descent): starting
    from residual_from_unmoved, the inner spaces given the residual permutation (align), then the residual
    permutation given the inner spaces, by LSA on the inner products of every parameter's rows along the
    residual axis, until a round does not bring B closer. Returns the closest alignment seen."""
    if method == "average":
        return Scramble()
    residual, best = residual_from_unmoved(params_a, params_b, claims), None
    for _ in range(rounds):
        scramble = align(method, params_a, params_b, spec, claims, g, residual)
        gap = distance(params_a, transform_params(params_b, spec, scramble, claims))
        if best is not None and gap >= best[0] - 1e-12:
            break
        best = (gap, scramble)
        inner = Scramble({space: chain for space, chain in scramble.spaces.items() if space != ("resid", None)})
        moved = transform_params(params_b, spec, inner, claims)
        residual = Permutation(assignment(rows_of(params_a, claims, "resid", None)
                                          @ rows_of(moved, claims, "resid", None).T))
    return best[1]
