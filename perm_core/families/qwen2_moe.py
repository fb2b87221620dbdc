"""Qwen2-MoE: Qwen2's attention (q/k/v biases), routed experts (perm_core.families.experts) and beside them a shared
expert every token goes through, `mlp.shared_expert.{gate,up,down}_proj`, scaled by its own sigmoid gate
`mlp.shared_expert_gate` [1, d_model].

The shared expert has no router row, so reordering the routed experts leaves it where it is; its neurons are a dense
MLP's, the ("mlp", layer) space that the mlp symmetry permutes. Its gate reads the residual stream only.
"""

import perm_core.families.llama as llama
import perm_core.families.qwen2 as qwen2
from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.experts import router_and_experts, with_experts
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER

L = llama.L


def geometry(config) -> Geometry:
    return with_experts(qwen2.geometry(config), config, config.num_experts, config.moe_intermediate_size,
                        d_shared=config.shared_expert_intermediate_size)


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        *router_and_experts(L, g),
        *(Rule(L + rf"mlp\.shared_expert\.{x}_proj\.weight", ("mlp", "resid"), f"mlp.{x}") for x in ("gate", "up")),
        Rule(L + r"mlp\.shared_expert\.down_proj\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(L + r"mlp\.shared_expert_gate\.weight", (None, "resid"), "shared_gate"),
        *llama.rules(g),  # attention, norms, heads; its dense MLP rules match nothing here
    )


FAMILY = Family("qwen2_moe", ("qwen2_moe",), llama.head_classes("Qwen2Moe"), geometry, rules, pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
