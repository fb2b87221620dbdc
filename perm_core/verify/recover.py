"""Recover, from the weights alone, the group element that maps checkpoint A to checkpoint B.

For a scrambled pair (B = A transformed by some element) every step has an exact solution, so each step
uses a cost that is exactly zero at the right answer and visibly positive elsewhere:
  resid   residual channels by the rows of every parameter whose other axes no symmetry moves
          (embeddings, norms, biases, patch projections): B's row i is A's row index[i]. LSA on distances.
  heads   per layer, key/value groups and then the query heads inside them, by a per-head cost that every
          in-head transform leaves alone: the Gram matrix W^T W of the head's rows (Q, K, V, O; T5's bias
          column too) is unchanged by W -> M W for any orthogonal M, and equal Gram matrices mean exactly that.
  in-head one orthogonal map per key/value group and side (Q/K, V/O) by orthogonal Procrustes over the K rows
          and the rows of every query head of the group; a map that is a permutation matrix to 1e-9 is
          kept as a head-channel permutation, any other is a rotation.
  mlp     per layer, MLP neurons by LSA on distances between the rows of the MLP space.
  experts per mixture-of-experts layer, the experts' order by LSA on the rows of the experts space (router rows
          and biases, gpt-oss's down-projection biases), then each expert's neurons by LSA on its own rows of the
          experts' neuron space (spec.Merged) against those of the expert it came from.
  router  per mixture-of-experts layer, the translation of the router (router_shift): B's router rows minus A's
          reordered ones, where all of them differ by one vector (and the biases by one number).
Tokens are not recovered: a token permutation acts on the inputs, never on the weights.
A channel permutation inside a head followed by a rotation is one orthogonal map, so with both present only
their product is determined; it is reported as a rotation (see symmetries.head_channels and .rotation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from perm_core.applications.matching import assignment, procrustes
from perm_core.engine.spec import LAYERED_ROLES, Claim, Concat, FamilySpec, Gain, Merged, Scramble, transform_params
from perm_core.engine.transforms import BlockOrthogonal, Permutation, Translation
from perm_core.families import Geometry

PERMUTATION_MATRIX_AT = 1e-9  # an in-head map this close to a permutation matrix is that permutation
UNMOVED_ROLES = (None, "positions", "tokens")  # parameter axes that no weight symmetry moves
# Residual features taken per parameter, evenly spaced: a 262k-token embedding would otherwise be copied whole
# in float64 (1.3 GB for gemma3-270m), and a few thousand columns already tell every channel apart.
FEATURES_PER_PARAMETER = 8192
SIDES = {"qk": ("k", "q"), "vo": ("v", "o")}  # side -> (its key/value-group role, its query-head role)
SHIFT_ROUNDOFF = 1e-6  # router rows that differ from one shared translation by less (of their scale: a float32
# checkpoint's rounding) are that translation
NOT_RECOVERED = {"tokens": "a token permutation acts on the inputs, not on the weights: it leaves no trace "
                           "in a checkpoint, so there is nothing to recover"}


@dataclass
class InHead:
    """The orthogonal map of one (layer, side, key/value group); `permutation` when it is one."""

    matrix: torch.Tensor
    permutation: torch.Tensor | None


@dataclass
class Recovered:
    element: Scramble
    resid: torch.Tensor  # new channel i holds A's channel resid[i]
    q_heads: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> A's query head per B position
    groups: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> A's key/value group per B position
    in_head: dict[tuple[int, str, int], InHead] = field(default_factory=dict)  # (layer, side, B group) -> map
    mlp: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> A's neuron per B position
    experts: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> A's expert per B position
    expert_mlp: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> A's (expert, neuron), flat
    router_shifts: dict[int, Translation] = field(default_factory=dict)  # layer -> its router's translation

    def summary(self) -> dict[str, dict]:
        """symmetry -> how much of the model its part of the element moves."""
        maps = list(self.in_head.values())
        rotations = [m.matrix for m in maps if m.permutation is None]
        eye = torch.eye(maps[0].matrix.shape[0], dtype=torch.float64) if maps else None
        return {
            "channels": {"moved": _moved(self.resid), "of": len(self.resid)},
            "heads": {"moved": sum(_moved(h) for h in self.q_heads.values()),
                      "of": sum(len(h) for h in self.q_heads.values()),
                      "groups_moved": sum(_moved(g) for g in self.groups.values()),
                      "groups_of": sum(len(g) for g in self.groups.values())},
            "head_channels": {"moved": sum(m.permutation is not None and _moved(m.permutation) > 0 for m in maps),
                              "of": len(maps)},
            "mlp": {"moved": sum(_moved(p) for p in self.mlp.values()) + sum(
                        _moved_within(n, self.experts[layer]) for layer, n in self.expert_mlp.items()),
                    "of": sum(len(p) for p in self.mlp.values()) + sum(len(n) for n in self.expert_mlp.values())},
            "experts": {"moved": sum(_moved(e) for e in self.experts.values()),
                        "of": sum(len(e) for e in self.experts.values())},
            "router_shift": {"shifted": len(self.router_shifts), "of": len(self.experts)},
            "rotation": {"rotated": len(rotations), "of": len(maps),
                         "max_deviation": max(((r - eye).abs().max().item() for r in rotations), default=0.0)},
        }


def _moved(index: torch.Tensor) -> int:
    return int((index != torch.arange(len(index))).sum())


def _moved_within(neurons: torch.Tensor, order: torch.Tensor) -> int:
    """Neurons not in their place inside their expert, once the experts are put in order."""
    width = len(neurons) // len(order)
    return int((neurons != (order[:, None] * width + torch.arange(width)).flatten()).sum())


def rows(params: dict, claims: dict[str, Claim], role: str, layer: int | None, plain: bool = False) -> torch.Tensor:
    """Every parameter axis in space (role, layer), moved to the front and flattened: [size, features].
    Fused axes (Concat) contribute each of their pieces. `plain`: only parameters whose other axes no weight
    symmetry moves, so that a row of B is exactly a row of A (the residual stream's own features)."""
    pieces = []
    for name in sorted(params):
        claim = claims[name]
        if role in LAYERED_ROLES and claim.layer != layer:
            continue
        tensor = params[name].detach()
        axes = claim.rule.axes
        for axis, axis_role in enumerate(axes):
            others = [r for i, r in enumerate(axes) if i != axis]
            if isinstance(axis_role, Gain) or plain and (isinstance(axis_role, Concat | Merged)
                                                         or any(r not in UNMOVED_ROLES for r in others)):
                continue  # a gain is no row of its space: a sign flip of the space leaves it alone
            if isinstance(axis_role, Merged):  # the outer axis and this one as one, then as any other axis
                moved = tensor.movedim((axis_role.outer, axis), (0, 1))
                tensor, axis, axis_role = moved.reshape(-1, *moved.shape[2:]), 0, axis_role.inner
            if isinstance(axis_role, Concat):
                parts = axis_role.split(tensor, axis)
                pieces += [p.movedim(axis, 0).reshape(p.shape[axis], -1)
                           for p, (r, _) in zip(parts, axis_role.parts, strict=True) if r == role]
            elif axis_role == role:
                flat = tensor.movedim(axis, 0).reshape(tensor.shape[axis], -1)
                pieces.append(_evenly_spaced(flat, FEATURES_PER_PARAMETER) if plain else flat)
    if not pieces:
        return torch.empty(0, 0, dtype=torch.float64)
    return torch.cat([piece.to(torch.float64) for piece in pieces], dim=1)


def _evenly_spaced(flat: torch.Tensor, most: int) -> torch.Tensor:
    return flat[:, ::math.ceil(flat.shape[1] / most)] if flat.shape[1] > most else flat


def match_rows(rows_b: torch.Tensor, rows_a: torch.Tensor) -> torch.Tensor:
    """index with B's row i closest to A's row index[i], jointly (LSA on squared distances)."""
    cost = rows_b.square().sum(1)[:, None] + rows_a.square().sum(1)[None, :] - 2 * rows_b @ rows_a.T
    return assignment(-cost)


def gram_cost(blocks_b: torch.Tensor, blocks_a: torch.Tensor) -> torch.Tensor:
    """[n_b, n_a]: ||W_b^T W_b - W_a^T W_a||_F^2 per pair of head blocks [hd, features], which is zero exactly
    when W_b = M W_a for some orthogonal M (computed through hd x hd products only)."""
    own_b = torch.einsum("ncx,ndx->ncd", blocks_b, blocks_b).square().sum((1, 2))
    own_a = torch.einsum("ncx,ndx->ncd", blocks_a, blocks_a).square().sum((1, 2))
    cross = torch.einsum("icx,jdx->ijcd", blocks_b, blocks_a).square().sum((2, 3))
    return own_b[:, None] + own_a[None, :] - 2 * cross


def _in_head(x_b: torch.Tensor, x_a: torch.Tensor) -> InHead:
    matrix = procrustes(x_b @ x_a.T)
    index = assignment(matrix)
    as_permutation = torch.eye(len(index), dtype=torch.float64)[index]
    exact = (matrix - as_permutation).abs().max().item() <= PERMUTATION_MATRIX_AT
    return InHead(as_permutation if exact else matrix, index if exact else None)


def _side_chain(head_index: torch.Tensor, group_of: torch.Tensor, maps: list[InHead], hd: int) -> tuple:
    """Gather heads (and channels, for permutation maps), then rotate heads whose map is a rotation."""
    arange = torch.arange(hd)
    channels = torch.stack([maps[g].permutation if maps[g].permutation is not None else arange for g in group_of])
    chain = (Permutation((head_index[:, None] * hd + channels).flatten()),)
    if any(m.permutation is None for m in maps):
        eye = torch.eye(hd, dtype=torch.float64)
        chain += (BlockOrthogonal(torch.stack([eye if maps[g].permutation is not None else maps[g].matrix
                                               for g in group_of])),)
    return chain


def _head_blocks(params, claims, role, layer, hd) -> torch.Tensor:
    """[heads, head_dim, features] of one role of one layer."""
    found = rows(params, claims, role, layer)
    return found.reshape(-1, hd, found.shape[1])


def recover_attention(a: dict, b: dict, claims, layer: int, g: Geometry, found: Recovered) -> dict:
    """The spaces of one layer's attention (q, k, v, o, heads); A already in B's residual order."""
    hd, rep = g.head_dim, g.heads_per_group
    blocks = {who: {role: _head_blocks(p, claims, role, layer, hd) for role in "qkvo"}
              for who, p in (("a", a), ("b", b))}
    kv_cost = gram_cost(blocks["b"]["k"], blocks["a"]["k"]) + gram_cost(blocks["b"]["v"], blocks["a"]["v"])
    q_cost = gram_cost(blocks["b"]["q"], blocks["a"]["q"]) + gram_cost(blocks["b"]["o"], blocks["a"]["o"])
    bias_b, bias_a = rows(b, claims, "heads", layer), rows(a, claims, "heads", layer)
    if bias_b.numel():  # T5's relative position bias: one column per head
        q_cost = q_cost + (bias_b[:, None, :] - bias_a[None, :, :]).square().sum(-1)

    def within(group_b, group_a):
        sub = q_cost[group_b * rep:(group_b + 1) * rep, group_a * rep:(group_a + 1) * rep]
        index = assignment(-sub)
        return index, sub[torch.arange(rep), index].sum()

    group_cost = kv_cost + torch.tensor([[within(i, j)[1] for j in range(g.n_kv_heads)]
                                         for i in range(g.n_kv_heads)], dtype=torch.float64)
    groups = assignment(-group_cost)
    q_heads = torch.cat([groups[i] * rep + within(i, groups[i])[0] for i in range(g.n_kv_heads)])
    found.groups[layer], found.q_heads[layer] = groups, q_heads
    spaces = {"heads": (Permutation(q_heads),)}
    for side, (kv_role, q_role) in SIDES.items():
        maps = []
        for group in range(g.n_kv_heads):
            heads_b = range(group * rep, (group + 1) * rep)
            x_b = torch.cat([blocks["b"][kv_role][group]] + [blocks["b"][q_role][h] for h in heads_b], dim=1)
            x_a = torch.cat([blocks["a"][kv_role][groups[group]]] + [blocks["a"][q_role][q_heads[h]] for h in heads_b],
                            dim=1)
            maps.append(_in_head(x_b, x_a))
            found.in_head[(layer, side, group)] = maps[-1]
        spaces[kv_role] = _side_chain(groups, torch.arange(g.n_kv_heads), maps, hd)
        spaces[q_role] = _side_chain(q_heads, torch.arange(g.n_heads) // rep, maps, hd)
    return spaces


def recover(params_a: dict, params_b: dict, spec: FamilySpec, claims: dict[str, Claim], g: Geometry) -> Recovered:
    """The element E that best aligns A to B, step by step (channels, then each layer's heads, in-head maps and
    MLP neurons): transform_params(A, E) is exactly B when B is a scrambled copy of A."""
    resid_b, resid_a = rows(params_b, claims, "resid", None, plain=True), rows(params_a, claims, "resid", None, True)
    resid = match_rows(resid_b, resid_a) if resid_a.numel() else torch.arange(g.d_model)
    channels = Scramble({("resid", None): (Permutation(resid),)})
    aligned_a = transform_params(params_a, spec, channels, claims)
    found = Recovered(channels, resid)
    spaces = dict(channels.spaces)
    for layer in range(g.n_layers):
        if rows(params_a, claims, "q", layer).numel():
            attention = recover_attention(aligned_a, params_b, claims, layer, g, found)
            spaces.update({(role, layer): chain for role, chain in attention.items()})
        mlp_a = rows(aligned_a, claims, "mlp", layer)
        if mlp_a.numel():
            found.mlp[layer] = match_rows(rows(params_b, claims, "mlp", layer), mlp_a)
            spaces[("mlp", layer)] = (Permutation(found.mlp[layer]),)
        if layer in g.moe_layers:
            order, neurons = recover_experts(aligned_a, params_b, claims, layer, g)
            found.experts[layer], found.expert_mlp[layer] = order, neurons
            spaces[("experts", layer)], spaces[("expert_mlp", layer)] = (Permutation(order),), (Permutation(neurons),)
            shift = router_shift(aligned_a, params_b, claims, layer, order)
            if shift is not None:
                found.router_shifts[layer] = shift
                spaces[("router_shift", layer)] = (shift,)
    found.element = Scramble(spaces)
    return found


def recover_experts(a: dict, b: dict, claims, layer: int, g: Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """(A's expert per B position, A's flat (expert, neuron) per B position) of one layer; A already in B's
    residual order. B's new expert e holds A's expert order[e], its neuron i A's neuron index[e, i] of that one."""
    order = match_rows(rows(b, claims, "experts", layer), rows(a, claims, "experts", layer))
    width = g.d_expert
    neurons_b, neurons_a = rows(b, claims, "expert_mlp", layer), rows(a, claims, "expert_mlp", layer)
    index = [order[e] * width + match_rows(neurons_b[e * width:(e + 1) * width],
                                           neurons_a[order[e] * width:(order[e] + 1) * width])
             for e in range(g.n_experts)]
    return order, torch.cat(index)


def router_shift(a: dict, b: dict, claims, layer: int, order: torch.Tensor) -> Translation | None:
    """The translation B's router rows carry beyond A's reordered ones (A in B's residual order): the rows' mean
    difference v and the biases' mean difference c, where every row differs by v to round-off (then B's routing is
    A's); None where nothing is added or the rows differ otherwise (then the residual says how far)."""
    names = [n for n, c in claims.items() if c.rule.shift and c.layer == layer]
    weight = next((n for n in names if a[n].dim() == 2), None)
    if weight is None:
        return None
    diff = b[weight].detach().to(torch.float64) - a[weight].detach().to(torch.float64)[order]
    vector = diff.mean(0)
    bias = next((n for n in names if a[n].dim() == 1), None)
    offset = ((b[bias].detach().to(torch.float64) - a[bias].detach().to(torch.float64)[order]).mean()
              if bias is not None else torch.tensor(0.0, dtype=torch.float64))
    scale = b[weight].detach().abs().max().to(torch.float64)
    if not (diff - vector).abs().max() <= SHIFT_ROUNDOFF * scale or not (vector.abs().max() > SHIFT_ROUNDOFF * scale
                                                                       or offset.abs() > 0):
        return None
    return Translation(torch.ones(len(order), dtype=torch.float64), vector, offset)
