"""CLI commands: one module each, with register(subparsers) setting `run` as the handler."""

from __future__ import annotations

import torch

from perm_core.zoo import DTYPES  # noqa: F401  (re-exported for the commands)


class UsageError(Exception):
    """Bad usage or an unusable model: one line on stderr, exit code 2."""




def key_or_usage_error(text) -> int:
    """A validated key, or UsageError with the key's own one-line message."""
    from perm_core.keys import InvalidKeyError, validate_key

    try:
        return validate_key(text)
    except InvalidKeyError as error:
        raise UsageError(str(error)) from None


def load_or_usage_error(name: str, dtype: torch.dtype = torch.float32):
    """A zoo model, or UsageError with the loader's one-line reason (unknown, offline, unsupported)."""
    from perm_core.families import UnsupportedModelError, family_of
    from perm_core.progress import terminal_bar
    from perm_core.zoo import ModelLoadError, load_model

    try:
        with terminal_bar(f"load {name}") as progress:  # a first conversion takes minutes
            loaded = load_model(name, dtype=dtype, progress=progress)
        family_of(loaded.model)
    except (ModelLoadError, UnsupportedModelError, OSError, ValueError) as error:
        raise UsageError(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
    return loaded


def print_json(value) -> None:
    """Strict JSON on stdout: non-finite numbers are written as the strings "nan", "inf", "-inf"."""
    import json

    from perm_core.compare import json_safe

    print(json.dumps(json_safe(value), indent=2, allow_nan=False))
