"""Qwen3-MoE: Qwen3's attention (a Q/K RMSNorm per head, its gain shared by the heads: see qwen3.py) and routed
experts in every block (perm_core.families.experts), no shared expert. Like Mistral it builds one mask for all
layers, windowed when config.sliding_window is set."""

from dataclasses import replace

import perm_core.families.llama as llama
import perm_core.families.mistral as mistral
import perm_core.families.qwen3 as qwen3
from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.experts import router_and_experts, with_experts
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER


def geometry(config) -> Geometry:
    dense = replace(mistral.geometry(config), qk_norm=True)
    return with_experts(dense, config, config.num_experts, config.moe_intermediate_size)


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (*router_and_experts(llama.L, g), *qwen3.rules(g))


FAMILY = Family("qwen3_moe", ("qwen3_moe",), llama.head_classes("Qwen3Moe"), geometry, rules, pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
