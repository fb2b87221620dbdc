"""OLMoE: Llama's attention with a Q/K RMSNorm over the whole projection, and routed experts in every block
(perm_core.families.experts).

`q_norm` is one RMSNorm of the whole query projection [heads x head_dim] (`k_norm` of the key projection), with its
own gain for every channel of every head: the mean square is over all heads at once, so any permutation of the
projection's channels, and any rotation, keeps it; the gain is a diagonal that moves with its channels (spec.Gain):
permutations of heads and of head channels gather it, a sign flip leaves it alone, and a rotation that mixes channels
has no diagonal to give it. Hence heads hold in full, head channels as on any RoPE model (V/O only), and Q/K rotations
only as half-turns of each rotary plane (Geometry.restrictions).
"""

from dataclasses import replace

import perm_core.families.llama as llama
from perm_core.engine.spec import Gain, Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.experts import router_and_experts, with_experts
from perm_core.families.stages import CAUSAL_LM


def geometry(config) -> Geometry:
    dense = replace(llama.geometry(config), qk_norm=True, qk_norm_full_width=True)
    return with_experts(dense, config, config.num_experts, config.intermediate_size)


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(llama.L + r"self_attn\.q_norm\.weight", (Gain("q"),), "qk_norm"),
        Rule(llama.L + r"self_attn\.k_norm\.weight", (Gain("k"),), "qk_norm"),
        *router_and_experts(llama.L, g),
        *llama.rules(g),
    )


FAMILY = Family("olmoe", ("olmoe",), ("OlmoeModel", "OlmoeForCausalLM"), geometry, rules, pools_last_token=True,
                stages=(CAUSAL_LM,))
