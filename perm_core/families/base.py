"""What every family adapter is made of: the geometry a config gives, and the family record (its spec's rules,
the classes it claims, the classes it refuses). Family modules import this, never the package, so the registry in
perm_core/families/__init__.py can import every family without a circle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from perm_core.engine.spec import FamilySpec, Rule
from perm_core.families.stages import EncoderDecoderLayout, StageLayout


class UnsupportedModelError(ValueError):
    """An architecture this project has no symmetry spec for."""


@dataclass(frozen=True)
class Geometry:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_mlp: int
    rope: bool  # rotary position embeddings: only rotations inside rotary planes are symmetries
    first_token_fixed: bool  # a pooled first token ([CLS]) stays in place under token permutation
    input_kind: str  # "image" | "bidirectional-text" | "causal-text"
    patch_size: int | None = None
    qk_norm: bool = False  # an RMSNorm on each query/key head, one gain per head channel shared by all heads
    sliding_window: int | None = None  # some layers attend only to the last `sliding_window` positions
    relative_position_bias: bool = False  # attention scores get a bias read from sequence order (T5)
    # Encoder-decoder: the last n_decoder_layers of the n_layers blocks are the decoder's (see stacks).
    n_decoder_layers: int = 0
    # One position-bias column per head, read by every self-attention layer of a stack (T5): see restrictions.
    shared_head_bias: bool = False
    # RoPE rotates only the first `rotary_dim` channels of each query/key head (GPT-NeoX's rotary_pct,
    # Phi-3's partial_rotary_factor); None means all of them. See rotary_channels.
    rotary_dim: int | None = None
    # Leading tokens that stay in place under token permutation: 1 for a [CLS] (the default when
    # first_token_fixed), 2 for DeiT's class and distillation tokens, which its heads read by index.
    fixed_tokens: int | None = None
    position_offset: int = 0  # the first token's position id (RoBERTa counts from padding_idx + 1)
    window_in_every_layer: bool = False  # Mistral: one mask for all layers, so the window is built into it
    # The last token stays in place under token permutation: a causal sequence classifier pools the last token in
    # array order (HF's *ForSequenceClassification reads the rightmost non-pad token). Set by the head class
    # (Family.class_geometry), not by the config.
    fixed_last_token: bool = False
    # Inputs are [batch, choices, tokens] (*ForMultipleChoice); ids given as [batch, tokens] get one choice each.
    multiple_choice: bool = False
    # Image families: the tokens the position table holds (patches of config.image_size plus the leading fixed
    # tokens). An image giving another count cannot be checked: its tokens would not match the table's rows.
    image_tokens: int | None = None
    # Mixture of experts (every block's MLP but dense_layers'): n_experts routed experts of d_expert hidden neurons
    # each, stored fused (perm_core.families.experts); d_mlp is then a shared expert's width (Qwen2-MoE), or 0.
    n_experts: int = 0
    d_expert: int = 0
    experts_interleaved: bool = False  # gate and up columns alternate in the fused gate_up axis (gpt-oss)
    # A mixture of experts whose config keeps some blocks dense (Qwen's mlp_only_layers, decoder_sparse_step): those
    # blocks' MLP is a dense one of d_dense neurons (the ("mlp", layer) space), with no router and no experts.
    dense_layers: tuple[int, ...] = ()
    d_dense: int = 0
    # The Q/K norm is one RMSNorm over the whole projection (all heads at once, one gain per head channel of each
    # head: OLMoE), not one per head with a gain shared by the heads: see restrictions.
    qk_norm_full_width: bool = False

    def __post_init__(self):
        if self.fixed_tokens is None:
            object.__setattr__(self, "fixed_tokens", int(self.first_token_fixed))
        elif self.first_token_fixed != (self.fixed_tokens > 0):
            raise ValueError(f"first_token_fixed={self.first_token_fixed} contradicts fixed_tokens={self.fixed_tokens}")

    @property
    def fixed_count(self) -> int:
        """Every token that stays in place under token permutation: the leading ones and a fixed last one."""
        return self.fixed_tokens + int(self.fixed_last_token)

    def movable_tokens(self, n_tokens: int) -> int:
        return max(n_tokens - self.fixed_count, 0)

    def mlp_width(self, layer: int) -> int:
        """The neurons of a block's ("mlp", layer) space: a dense MLP's, a shared expert's, or none (0)."""
        return self.d_dense if layer in self.dense_layers else self.d_mlp

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The blocks whose MLP is a mixture of experts (a router and routed experts)."""
        return tuple(i for i in range(self.n_layers) if i not in self.dense_layers) if self.n_experts else ()

    @property
    def heads_per_group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def stacks(self) -> list[range]:
        """The layers of each stack: the encoder's then the decoder's, or all layers as one stack."""
        encoder = self.n_layers - self.n_decoder_layers
        return [range(0, encoder), range(encoder, self.n_layers)] if self.n_decoder_layers else [range(self.n_layers)]

    @property
    def rotary_channels(self) -> int:
        """Channels of each query/key head that RoPE rotates, the first ones; the rest pass unrotated."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def partial_rotary(self) -> bool:
        return self.rope and self.rotary_channels < self.head_dim

    def restrictions(self) -> dict[str, str]:
        """symmetry -> why only a restricted form of it is generated for this geometry (one sentence)."""
        found = {}
        if self.partial_rotary:
            rotary, rest = self.rotary_channels, self.head_dim - self.rotary_channels
            found["head_channels"] = (
                f"RoPE rotates each query/key plane by its own frequency, so the {rotary} rotary channels of each "
                f"Q/K head cannot move: V/O channels are permuted, and the {rest} Q/K channels RoPE leaves alone "
                "only among themselves, the same way in Q and K (each query-key product keeps its terms).")
            found["rotation"] = (
                f"RoPE rotates only the first {rotary} of the {self.head_dim} channels of each Q/K head: Q/K are "
                f"rotated inside each rotary plane (channels i and i + {rotary // 2}) and by a general rotation "
                f"of the other {rest} channels.")
        elif self.rope:
            found["head_channels"] = ("RoPE rotates each query/key plane by its own frequency, so Q/K channels "
                                      "cannot move: only V/O channels are permuted.")
            found["rotation"] = ("Only rotations inside each rotary plane (channels i and i + head_dim/2) "
                                 "commute with RoPE, so Q/K are rotated inside those planes.")
        if self.qk_norm:
            found["rotation"] = (
                "The Q/K norm gain differs from channel to channel and does not move, so a Q/K rotation must "
                "keep every channel on its own axis: Q/K only flip the sign of whole rotary planes (half-turns), "
                "while V/O rotate freely." if self.rope else
                "The Q/K norm gain differs from channel to channel and does not move, so Q/K channels may only "
                "flip sign, while V/O rotate freely.")
        if self.qk_norm_full_width:
            found["rotation"] = (
                "The Q/K norm is one RMSNorm over the whole projection with its own gain per head channel: its mean "
                "square is kept by any rotation, but its gain is not, so Q/K only flip the sign of whole rotary "
                "planes (half-turns; the gains stay), while V/O rotate freely. Heads and channel permutations move "
                "the gains with their channels.")
        if self.shared_head_bias:
            found["heads"] = ("Every self-attention layer of a stack reads the same relative position bias, one "
                              "column per head, so all layers of a stack move their heads by one shared "
                              "permutation (cross-attention, which has no bias, follows it too).")
        return found

    def not_holding(self) -> dict[str, str]:
        """symmetry -> why it does not hold at all on this geometry (one sentence). A check reports each such
        symmetry in `not_symmetries` with the measured break of its standard element as evidence."""
        found = {}
        if self.relative_position_bias:
            found["tokens"] = ("The relative position bias is computed from the order of the tokens in the "
                               "sequence and takes no position ids, so moved tokens see different biases.")
        return found

    def not_applicable(self) -> dict[str, str]:
        """symmetry -> why this architecture has nothing it could act on (one sentence): a check leaves it out and
        says so, as no break can be measured of an element that moves nothing."""
        if self.n_experts:
            return {}
        return {"experts": "no mixture-of-experts layers: this architecture has no experts to reorder",
                "router_shift": "no mixture-of-experts layers: this architecture has no router to translate"}


@dataclass(frozen=True)
class _ClassGeometry:
    """A family's geometry with the fields its head class decides (Family.class_geometry) set: a callable of the
    config like the family's own, and equal to another built from the same parts (lru caches key on it)."""

    base: Callable[[object], Geometry]
    fields: tuple[tuple[str, object], ...]

    def __call__(self, config) -> Geometry:
        return replace(self.base(config), **dict(self.fields))


# What a head class implies for the geometry, by the end of its name: a multiple-choice head takes
# [batch, choices, tokens]; a sequence classifier of a family that pools the last token (Family.pools_last_token)
# keeps that token in place (Geometry.fixed_last_token).
_MULTIPLE_CHOICE = "ForMultipleChoice"
_LAST_TOKEN_POOLING = "ForSequenceClassification"


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    classes: tuple[str, ...]  # the Hugging Face classes whose every parameter the spec claims
    geometry: Callable[[object], Geometry]
    rules: Callable[[Geometry], tuple[Rule, ...]]
    # class name -> why it is refused (one sentence): Hugging Face classes of this family's model types that no
    # spec describes, so that loading one says why rather than "not supported".
    refused: tuple[tuple[str, str], ...] = ()
    # Its *ForSequenceClassification reads the last token in array order (the decoder-only language models).
    pools_last_token: bool = False
    # The classes the streamed check runs, each with where it keeps its stages (perm_core.families.stages); the
    # first is the one a config that names no class is streamed as.
    stages: tuple[StageLayout | EncoderDecoderLayout, ...] = ()

    def spec(self, config) -> FamilySpec:
        return FamilySpec(self.name, self.rules(self.geometry(config)))

    def for_class(self, class_name: str) -> Family:
        """This family with the geometry of one head class: a causal sequence classifier keeps its last token in
        place, a multiple-choice head takes a choices axis. Every other class gets the family unchanged."""
        fields = ()
        if class_name.endswith(_MULTIPLE_CHOICE):
            fields += (("multiple_choice", True),)
        if self.pools_last_token and class_name.endswith(_LAST_TOKEN_POOLING):
            fields += (("fixed_last_token", True),)
        return replace(self, geometry=_ClassGeometry(self.geometry, fields)) if fields else self

    def refusal(self, class_name: str) -> str | None:
        return dict(self.refused).get(class_name)
