"""perm_core: exact permutation and rotation symmetries of Transformers.

The library behind the Transformer Symmetry Explorer; it never imports streamlit. The public API, for a script or
a notebook:

    import torch, perm_core
    loaded = perm_core.load_model("random:llama", torch.float64)    # a zoo name, random:FAMILY or a directory
    inputs = perm_core.default_inputs(loaded)
    report = perm_core.check(loaded.model, inputs, ["channels", "heads"], key=7)
    report.passed, report.to_json()
    weights = perm_core.scramble(loaded.model, ["channels", "mlp"], key=7)   # name -> transformed tensor
    comparison = perm_core.compare(model_a, model_b, [inputs])       # same function? which element maps A to B?

Each name is imported when first used: `import perm_core` alone does not load torch or transformers.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "load_model": ("perm_core.models.registry", "load_model"),
    "default_inputs": ("perm_core.models.defaults", "default_inputs"),
    "check": ("perm_core.verify.check", "check"),
    "scramble": ("perm_core.verify.check", "scrambled_weights"),
    "compare": ("perm_core.verify.same_function", "compare_models"),
    "SYMMETRIES": ("perm_core.engine.symmetries", "SYMMETRIES"),
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'perm_core' has no attribute {name!r}")
    module, attribute = _PUBLIC[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
