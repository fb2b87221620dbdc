"""Hub checkpoints and local save_pretrained directories.

Hub models never download when HF_HUB_OFFLINE is set: they load from the local HF cache or
fail at once with a ModelLoadError naming the models that do work offline. Checkpoints
load as safetensors only, and trust_remote_code is never passed, so loading a model never
runs code from the model's repository.

Parameter counts come from configs written here (the published architectures) and an
instantiation on the meta device, so list_models() knows them without any download.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from perm_core import zoo


@dataclass(frozen=True)
class HubModel:
    family: str
    task: str
    auto_class: str  # transformers Auto* class that loads the checkpoint
    license: str
    description: str
    config: dict  # model_type + the published architecture, for the offline parameter count


_VIT_BASE = dict(model_type="vit", num_labels=1000)
_SMOLLM2 = dict(
    model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, tie_word_embeddings=True,
)  # fmt: skip

HUB_MODELS: dict[str, HubModel] = {
    "google/vit-base-patch16-224": HubModel(
        "vit", "image-classification", "AutoModelForImageClassification", "Apache-2.0",
        "ViT-B/16, ImageNet-21k pre-trained, ImageNet-1k fine-tuned, 224x224", _VIT_BASE,
    ),
    "facebook/deit-tiny-patch16-224": HubModel(
        "vit", "image-classification", "AutoModelForImageClassification", "Apache-2.0",
        "DeiT-tiny (a ViT with d=192, 3 heads), ImageNet-1k, 224x224",
        dict(model_type="vit", hidden_size=192, num_attention_heads=3, intermediate_size=768,
             num_labels=1000),
    ),
    "bert-base-uncased": HubModel(
        "bert", "masked-lm", "AutoModelForMaskedLM", "Apache-2.0",
        "BERT-base uncased, masked language model", dict(model_type="bert"),
    ),
    "gpt2": HubModel(
        "gpt2", "causal-lm", "AutoModelForCausalLM", "MIT", "GPT-2 small (124M)", dict(model_type="gpt2"),
    ),
    "distilgpt2": HubModel(
        "gpt2", "causal-lm", "AutoModelForCausalLM", "MIT", "DistilGPT2, 6 layers",
        dict(model_type="gpt2", n_layer=6),
    ),
    "HuggingFaceTB/SmolLM2-135M": HubModel(
        "llama", "causal-lm", "AutoModelForCausalLM", "Apache-2.0",
        "SmolLM2-135M base model (Llama architecture, grouped-query attention)", _SMOLLM2,
    ),
}  # fmt: skip


def hub_offline() -> bool:
    from huggingface_hub import constants

    flagged = bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    return flagged or not hub_reachable()


@functools.cache
def hub_reachable(timeout_s: float = 2.0) -> bool:
    """One quick TCP connect instead of the hub client's minute of retries on a closed network."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def is_cached(repo_id: str) -> bool:
    """Whether config and safetensors weights of repo_id are in the local HF cache."""
    from huggingface_hub import try_to_load_from_cache

    def present(filename: str) -> bool:
        return isinstance(try_to_load_from_cache(repo_id, filename), str)

    return present("config.json") and (
        present("model.safetensors") or present("model.safetensors.index.json")
    )


@functools.cache
def hub_param_count(name: str) -> int | None:
    from transformers import AutoConfig

    spec = dict(HUB_MODELS[name].config)
    try:
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        return zoo.meta_param_count(config, HUB_MODELS[name].auto_class)
    except Exception:  # noqa: BLE001 - a count is nice to have, never worth failing list_models()
        return None


def hub_info(name: str) -> zoo.ModelInfo:
    entry = HUB_MODELS[name]
    return zoo.ModelInfo(
        name=name,
        family=entry.family,
        task=entry.task,
        source="hub",
        n_params=hub_param_count(name),
        offline=is_cached(name),
        license=entry.license,
        description=entry.description,
    )


def _offline_error(name: str) -> zoo.ModelLoadError:
    names = ", ".join(zoo.offline_model_names())
    return zoo.ModelLoadError(
        f"{name} is a Hub model and this machine is offline (not in the local cache); "
        f"models that work offline: {names}."
    )


def load_hub(info: zoo.ModelInfo, dtype: torch.dtype) -> zoo.LoadedModel:
    import transformers

    entry = HUB_MODELS[info.name]
    auto = getattr(transformers, entry.auto_class)
    kwargs = dict(attn_implementation="eager", dtype=dtype, use_safetensors=True, trust_remote_code=False)
    # The cache first: it never touches the network, and offline it is the only option.
    try:
        model = auto.from_pretrained(info.name, local_files_only=True, **kwargs)
        local_only = True
    except OSError as error:
        if hub_offline():
            raise _offline_error(info.name) from error
        try:
            model = auto.from_pretrained(info.name, **kwargs)
        except OSError as download_error:
            raise zoo.ModelLoadError(
                f"Could not download {info.name}: {download_error}".splitlines()[0]
            ) from None
        local_only = False
    return _wrap(info, zoo.finish(model, dtype), info.name, local_only)


def _wrap(
    info: zoo.ModelInfo, model: torch.nn.Module, source: str | Path, local_only: bool
) -> zoo.LoadedModel:
    """Attach tokenizer or image processor, whichever the checkpoint has."""
    from transformers import AutoImageProcessor, AutoTokenizer

    config = model.config
    tokenizer = image_processor = None
    image_size = image_channels = labels = None
    if info.family == "vit":
        image_size, image_channels = config.image_size, config.num_channels
        try:
            image_processor = AutoImageProcessor.from_pretrained(source, local_files_only=local_only)
        except Exception:  # noqa: BLE001 - missing or unusable: fall back, never fail the model
            image_processor = None  # inputs.image_to_pixels falls back to 0.5/0.5 normalization
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        except (OSError, ValueError) as error:
            raise zoo.ModelLoadError(f"{info.name}: no usable tokenizer ({error})".splitlines()[0]) from None
    if info.task == "image-classification":
        labels = [config.id2label[i] for i in range(config.num_labels)]
    return zoo.LoadedModel(info, model, tokenizer, image_size, image_channels, labels, image_processor)


# --- local dirs ---

_FAMILY_OF_MODEL_TYPE = {"vit": "vit", "bert": "bert", "gpt2": "gpt2", "llama": "llama"}
_AUTO_FOR_TASK = {
    "image-classification": "AutoModelForImageClassification",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "feature-extraction": "AutoModel",
}


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name or Path(name).expanduser().is_dir()


def _task_from_architectures(architectures: list[str]) -> str:
    arch = architectures[0] if architectures else ""
    if arch.endswith("ForImageClassification"):
        return "image-classification"
    if arch.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal-lm"
    if arch.endswith("ForMaskedLM"):
        return "masked-lm"
    return "feature-extraction"


def load_local_dir(path_text: str, dtype: torch.dtype) -> zoo.LoadedModel:
    """A directory written by save_pretrained: config.json + *.safetensors (pickles refused)."""
    import json

    import transformers

    path = Path(path_text).expanduser()
    if not path.is_dir():
        raise zoo.ModelLoadError(f"No such model directory: {path}")
    if not (path / "config.json").is_file():
        raise zoo.ModelLoadError(
            f"{path} has no config.json; expected a directory written by save_pretrained."
        )
    if not any(path.glob("*.safetensors")):
        pickles = sorted(
            p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")
        )
        if pickles:
            raise zoo.ModelLoadError(
                f"{path} holds only pickle weights ({', '.join(pickles)}), which can run code when loaded; "
                "re-save it with save_pretrained(safe_serialization=True)."
            )
        raise zoo.ModelLoadError(f"{path} has no .safetensors weights.")
    config = json.loads((path / "config.json").read_text())
    model_type = config.get("model_type", "?")
    family = _FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None:
        raise zoo.ModelLoadError(
            f"{path}: model_type {model_type!r} is not supported; "
            f"supported: {', '.join(_FAMILY_OF_MODEL_TYPE)}."
        )
    task = _task_from_architectures(config.get("architectures") or [])
    auto = getattr(transformers, _AUTO_FOR_TASK[task])
    model = auto.from_pretrained(
        path, attn_implementation="eager", dtype=dtype, use_safetensors=True, trust_remote_code=False,
        local_files_only=True,
    )  # fmt: skip
    model = zoo.finish(model, dtype)
    info = zoo.ModelInfo(
        name=str(path),
        family=family,
        task=task,
        source="local",
        n_params=sum(p.numel() for p in model.parameters()),
        offline=True,
        license="unknown (local directory)",
        description=f"{type(model).__name__} loaded from {path}",
    )
    return _wrap(info, model, path, local_only=True)
