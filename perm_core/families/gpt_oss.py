"""gpt-oss: attention with q/k/v/o biases and a learned sink logit per head (`self_attn.sinks` [heads]: an extra
column of every head's softmax, dropped after it), sliding and full attention layers (config.layer_types, one mask
per layer type), and routed experts in every block with biases everywhere:

  mlp.router.weight [E, H], mlp.router.bias [E]   top k of the logits, then a softmax over those k
  mlp.experts.gate_up_proj [E, H, 2I] and its bias [E, 2I]: gate and up columns ALTERNATE (gate = [..., ::2])
  mlp.experts.down_proj [E, I, H] and its bias [E, H]

A sink belongs to its head, so heads move the sinks; the expert biases belong to their experts (down_proj_bias is
one row per expert: it moves with the experts, not with the neurons).
"""

from dataclasses import replace

import perm_core.families.llama as llama
from perm_core.engine.spec import Merged, Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.experts import gate_up, with_experts
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER

L = llama.L


def geometry(config) -> Geometry:
    layer_types = getattr(config, "layer_types", None) or ()
    window = config.sliding_window if "sliding_attention" in layer_types else None
    dense = replace(llama.geometry(config), sliding_window=window)
    return with_experts(dense, config, config.num_local_experts, config.intermediate_size, interleaved=True)


def rules(g: Geometry) -> tuple[Rule, ...]:
    fused = Merged(0, gate_up(g))
    return (
        Rule(L + r"self_attn\.sinks", ("heads",), "attn.sinks"),
        Rule(L + r"mlp\.router\.weight", ("experts", "resid"), "router", shift="router_shift"),
        Rule(L + r"mlp\.router\.bias", ("experts",), "router", shift="router_shift"),
        Rule(L + r"mlp\.experts\.gate_up_proj", (None, "resid", fused), "experts.gate_up"),
        Rule(L + r"mlp\.experts\.gate_up_proj_bias", (None, fused), "experts.gate_up"),
        Rule(L + r"mlp\.experts\.down_proj", (None, Merged(0, "expert_mlp"), "resid"), "experts.down"),
        Rule(L + r"mlp\.experts\.down_proj_bias", ("experts", "resid"), "experts.down"),
        *llama.rules(g),
    )


FAMILY = Family("gpt_oss", ("gpt_oss",), ("GptOssModel", "GptOssForCausalLM", "GptOssForSequenceClassification",
                                          "GptOssForTokenClassification"), geometry, rules, pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
