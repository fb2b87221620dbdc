"""The declarative symmetry spec and the one engine that applies it.

A family spec is a list of rules: a regular expression for a parameter name and, for each axis of
that parameter, the *role* of the space it lives in ("resid", "q", "mlp", ...). A group element
(`Scramble`) maps each space to a chain of axis transforms. Applying, inverting and composing are
written once here, for parameters, gradients and recorded activations alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import torch

from perm_core.engine.transforms import AxisTransform, BlockOrthogonal, Permutation, apply_chain, invert_chain

# Roles that exist once per block: a rule's `(?P<layer>\d+)` group says which block.
# "experts" is a mixture-of-experts layer's expert axis (router rows); "expert_mlp" its experts' hidden neurons as
# one space of experts x neurons, expert-major (see Merged); "expert_gate_up" a fused gate|up axis of those taken
# whole, which only a negative control transforms (see Concat.whole).
# "router_shift" holds a router's translation (transforms.Translation), named by a rule's `shift`, never by its axes.
LAYERED_ROLES = frozenset({"q", "k", "v", "o", "mlp", "heads", "experts", "expert_mlp", "expert_gate_up",
                           "router_shift"})
# Roles of the whole model. "positions" is the token axis of a learned position table (ViT),
# which moves with the tokens; "tokens" is the sequence axis of activations.
GLOBAL_ROLES = frozenset({"resid", "tokens", "positions"})
PIXELS = "pixels"  # an axis spec meaning "this tensor is a whole image batch [B, C, H, W]"


class UnclaimedParameterError(ValueError):
    """A parameter that no rule of the family spec claims: never silently left alone."""


@dataclass(frozen=True)
class Concat:
    """An axis that is several spaces laid end to end (GPT-2's fused q|k|v projection, Phi-3's gate|up).

    With `groups` > 1 the axis is `groups` such runs one after another, each holding the next slice of
    every space: GPT-NeoX's query_key_value is [head, (q | k | v), head_dim], i.e. groups = heads and
    parts of head_dim each. A part's space is its slices taken in group order (size groups * part size).
    """

    parts: tuple[tuple[str, int], ...]  # (role, size within one group)
    groups: int = 1
    # A role for the fused axis taken whole, transformed before it is split: no symmetry sets it (a transform of
    # the whole axis mixes the parts), only negative controls that ignore how the parts are laid out do.
    whole: str | None = None

    def split(self, tensor: torch.Tensor, axis: int) -> list[torch.Tensor]:
        """Each part's whole space along `axis`, in the order of `parts`."""
        sizes = [size for _, size in self.parts]
        if self.groups * sum(sizes) != tensor.shape[axis]:
            raise ValueError(f"fused axis of size {tensor.shape[axis]} does not split into {self.groups} x {sizes}")
        runs = tensor.movedim(axis, -1).unflatten(-1, (self.groups, sum(sizes)))
        return [piece.flatten(-2).movedim(-1, axis) for piece in runs.split(sizes, dim=-1)]

    def join(self, pieces: list[torch.Tensor], axis: int) -> torch.Tensor:
        """The inverse of `split`."""
        runs = [piece.movedim(axis, -1).unflatten(-1, (self.groups, -1)) for piece in pieces]
        return torch.cat(runs, dim=-1).flatten(-2).movedim(-1, axis)


@dataclass(frozen=True)
class Merged:
    """An axis that, with the earlier axis `outer` of the same tensor, is one space, `outer` major: a fused expert
    tensor [experts, 2 x neurons, d_model] holds its experts' neurons as one space of experts x neurons, so that a
    reordering of the experts and a permutation of each expert's own neurons are both one gather of that space. The
    outer axis's own entry in the rule is None; `inner` is the merged space's role, or a Concat of them."""

    outer: int
    inner: str | Concat


@dataclass(frozen=True)
class Gain:
    """A per-channel gain (a norm's weight) on a space some element may rotate: a diagonal map D, on which an
    element M acts by conjugation, M D M^T. For a signed permutation M that is diag(|M| g): the gain gathered, its
    signs ignored. No other orthogonal map keeps it diagonal; |M| then gives a gain that breaks the model, as a
    negative control must. (OLMoE's Q/K norm: one gain per head channel of the whole projection.)"""

    role: str


def parts_of(role) -> list:
    """The roles (a name, or (name, layer)) one axis entry of a rule or record reads, fused and merged ones too."""
    if role is None:
        return []
    if isinstance(role, Merged):
        return parts_of(role.inner)
    if isinstance(role, Gain):
        return [role.role]
    if isinstance(role, Concat):
        return [part for part, _ in role.parts] + ([role.whole] if role.whole else [])
    return [role]


@dataclass(frozen=True)
class Rule:
    pattern: str
    axes: tuple  # per axis: None (untouched) | role | Concat
    tag: str  # what the parameter is, e.g. "norm", "attn.k", "mlp.out": negative controls skip by tag
    # Added to the `layer` group: an encoder-decoder numbers its decoder blocks after the encoder's, so that
    # decoder block i and encoder block i are different spaces.
    layer_offset: int = 0
    # The space of a translation added to the parameter's values after its axes are transformed (a router's weight
    # and bias: transforms.Translation); it acts on the parameter only, never on a gradient or an activation.
    shift: str | None = None

    def match(self, name: str) -> re.Match | None:
        return re.fullmatch(self.pattern, name)


@dataclass(frozen=True)
class Claim:
    rule: Rule
    layer: int | None


@dataclass(frozen=True)
class FamilySpec:
    family: str
    rules: tuple[Rule, ...]

    def claim(self, name: str) -> Claim:
        for rule in self.rules:
            found = rule.match(name)
            if found:
                layer = found.groupdict().get("layer")
                return Claim(rule, int(layer) + rule.layer_offset if layer is not None else None)
        raise UnclaimedParameterError(
            f"parameter {name!r} is not claimed by the {self.family} symmetry spec; "
            "refusing to guess how it transforms"
        )

    def claim_all(self, names) -> dict[str, Claim]:
        return {name: self.claim(name) for name in names}

    def unclaimed(self, names) -> list[str]:
        """Every name no rule claims (claim_all stops at the first one)."""
        return [name for name in names if not any(rule.match(name) for rule in self.rules)]


@dataclass(frozen=True)
class Scramble:
    """One group element: a chain of axis transforms per space, plus an input token permutation.

    `positions_follow_tokens` and `skip_tags` only exist to build negative controls: they change how
    the element is *applied* to the model, never how its inverse un-scrambles what the model produced.
    """

    spaces: dict = field(default_factory=dict)  # (role, layer | None) -> tuple[AxisTransform, ...]
    tokens: Permutation | None = None
    positions_follow_tokens: bool = True
    skip_tags: frozenset = frozenset()

    def chain(self, role: str, layer: int | None = None) -> tuple[AxisTransform, ...]:
        if role in ("tokens", "positions"):
            if self.tokens is None or (role == "positions" and not self.positions_follow_tokens):
                return ()
            return (self.tokens,)
        return self.spaces.get((role, layer if role in LAYERED_ROLES else None), ())

    def inverse(self) -> Scramble:
        return Scramble(
            spaces={space: invert_chain(chain) for space, chain in self.spaces.items()},
            tokens=self.tokens.inverse() if self.tokens is not None else None,
        )

    def then(self, other: Scramble) -> Scramble:
        """This element followed by `other` (what you get applying self, then other)."""
        spaces = dict(self.spaces)
        for space, chain in other.spaces.items():
            spaces[space] = spaces.get(space, ()) + chain
        tokens = self.tokens
        if other.tokens is not None:
            tokens = other.tokens if tokens is None else Permutation(tokens.index[other.tokens.index])
        return Scramble(spaces, tokens, self.positions_follow_tokens and other.positions_follow_tokens,
                        self.skip_tags | other.skip_tags)

    def with_controls(self, **changes) -> Scramble:
        return replace(self, **changes)

    @property
    def is_identity(self) -> bool:
        return self.tokens is None and not any(self.spaces.values())


def apply_axes(tensor: torch.Tensor, axes, scramble: Scramble, layer: int | None = None,
               patch_size: int | None = None) -> torch.Tensor:
    """Transform every axis of `tensor` by the chain of the space its role names."""
    if axes == PIXELS:
        from perm_core.engine.patches import shuffle_patches

        return shuffle_patches(tensor, scramble.tokens, patch_size) if scramble.tokens is not None else tensor
    if len(axes) != tensor.dim():
        raise ValueError(f"axis spec {axes} does not fit a tensor of shape {tuple(tensor.shape)}")
    for axis, role in enumerate(axes):
        if role is None:
            continue
        if isinstance(role, Merged):
            tensor = _apply_merged(tensor, axis, role, scramble, layer)
            continue
        if isinstance(role, Concat):
            tensor = _apply_concat(tensor, axis, role, scramble, layer)
            continue
        if isinstance(role, Gain):
            chain = tuple(BlockOrthogonal(t.blocks.abs()) if isinstance(t, BlockOrthogonal) else t
                          for t in scramble.chain(role.role, layer))
            if chain:
                _check_size(chain, tensor.shape[axis], role.role)
                tensor = apply_chain(chain, tensor, axis)
            continue
        role, role_layer = role if isinstance(role, tuple) else (role, layer)
        chain = scramble.chain(role, role_layer)
        if chain:
            _check_size(chain, tensor.shape[axis], role)
            tensor = apply_chain(chain, tensor, axis)
    return tensor


def _apply_merged(tensor, axis, merged: Merged, scramble, layer):
    """The outer and this axis flattened into one (outer major), transformed as one axis, laid back; the tensor
    itself, as it lies, where nothing acts on the merged space."""
    if not any(scramble.chain(*(part if isinstance(part, tuple) else (part, layer))) for part in parts_of(merged)):
        return tensor
    outer = merged.outer % tensor.dim()
    moved = tensor.movedim((outer, axis), (0, 1))
    flat = moved.reshape(-1, *moved.shape[2:])
    done = apply_axes(flat, (merged.inner,) + (None,) * (flat.dim() - 1), scramble, layer)
    return done.reshape(moved.shape).movedim((0, 1), (outer, axis)).contiguous()


def _apply_concat(tensor, axis, concat: Concat, scramble, layer):
    whole = scramble.chain(concat.whole, layer) if concat.whole else ()
    if whole:
        _check_size(whole, tensor.shape[axis], concat.whole)
        tensor = apply_chain(whole, tensor, axis)
    pieces = []
    for piece, (role, _) in zip(concat.split(tensor, axis), concat.parts, strict=True):
        chain = scramble.chain(role, layer)
        if chain:
            _check_size(chain, piece.shape[axis], role)
            piece = apply_chain(chain, piece, axis)
        pieces.append(piece)
    return concat.join(pieces, axis)


def _check_size(chain, size, role):
    for transform in chain:
        if transform.size != size:
            raise ValueError(f"a {role} transform of size {transform.size} cannot act on an axis of size {size}")


def transform_params(params: dict[str, torch.Tensor], spec: FamilySpec, scramble: Scramble,
                     claims: dict[str, Claim] | None = None) -> dict[str, torch.Tensor]:
    """The parameter dict of the transformed model. Untouched tensors are shared, never copied."""
    claims = claims or spec.claim_all(params)
    return {name: transform_param(tensor, claims[name], scramble) for name, tensor in params.items()}


def transform_param(tensor: torch.Tensor, claim: Claim, scramble: Scramble) -> torch.Tensor:
    """One parameter of the transformed model: the same tensor where a control's element skips its tag."""
    if claim.rule.tag in scramble.skip_tags:
        return tensor
    tensor = apply_axes(tensor, claim.rule.axes, scramble, claim.layer)
    for translation in shifts(claim, scramble):
        tensor = translation.add_to(tensor)
    return tensor


def shifts(claim: Claim, scramble: Scramble) -> tuple:
    """The translations the element adds to a parameter's values (its rule's `shift` space; none for most)."""
    return scramble.chain(claim.rule.shift, claim.layer) if claim.rule.shift else ()


def restore_param(tensor: torch.Tensor, claim: Claim, scramble: Scramble, patch_size: int | None = None
                  ) -> torch.Tensor:
    """A transformed parameter given back: its translations taken off, then the axes' inverse applied (the exact
    inverse of transform_param for an element applied as a whole: its translations act after its axes)."""
    for translation in reversed(shifts(claim, scramble)):
        tensor = translation.inverse().add_to(tensor)
    return apply_axes(tensor, claim.rule.axes, scramble.inverse(), claim.layer, patch_size)
