"""Each symmetry, built from a key for a model's geometry, and the negative controls that must break.

Per-block transforms draw from the key with purpose strings like "mlp/3", so one key gives every
block its own permutation, and different symmetries of the same key are independent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from perm_core.engine import keys, moe
from perm_core.engine.spec import Scramble
from perm_core.engine.transforms import BlockOrthogonal, Permutation
from perm_core.families import Geometry

SYMMETRIES = ("tokens", "channels", "heads", "head_channels", "mlp", "rotation", "experts", "router_shift")
WEIGHT_SYMMETRIES = SYMMETRIES[1:]
DESCRIPTIONS = {
    "tokens": "inter-token permutation of the input (positions move with their tokens)",
    "channels": "intra-token permutation of the residual stream, weights permuted to match",
    "heads": "permutation of attention heads (key/value groups move with their query heads)",
    "head_channels": "permutation of channels inside each head (one for Q/K, one for V/O)",
    "mlp": "permutation of MLP hidden neurons (in a mixture of experts: each expert its own, and the shared expert's)",
    "rotation": "per-head orthogonal rotations: Q/K by R, V by S and O by S^T",
    "experts": "reordering of each mixture-of-experts layer's routed experts with their router rows and biases "
               "(a shared expert stays)",
    "router_shift": "one vector added to every router row and one number to every router bias of a "
                    "mixture-of-experts layer (the routing reads only the logits' differences)",
}


def token_permutation(key: int, n_tokens: int, fixed_tokens: int | bool, fixed_last: bool = False) -> Permutation:
    """The first `fixed_tokens` tokens stay in place (True means one: a [CLS]), and the last one with `fixed_last`
    (a causal sequence classifier's pooled token); the rest are shuffled."""
    fixed = int(fixed_tokens)
    if not fixed and not fixed_last:
        return Permutation(keys.permutation(key, n_tokens, "tokens"))
    movable = n_tokens - fixed - int(fixed_last)
    rest = keys.permutation(key, movable, "tokens") + fixed
    return Permutation(torch.cat([torch.arange(fixed), rest, torch.arange(fixed + movable, n_tokens)]))


def _channel_index(head_index: torch.Tensor, channel_perms: torch.Tensor | None, head_dim: int) -> torch.Tensor:
    """Flat (head, channel) gather index: new head j holds old head head_index[j], channels permuted."""
    channels = torch.arange(head_dim).expand(len(head_index), head_dim)
    if channel_perms is not None:
        channels = channel_perms
    return (head_index[:, None] * head_dim + channels).flatten()


def _per_layer(g: Geometry, build: Callable[[int], dict]) -> dict:
    spaces = {}
    for layer in range(g.n_layers):
        spaces.update({(role, layer): chain for role, chain in build(layer).items()})
    return spaces


def channels(key: int, g: Geometry) -> Scramble:
    return Scramble({("resid", None): (Permutation(keys.permutation(key, g.d_model, "channels")),)})


def heads(key: int, g: Geometry) -> Scramble:
    """One head permutation per layer; with a position bias shared by a stack's layers (T5), one per stack."""
    rep = g.heads_per_group

    def build(layer):
        drawn_at = _stack_start(g, layer) if g.shared_head_bias else layer
        groups = keys.permutation(key, g.n_kv_heads, f"heads/{drawn_at}/groups")
        within = keys.permutations(key, g.n_kv_heads, rep, f"heads/{drawn_at}/within")
        q_heads = (groups[:, None] * rep + within).flatten()
        q_index = Permutation(_channel_index(q_heads, None, g.head_dim))
        kv_index = Permutation(_channel_index(groups, None, g.head_dim))
        return {"q": (q_index,), "o": (q_index,), "k": (kv_index,), "v": (kv_index,),
                "heads": (Permutation(q_heads),)}

    return Scramble(_per_layer(g, build))


def _stack_start(g: Geometry, layer: int) -> int:
    return next(stack.start for stack in g.stacks() if layer in stack)


def _heads_differ_per_layer(element: Scramble, g: Geometry) -> Scramble:
    """The shared head order, shifted by one more group in each later layer of a stack, for any key: every
    layer then reads the shared position bias in another head order than the one it was permuted with."""
    spaces = dict(element.spaces)
    rep = g.heads_per_group
    for layer in range(g.n_layers):
        shift = layer - _stack_start(g, layer)
        q_heads = spaces[("heads", layer)][0].index.roll(shift * rep)
        q_index = Permutation(_channel_index(q_heads, None, g.head_dim))
        kv_index = Permutation(_channel_index(q_heads[::rep] // rep, None, g.head_dim))
        spaces.update({("q", layer): (q_index,), ("o", layer): (q_index,), ("k", layer): (kv_index,),
                       ("v", layer): (kv_index,), ("heads", layer): (Permutation(q_heads),)})
    return Scramble(spaces)


def movable_qk_channels(g: Geometry) -> int:
    """Q/K channels per head that the default head_channels element permutes (the last ones of each head).

    RoPE gives each rotary plane its own frequency, so rotary channels stay put; the channels a partial
    RoPE leaves alone only meet their own partner in q.k, so they may move, the same way in Q and K. A Q/K
    norm's per-channel gain, shared by all heads, does not move with them: then nothing moves."""
    if g.qk_norm:
        return 0
    return g.head_dim - g.rotary_channels if g.rope else g.head_dim


def head_channels(key: int, g: Geometry, permute_qk: bool | None = None) -> Scramble:
    """V/O channels, and Q/K channels: all of them when permute_qk, none when False, and by default the
    ones `movable_qk_channels` allows (all without RoPE, the non-rotary ones under a partial RoPE)."""
    moving = (g.head_dim if permute_qk else 0) if permute_qk is not None else movable_qk_channels(g)
    rep = g.heads_per_group
    q_heads, kv_heads = torch.arange(g.n_heads), torch.arange(g.n_kv_heads)

    def build(layer):
        spaces = {}
        pairs = (("qk", "q", "k"), ("vo", "o", "v")) if moving else (("vo", "o", "v"),)
        for purpose, query_side, kv_side in pairs:
            if purpose == "qk" and moving < g.head_dim:  # the leading (rotary) channels stay in place
                fixed = g.head_dim - moving
                tail = keys.permutations(key, g.n_kv_heads, moving, f"head_channels/{layer}/qk_pass") + fixed
                perms = torch.cat([torch.arange(fixed).expand(g.n_kv_heads, fixed), tail], dim=1)
            else:
                perms = keys.permutations(key, g.n_kv_heads, g.head_dim, f"head_channels/{layer}/{purpose}")
            spaces[query_side] = (Permutation(_channel_index(q_heads, perms.repeat_interleave(rep, 0),
                                                             g.head_dim)),)
            spaces[kv_side] = (Permutation(_channel_index(kv_heads, perms, g.head_dim)),)
        return spaces

    return Scramble(_per_layer(g, build))


def mlp(key: int, g: Geometry) -> Scramble:
    """The dense MLP's (or shared expert's) neurons, and inside a mixture of experts each expert's own."""
    def build(layer):
        width = g.mlp_width(layer)  # a dense MLP's, a shared expert's (Qwen2-MoE), or none (0)
        dense = {"mlp": (Permutation(keys.permutation(key, width, f"mlp/{layer}")),)} if width else {}
        return {**dense, **moe.expert_neurons(key, g, layer)}

    return Scramble(_per_layer(g, build))


QK_ROTATIONS = ("general", "planes", "half_turns", "signs")


def default_qk_rotation(g: Geometry) -> str:
    """The widest Q/K rotation the geometry keeps (Geometry.restrictions says why)."""
    if g.qk_norm:  # a fixed per-channel gain: each channel must stay on its axis
        return "half_turns" if g.rope else "signs"
    return "planes" if g.rope else "general"


def rotation(key: int, g: Geometry, general_qk: bool | None = None, k_key: int | None = None,
             qk: str | None = None, whole_head_rotary: bool = False) -> Scramble:
    """Q and K by R, V by S and O by S^T, one (R, S) per key/value group.

    R's form (`qk`): "general" (any rotation), "planes" (a 2-D rotation inside each rotary plane, i and
    i + head_dim/2: commutes with RoPE), "half_turns" (each rotary plane turned by 0 or pi, i.e. both its
    channels' signs flipped together: commutes with RoPE and with a per-channel Q/K norm gain), "signs"
    (each channel's sign flipped or not). Default: `default_qk_rotation`; general_qk=True means "general".
    Under a partial RoPE "planes" and "half_turns" act so on the rotary channels only (planes i and
    i + rotary_channels/2), block-diagonal with a general rotation (planes) or sign flips (half_turns) of
    the channels RoPE leaves alone; `whole_head_rotary=True` ignores that split (a deliberate bug).
    """
    if qk is None:
        qk = "general" if general_qk else "planes" if general_qk is False else default_qk_rotation(g)
    if qk not in QK_ROTATIONS:
        raise ValueError(f"unknown Q/K rotation form {qk!r}; choose from {', '.join(QK_ROTATIONS)}")
    rep = g.heads_per_group

    def build(layer):
        def qk_blocks(k):
            purpose = f"rotation/{layer}/qk"
            if qk == "general":
                return keys.orthogonal(k, g.n_kv_heads, g.head_dim, purpose)
            if qk == "signs":
                return torch.diag_embed(_random_signs(k, g.n_kv_heads, g.head_dim, purpose))
            rotary = g.rotary_channels if g.rope and not whole_head_rotary else g.head_dim
            if qk == "planes":
                blocks = keys.plane_rotations(k, g.n_kv_heads, rotary, purpose)
            else:  # half-turns
                signs = _random_signs(k, g.n_kv_heads, rotary // 2, purpose)
                blocks = torch.diag_embed(torch.cat([signs, signs], dim=-1))
            if rotary == g.head_dim:
                return blocks
            unrotated = g.head_dim - rotary  # channels RoPE leaves alone: any rotation (planes), or sign flips
            rest = (keys.orthogonal(k, g.n_kv_heads, unrotated, f"{purpose}/pass") if qk == "planes"
                    else torch.diag_embed(_random_signs(k, g.n_kv_heads, unrotated, f"{purpose}/pass")))
            return torch.stack([torch.block_diag(a, b) for a, b in zip(blocks, rest, strict=True)])

        r = qk_blocks(key)
        r_k = r if k_key is None else qk_blocks(k_key)
        s = keys.orthogonal(key, g.n_kv_heads, g.head_dim, f"rotation/{layer}/vo")
        return {"q": (BlockOrthogonal(r.repeat_interleave(rep, 0)),), "k": (BlockOrthogonal(r_k),),
                "v": (BlockOrthogonal(s),), "o": (BlockOrthogonal(s.repeat_interleave(rep, 0)),)}

    return Scramble(_per_layer(g, build))


def _random_signs(key: int, count: int, n: int, purpose: str) -> torch.Tensor:
    flips = torch.from_numpy(keys.rng_for(key, purpose).integers(0, 2, (count, n)))
    return 1.0 - 2.0 * flips.to(torch.float64)


def build(name: str, key: int, g: Geometry, n_tokens: int | None = None) -> Scramble:
    """The group element of one symmetry with its key."""
    key = keys.validate_key(key)
    if name == "tokens":
        if not n_tokens:
            raise ValueError("the tokens symmetry needs the number of input tokens")
        return Scramble(tokens=token_permutation(key, n_tokens, g.fixed_tokens, g.fixed_last_token))
    builders = {"channels": channels, "heads": heads, "head_channels": head_channels, "mlp": mlp,
                "rotation": rotation, "experts": moe.experts, "router_shift": moe.router_shift}
    if name not in builders:
        raise ValueError(f"unknown symmetry {name!r}; choose from {', '.join(SYMMETRIES)}")
    return _drawn(builders[name], key, g)


@functools.lru_cache(maxsize=16)  # a rotation element of a 30-layer model holds ~9 MB of matrices
def _drawn(builder: Callable[[int, Geometry], Scramble], key: int, g: Geometry) -> Scramble:
    """Elements are immutable and cost up to tens of ms to draw (a QR per head for rotations), so the last
    few are kept: a key change redraws only the symmetry whose key changed. Keyed by the builder itself, so a
    substituted builder (the tests' deliberate bugs) is never answered from the cache."""
    return builder(key, g)


def build_many(key_by_symmetry: dict[str, int], g: Geometry, n_tokens: int | None = None) -> Scramble:
    """Compose several symmetries, each with its own key, in the canonical order."""
    element = Scramble()
    for name in SYMMETRIES:
        if name in key_by_symmetry:
            element = element.then(build(name, key_by_symmetry[name], g, n_tokens))
    return element


@dataclass(frozen=True)
class Control:
    symmetry: str
    name: str
    description: str
    make: Callable[[], Scramble] = field(repr=False, compare=False)

    @functools.cached_property
    def scramble(self) -> Scramble:
        """Applied to the model; un-scrambling still uses the intended element. Drawn when first asked for:
        the Explore page lists every control of every symmetry on each rerun, and drawing them all (a QR per
        head per layer for the rotation controls) was a tenth of a classroom server's time."""
        return self.make()


def _mismatched_qk(element: Scramble) -> Scramble:
    """Keys left as they were while queries move: the Q/K pairing inside each head is broken."""
    return Scramble({s: c for s, c in element.spaces.items() if s[0] != "k"})


def _heads_out_of_step(element: Scramble, g: Geometry) -> Scramble:
    """Key/value heads shifted one group further than their query heads, for any key."""
    spaces = dict(element.spaces)
    for layer in range(g.n_layers):
        kv_index = spaces[("k", layer)][0].index.view(g.n_kv_heads, g.head_dim).roll(1, 0).flatten()
        spaces[("k", layer)] = spaces[("v", layer)] = (Permutation(kv_index),)
    return Scramble(spaces)


def _nontrivial_tokens(element: Scramble, g: Geometry) -> Scramble:
    """A control needs tokens that really move: an identity draw becomes a cyclic shift of the movable ones."""
    index = element.tokens.index
    if torch.equal(index, torch.arange(len(index))):
        end = len(index) - int(g.fixed_last_token)
        index = torch.cat([index[:g.fixed_tokens], index[g.fixed_tokens:end].roll(1), index[end:]])
    return Scramble(tokens=Permutation(index))


def _last_token_moved(element: Scramble, g: Geometry) -> Scramble:
    """The element with its last token traded for the first movable one: a causal model is still equivariant
    token by token, but a classifier pooling the last position now reads another token."""
    index = element.tokens.index.clone()
    index[[g.fixed_tokens, -1]] = index[[-1, g.fixed_tokens]]
    return Scramble(tokens=Permutation(index))


def controls(name: str, key: int, g: Geometry, n_tokens: int | None = None) -> list[Control]:
    """Near misses of each symmetry; every one of them must visibly break the model. Each is drawn when it is
    first applied (Control.scramble); the key and the symmetry are checked now."""
    key = keys.validate_key(key)
    if name not in SYMMETRIES:
        raise ValueError(f"unknown symmetry {name!r}; choose from {', '.join(SYMMETRIES)}")
    if name == "tokens" and not n_tokens:
        raise ValueError("the tokens symmetry needs the number of input tokens")

    def element() -> Scramble:
        return build(name, key, g, n_tokens)

    found = []
    if name == "tokens":
        if g.movable_tokens(n_tokens) >= 2:
            def moving() -> Scramble:
                return _nontrivial_tokens(element(), g)

            found.append(Control(name, "positions_not_moved", "tokens shuffled but their positions not",
                                 lambda: moving().with_controls(positions_follow_tokens=False)))
            if g.fixed_last_token:
                found.append(Control(name, "last_token_moved",
                                     "the pooled last token shuffled with the others (positions moved with them)",
                                     lambda: _last_token_moved(moving(), g)))
            if g.sliding_window and n_tokens > g.sliding_window:  # shorter inputs never reach the window
                from perm_core.engine.tokens import WINDOW_NOT_MOVED

                found.append(Control(name, "window_not_moved",
                                     "sliding window counted in sequence order, not in the moved positions",
                                     lambda: moving().with_controls(skip_tags=frozenset({WINDOW_NOT_MOVED}))))
    elif name == "channels":
        found.append(Control(name, "norms_not_permuted", "forget to permute the LayerNorm/RMSNorm weights",
                             lambda: element().with_controls(skip_tags=frozenset({"norm"}))))
        found.append(Control(name, "residual_rotation", "a general rotation of the residual stream", lambda: Scramble(
            {("resid", None): (BlockOrthogonal(keys.orthogonal(key, 1, g.d_model, "channels/rotation")),)})))
    elif name == "heads":
        if g.n_kv_heads > 1:
            found.append(Control(name, "keys_moved_wrongly", "query heads and key/value heads out of step",
                                 lambda: _heads_out_of_step(element(), g)))
        if g.n_kv_heads == g.n_heads:
            found.append(Control(name, "qk_across_heads", "one Q/K channel permutation that crosses heads",
                                 lambda: _across_heads(key, g)))
        if g.n_kv_heads == 1 and g.n_heads > 1:  # one key/value head: nothing to move out of step
            found.append(Control(name, "output_not_permuted", "query heads permuted, output projection not",
                                 lambda: element().with_controls(skip_tags=frozenset({"attn.o"}))))
        if g.shared_head_bias and max(len(stack) for stack in g.stacks()) > 1:
            found.append(Control(name, "heads_differ_per_layer",
                                 "each layer its own head order, with one position bias shared by the stack",
                                 lambda: _heads_differ_per_layer(element(), g)))
    elif name == "head_channels":
        def qk() -> Scramble:
            return head_channels(key, g, permute_qk=True)

        found.append(Control(name, "keys_not_permuted", "query channels permuted, key channels not",
                             lambda: _mismatched_qk(qk())))
        if g.rope:
            found.append(Control(name, "qk_channels_with_rope", "Q/K channel permutation on a RoPE model", qk))
        if g.partial_rotary:
            found.append(Control(name, "rotary_channels_moved",
                                 "the rotary Q/K channels permuted (the same way in Q and K)",
                                 lambda: _rotary_channels_moved(key, g)))
    elif name == "mlp" and any(g.mlp_width(layer) for layer in range(g.n_layers)):
        found.append(Control(name, "output_not_permuted", "MLP input side permuted, output projection not",
                             lambda: element().with_controls(skip_tags=frozenset({"mlp.out"}))))
    elif name == "rotation":
        found.append(Control(name, "keys_rotated_differently", "Q rotated by R, K by another rotation",
                             lambda: rotation(key, g, k_key=keys.validate_key(key) ^ 0x5EED)))
        if g.rope:
            found.append(Control(name, "general_rotation_with_rope",
                                 "a general Q/K rotation on a RoPE model",
                                 lambda: rotation(key, g, general_qk=True)))
        if g.partial_rotary and not g.qk_norm:
            found.append(Control(name, "planes_across_the_whole_head",
                                 "Q/K rotated in planes (i, i + head_dim/2) as if RoPE rotated the whole head",
                                 lambda: rotation(key, g, whole_head_rotary=True)))
        if g.qk_norm:
            found.append(Control(name, "plane_rotation_with_qk_norm" if g.rope else "general_rotation_with_qk_norm",
                                 "a Q/K rotation that mixes channels with different Q/K norm gains",
                                 lambda: rotation(key, g, qk="planes" if g.rope else "general")))
    if name in ("mlp", "experts", "router_shift"):
        found += moe.controls(name, key, g, element,
                              lambda control, description, make: Control(name, control, description, make))
    return found


def _across_heads(key: int, g: Geometry) -> Scramble:
    across = Permutation(keys.permutation(key, g.n_heads * g.head_dim, "heads/across"))
    return Scramble(_per_layer(g, lambda layer: {"q": (across,), "k": (across,)}))


def _rotary_channels_moved(key: int, g: Geometry) -> Scramble:
    """Q and K channels permuted alike inside the rotary slice of each head: q.k keeps its terms, but each
    channel now meets RoPE's rotation of another plane (another frequency) or the other side of its own."""
    rotary = g.rotary_channels
    moved = keys.permutations(key, g.n_kv_heads, rotary, "head_channels/rotary_moved")
    perms = torch.cat([moved, torch.arange(rotary, g.head_dim).expand(g.n_kv_heads, -1)], dim=1)
    q_index = Permutation(_channel_index(torch.arange(g.n_heads), perms.repeat_interleave(g.heads_per_group, 0),
                                         g.head_dim))
    kv_index = Permutation(_channel_index(torch.arange(g.n_kv_heads), perms, g.head_dim))
    return Scramble(_per_layer(g, lambda layer: {"q": (q_index,), "k": (kv_index,)}))


def key_space_bits(name: str, g: Geometry, n_tokens: int | None = None) -> float:
    """log2 of the number of distinct elements; rotations are continuous (inf)."""
    perm_bits = keys.permutation_bits
    if name == "tokens":
        return perm_bits(g.movable_tokens(n_tokens or 1))
    if name == "channels":
        return perm_bits(g.d_model)
    if name == "heads":
        rep = g.heads_per_group
        draws = len(g.stacks()) if g.shared_head_bias else g.n_layers
        return draws * (perm_bits(g.n_kv_heads) + g.n_kv_heads * perm_bits(rep))
    if name == "head_channels":
        return g.n_layers * g.n_kv_heads * (perm_bits(g.head_dim) + perm_bits(movable_qk_channels(g)))
    if name == "mlp":
        return sum(perm_bits(g.mlp_width(layer)) for layer in range(g.n_layers)) + moe.key_space_bits(name, g)
    if name in ("experts", "router_shift"):
        return moe.key_space_bits(name, g)
    if name == "rotation":
        return float("inf")
    raise ValueError(f"unknown symmetry {name!r}")
