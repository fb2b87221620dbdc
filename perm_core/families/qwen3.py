"""Qwen3: Llama's layout plus an RMSNorm on each query/key head (gain used as-is, not 1 + w like Gemma's).

`q_norm`/`k_norm` hold one gain per head channel shared by all heads: head permutations leave them alone,
V/O transforms never see them, and a Q/K transform must commute with that diagonal gain
(Geometry.qk_norm, see Geometry.restrictions). A sliding window, when switched on, works as in Qwen2.
"""

from dataclasses import replace

import perm_core.families.llama as llama
import perm_core.families.qwen2 as qwen2
from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER


def geometry(config) -> Geometry:
    return replace(qwen2.geometry(config), qk_norm=True)


def rules(g: Geometry) -> tuple[Rule, ...]:
    # One gain per head channel, shared by every head: no transform generated for Qwen3 moves it.
    return (Rule(llama.L + r"self_attn\.[qk]_norm\.weight", (None,), "qk_norm"), *llama.rules(g))


FAMILY = Family("qwen3", ("qwen3",), llama.head_classes("Qwen3"), geometry, rules,
                pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
