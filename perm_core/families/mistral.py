"""Mistral: Llama's layout (no biases in the stock model) with a sliding window on every layer.

transformers 5.23 builds one mask for all layers, windowed when config.sliding_window is set, and uses a
4D mask it is given as-is: tokens.py builds that mask with the window measured in the moved positions.
"""

from dataclasses import replace

import perm_core.families.llama as llama
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER


def geometry(config) -> Geometry:
    window = getattr(config, "sliding_window", None)
    return replace(llama.geometry(config), sliding_window=window, window_in_every_layer=window is not None)


FAMILY = Family("mistral", ("mistral",), llama.head_classes("Mistral"), geometry, llama.rules,
                pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
