"""A sensible input for any zoo model, so `check` and the pages can run on a model alone."""

from __future__ import annotations

from perm_core.models import inputs as model_inputs
from perm_core.models.random_models import random_inputs
from perm_core.models.registry import LoadedModel

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


def default_inputs(loaded: LoadedModel, seed: int = 0) -> dict:
    if loaded.info.source == "random":
        return random_inputs(loaded.info.family, loaded.model, seed)
    if loaded.tokenizer is not None:
        encoding, _ = model_inputs.prepare_text(DEFAULT_TEXT, loaded)
        return encoding
    if model_inputs.takes_text(loaded):  # a text model without a tokenizer: ids drawn from its vocabulary
        return model_inputs.token_ids(loaded, model_inputs.DEFAULT_N_TOKENS, seed)
    images = model_inputs.sample_images()
    digit = next((im for name, im in images.items() if "digit" in name.lower()), None)
    image = digit if digit is not None and loaded.image_channels == 1 else next(iter(images.values()))
    return {"pixel_values": model_inputs.image_to_pixels(image, loaded)}
