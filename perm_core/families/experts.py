"""The rules and geometry every mixture-of-experts family shares: the routed experts stored fused per layer, as
transformers 5.23 stores them, and the router.

Spaces (perm_core.engine.moe): ("experts", layer) the router's rows; ("expert_mlp", layer) every expert's hidden
neurons as one space of experts x neurons, expert-major, read off a fused tensor's expert axis and neuron axis
together (spec.Merged). The fused gate|up axis holds, per expert, either the I gate columns then the I up columns
(Mixtral, Qwen, OLMoE: [E, 2I, H]) or the two alternating (gpt-oss: [E, H, 2I], gate = [..., ::2]): both are a Concat
of two parts of the same space, laid out differently. Concat.whole names the fused axis taken whole, which only the
negative control that ignores the layout transforms.
"""

from __future__ import annotations

from dataclasses import replace

from perm_core.engine.spec import Concat, Merged, Rule
from perm_core.families.base import Geometry, UnsupportedModelError


def with_experts(g: Geometry, config, n_experts: int, d_expert: int, d_shared: int = 0,
                 interleaved: bool = False) -> Geometry:
    """A dense twin's geometry with its blocks' MLPs mixtures of experts (d_mlp: the shared expert's width), but
    for the blocks the config keeps dense (Qwen's mlp_only_layers, and with decoder_sparse_step = s every block i
    with (i + 1) % s != 0, as transformers builds them): their MLP is a dense one of config.intermediate_size."""
    sparse_step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or ()) | {
        i for i in range(g.n_layers) if sparse_step > 1 and (i + 1) % sparse_step}
    dense = tuple(sorted(i for i in dense if 0 <= i < g.n_layers))
    if len(dense) == g.n_layers:
        raise UnsupportedModelError(f"{config.model_type} with every block's MLP dense (mlp_only_layers / "
                                    "decoder_sparse_step) has no mixture of experts: load it as its dense twin")
    return replace(g, d_mlp=d_shared, n_experts=n_experts, d_expert=d_expert, experts_interleaved=interleaved,
                   dense_layers=dense, d_dense=config.intermediate_size if dense else 0)


def gate_up(g: Geometry) -> Concat:
    """The fused gate|up axis of every expert, flattened expert-major with the expert axis (spec.Merged)."""
    if g.experts_interleaved:  # per neuron: its gate column, then its up column
        return Concat((("expert_mlp", 1), ("expert_mlp", 1)), groups=g.n_experts * g.d_expert, whole="expert_gate_up")
    return Concat((("expert_mlp", g.d_expert), ("expert_mlp", g.d_expert)), groups=g.n_experts,
                  whole="expert_gate_up")


def router_and_experts(layer_prefix: str, g: Geometry) -> tuple[Rule, ...]:
    """Mixtral's, Qwen's and OLMoE's MoE block: router `mlp.gate` [E, H], gate_up_proj [E, 2I, H], down_proj
    [E, H, I], no biases."""
    return (
        Rule(layer_prefix + r"mlp\.gate\.weight", ("experts", "resid"), "router", shift="router_shift"),
        Rule(layer_prefix + r"mlp\.experts\.gate_up_proj", (None, Merged(0, gate_up(g)), "resid"), "experts.gate_up"),
        Rule(layer_prefix + r"mlp\.experts\.down_proj", (None, "resid", Merged(0, "expert_mlp")), "experts.down"),
    )
