"""A model saved, then scrambled by the CLI with every weight symmetry: what the plain-transformers oracles reload."""

from __future__ import annotations

from pathlib import Path

from perm_core.__main__ import main
from perm_core.engine.symmetries import WEIGHT_SYMMETRIES
from tests.unit.json_schema import validated


def save_and_scramble(model, directory: Path, key: int = 5, symmetries=WEIGHT_SYMMETRIES) -> dict:
    """Writes directory/original and directory/scrambled (float64); returns the scramble's key record."""
    model.save_pretrained(directory / "original", safe_serialization=True)
    argv = ["scramble", str(directory / "original"), "--key", str(key), "--dtype", "float64", "--out",
            str(directory / "scrambled")]
    for name in symmetries:
        argv += ["--symmetry", name]
    assert main(argv) == 0
    return validated("scramble_keys", directory / "scrambled" / "key.json")


def reloaded_in_transformers(directory: Path):
    """directory/original and directory/scrambled as plain transformers loads them (float64, eager attention and
    experts: the stock grouped_mm refuses float64)."""
    import torch
    import transformers

    def stock(path):
        return transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float64, experts_implementation="eager", attn_implementation="eager").eval()

    return stock(directory / "original"), stock(directory / "scrambled")
