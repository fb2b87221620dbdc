"""Qwen2: Llama's layout with q/k/v biases (o has none). Its sliding window is off unless use_sliding_window;
then the layers from max_window_layers on slide, and the model takes one mask per layer type (tokens.py)."""

from dataclasses import replace

import perm_core.families.llama as llama
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER


def geometry(config) -> Geometry:
    layer_types = getattr(config, "layer_types", None) or ()
    window = config.sliding_window if "sliding_attention" in layer_types else None
    return replace(llama.geometry(config), sliding_window=window)


FAMILY = Family("qwen2", ("qwen2",), llama.head_classes("Qwen2"), geometry, llama.rules,
                pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
