"""Mixtral: Mistral's attention (a sliding window on every layer when set) and a mixture of experts in every block: a
router `mlp.gate` [experts, d_model] (softmax, top k, renormalized) and fused experts (perm_core.families.experts).
config.intermediate_size is each expert's width; there is no dense MLP."""

import perm_core.families.llama as llama
import perm_core.families.mistral as mistral
from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.experts import router_and_experts, with_experts
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER


def geometry(config) -> Geometry:
    return with_experts(mistral.geometry(config), config, config.num_local_experts, config.intermediate_size)


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (*router_and_experts(llama.L, g), *llama.rules(g))  # llama's dense MLP rules match nothing here


FAMILY = Family("mixtral", ("mixtral",), llama.head_classes("Mixtral"), geometry, rules, pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
