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
    """A dense twin's geometry with every block's MLP a mixture of experts (d_mlp: the shared expert's width)."""
    sparse_step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = list(getattr(config, "mlp_only_layers", None) or ()) + [
        i for i in range(g.n_layers) if sparse_step > 1 and (i + 1) % sparse_step]
    if dense:
        raise UnsupportedModelError(
            f"{config.model_type} with dense MLP layers among its mixture-of-experts layers (layers "
            f"{sorted(set(dense))}: mlp_only_layers / decoder_sparse_step) is not supported: every block's MLP must "
            "be a mixture of experts")
    return replace(g, d_mlp=d_shared, n_experts=n_experts, d_expert=d_expert, experts_interleaved=interleaved)


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
