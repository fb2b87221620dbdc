"""An input named in one string, so that the app's choice and the CLI's `--input` are the same thing.

    digit:N          held-out scikit-learn test digit N (as the app's digit picker draws it)
    sample:NAME      a sample picture by its name in the app
    image:PATH       an image file
    ids:N:SEED       N token ids drawn from the vocabulary with SEED
    text-sample:NAME a sample text by its name in the app
    text:TEXT        a literal text (through the tokenizer, or one hashed id per word without one)
"""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
from PIL import Image

from perm_core.models import inputs as model_inputs
from perm_core.models.registry import LoadedModel

KINDS = ("digit", "sample", "image", "ids", "text-sample", "text")
MAX_TOKENS = 128  # the app's limit: texts are truncated there too


class InputSpecError(ValueError):
    """A spec that names no input: one line saying what is accepted."""


def digit_image(index: int) -> Image.Image:
    """Held-out test digit `index` as the RGB picture the app shows (8x8, 0..16 scaled to 0..255)."""
    from perm_core.models.digits import digits_split

    _, _, test_x, _ = digits_split(raw=True)
    if not 0 <= index < len(test_x):
        raise InputSpecError(f"digit {index} does not exist: choose 0 .. {len(test_x) - 1}")
    values = (test_x[index, 0].numpy() * 255.0 / 16.0).round().clip(0, 255).astype(np.uint8)
    return Image.fromarray(values, mode="L").convert("RGB")


def _split(spec: str) -> tuple[str, str]:
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in KINDS:
        raise InputSpecError(f"unknown input {spec!r}: use one of {', '.join(k + ':...' for k in KINDS)}")
    return kind, rest


def inputs_from_spec(loaded: LoadedModel, spec: str) -> dict:
    """The model inputs a spec names, built exactly as the app builds them."""
    kind, rest = _split(spec)
    try:
        if kind == "digit":
            return {"pixel_values": model_inputs.image_to_pixels(digit_image(int(rest)), loaded)}
        if kind in ("sample", "image"):
            if kind == "sample":
                images = model_inputs.sample_images()
                if rest not in images:
                    raise InputSpecError(f"no sample picture {rest!r}; samples: {', '.join(images)}")
                image = images[rest]
            else:
                image = model_inputs.load_image(Path(rest).read_bytes())
            return {"pixel_values": model_inputs.image_to_pixels(image, loaded)}
        if kind == "ids":
            n_tokens, _, seed = rest.partition(":")
            return model_inputs.token_ids(loaded, int(n_tokens), int(seed or 0))
        text = rest
        if kind == "text-sample":
            texts = model_inputs.sample_texts()
            if rest not in texts:
                raise InputSpecError(f"no sample text {rest!r}; samples: {', '.join(texts)}")
            text = texts[rest]
        encoding, _ = model_inputs.prepare_text(text, loaded, max_tokens=MAX_TOKENS)
        return encoding
    except (ValueError, OSError) as error:  # InputError and InputSpecError are ValueErrors
        if isinstance(error, InputSpecError):
            raise
        raise InputSpecError(f"input {spec!r}: {error}") from None


def check_command(model: str, dtype: str, keys: dict[str, int], input_spec: str | None, backward: bool) -> str:
    """The CLI command that reproduces a Check page report (an uploaded file is named YOUR_FILE)."""
    parts = ["python", "-m", "perm_core", "check", model, "--dtype", dtype]
    for name, key in keys.items():
        parts += ["--symmetry", name, "--key", f"{name}={key}"]
    parts += ["--input", input_spec or "image:YOUR_FILE"]
    if not backward:
        parts.append("--forward-only")
    return shlex.join(parts + ["--json"])
