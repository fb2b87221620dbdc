"""Hub checkpoints and local save_pretrained directories.

A Hub name resolves to a directory of the local HF cache (perm_core.models.hub_checkpoints), which loads as any
local directory here. Hub models never download when HF_HUB_OFFLINE is set: they load from the local HF cache or
fail at once with a ModelLoadError naming the models that do work offline. Checkpoints load as safetensors only,
and trust_remote_code is never passed, so loading a model never runs code from the model's repository.

Parameter counts come from configs written here (the published architectures) and an
instantiation on the meta device, so list_models() knows them without any download.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from perm_core.models import record as model_record


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
        return model_record.meta_param_count(config, HUB_MODELS[name].auto_class)
    except Exception:  # noqa: BLE001 - a count is nice to have, never worth failing list_models()
        return None


def hub_info(name: str) -> model_record.ModelInfo:
    entry = HUB_MODELS[name]
    return model_record.ModelInfo(
        name=name,
        family=entry.family,
        task=entry.task,
        source="hub",
        n_params=hub_param_count(name),
        offline=is_cached(name),
        license=entry.license,
        description=entry.description,
    )


class OfflineHubError(model_record.ModelLoadError):
    """A Hub model this offline machine does not have; the zoo adds the models that work offline."""


def _wrap(
    info: model_record.ModelInfo, model: torch.nn.Module, source: str | Path, local_only: bool
) -> model_record.LoadedModel:
    """Attach tokenizer or image processor, whichever the checkpoint has.

    A text model without a usable tokenizer (a weights-only directory) loads with tokenizer=None:
    its inputs are then token ids drawn from the vocabulary (perm_core.models.inputs).
    """
    from transformers import AutoImageProcessor

    config = model.config
    tokenizer = image_processor = None
    image_size = image_channels = labels = None
    if _takes_images(info, model):
        image_size, image_channels = config.image_size, config.num_channels
        try:
            image_processor = AutoImageProcessor.from_pretrained(source, local_files_only=local_only)
        except Exception:  # noqa: BLE001 - missing or unusable: fall back, never fail the model
            image_processor = None  # inputs.image_to_pixels falls back to 0.5/0.5 normalization
    else:
        tokenizer = usable_tokenizer(source, local_only)
        vocabulary = getattr(config, "vocab_size", None)
        if tokenizer is not None and vocabulary and len(tokenizer) > vocabulary:  # ids past the embedding table
            raise model_record.ModelLoadError(
                f"{info.name}: its tokenizer has {len(tokenizer)} tokens but the model's vocabulary holds "
                f"{vocabulary}: they do not belong together (save the model's own tokenizer files beside it, or "
                "none to run on token ids)")
    if info.task in ("image-classification", "text-classification", "token-classification"):
        labels = [config.id2label[i] for i in range(config.num_labels)]
    return model_record.LoadedModel(info, model, tokenizer, image_size, image_channels, labels, image_processor)


def _takes_images(info: model_record.ModelInfo, model: torch.nn.Module) -> bool:
    from perm_core.families import UnsupportedModelError, family_by_name

    try:
        return family_by_name(info.family).geometry(model.config).input_kind == "image"
    except (UnsupportedModelError, AttributeError):
        return info.family == "vit"


# Files that carry a vocabulary; without one, AutoTokenizer builds an empty (GPT-2: no ids at all) or a
# five-token (BERT: everything [UNK]) tokenizer from the config alone.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
_PROBE_TEXT = "The quick brown fox jumps over the lazy dog."


def usable_tokenizer(source: str | Path, local_only: bool = True):
    """The checkpoint's tokenizer, or None when it has none that turns a plain sentence into ids."""
    from transformers import AutoTokenizer

    if isinstance(source, Path) and not any((source / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        ids = tokenizer(_PROBE_TEXT, verbose=False)["input_ids"]
    except Exception:  # noqa: BLE001 - any tokenizer failure means: run on token ids instead
        return None
    special = set(tokenizer.all_special_ids)  # [UNK] among them: a vocabulary-less tokenizer gives only these
    return tokenizer if any(i not in special for i in ids) else None


# --- local dirs ---

_AUTO_FOR_TASK = {
    "image-classification": "AutoModelForImageClassification",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "pretraining": "AutoModelForPreTraining",
    "next-sentence-prediction": "AutoModelForNextSentencePrediction",
    "feature-extraction": "AutoModel",
}


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name or Path(name).expanduser().is_dir()


# The end of an architecture's class name -> its task (the first that matches; DeiT's teacher classifier is an
# image classifier too).
_TASK_OF_SUFFIX = (
    (("ForImageClassification", "ForImageClassificationWithTeacher"), "image-classification"),
    (("ForCausalLM", "LMHeadModel"), "causal-lm"),
    (("ForMaskedLM",), "masked-lm"),
    (("ForSequenceClassification",), "text-classification"),
    (("ForTokenClassification",), "token-classification"),
    (("ForQuestionAnswering",), "question-answering"),
    (("ForMultipleChoice",), "multiple-choice"),
    (("ForConditionalGeneration",), "text2text-generation"),
    (("ForPreTraining",), "pretraining"),
    (("ForNextSentencePrediction",), "next-sentence-prediction"),
)


def _task_from_architectures(architectures: list[str]) -> str:
    arch = architectures[0] if architectures else ""
    arch = arch if isinstance(arch, str) else ""
    for suffixes, task in _TASK_OF_SUFFIX:
        if arch.endswith(suffixes):
            return task
    return "feature-extraction"


def _family_of_model_type(model_type: str):
    from perm_core.families import _registry

    for family in _registry().values():
        if model_type in family.model_types:
            return family
    return None


def _architecture_class(path: str | Path, config: dict, family, task: str):
    """The transformers class named by config.architectures (the class save_pretrained wrote).

    Only classes of the installed transformers package are used (never remote code); a directory
    without `architectures` loads with the Auto class of its task.
    """
    import transformers

    architectures = config.get("architectures") or []
    if not architectures:
        return getattr(transformers, _AUTO_FOR_TASK[task])
    name = architectures[0]
    cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise model_record.ModelLoadError(
            f"{path}: architecture {name!r} is not a class of the installed transformers "
            "(custom code is never run here)."
        )
    model_type = getattr(cls.config_class, "model_type", None)
    if model_type not in family.model_types:
        raise model_record.ModelLoadError(
            f"{path}: architecture {name} is a {model_type!r} class, but config.json says model_type "
            f"{config.get('model_type')!r}."
        )
    return cls


def refuse_unclaimed(model: torch.nn.Module, family, where: str) -> None:
    """Refuse a model the family's spec cannot fully describe, naming what it does not claim."""
    class_name = type(model).__name__
    spec = family.spec(model.config)
    unclaimed = spec.unclaimed(name for name, _ in model.named_parameters())
    if unclaimed:
        shown = ", ".join(unclaimed[:6]) + (f" and {len(unclaimed) - 6} more" if len(unclaimed) > 6 else "")
        raise model_record.ModelLoadError(
            f"{where}: {class_name} has {len(unclaimed)} parameter(s) the {family.name} symmetry spec does not "
            f"claim ({shown}); refusing to guess how they transform. Supported {family.name} classes: "
            f"{', '.join(family.classes)}."
        )
    if class_name not in family.classes:
        raise model_record.ModelLoadError(
            f"{where}: {class_name} is not a supported {family.name} class; supported: {', '.join(family.classes)}."
        )


@contextlib.contextmanager
def _quiet_loading():
    """No "Loading weights" bar on stderr: a refused model then costs the CLI exactly one line there."""
    from transformers.utils import logging as hf_logging

    active = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if active:
            hf_logging.enable_progress_bar()


def load_local_dir(path_text: str, dtype: torch.dtype, name: str | None = None) -> model_record.LoadedModel:
    """A directory written by save_pretrained: config.json + *.safetensors (pickles refused).

    The model is loaded as the class recorded in config.json (a BertForSequenceClassification keeps
    its classifier), and refused unless the family's spec claims every one of its parameters.
    name: what messages call it (a Hub name for a cache snapshot), else its path.
    """
    import json

    path = Path(path_text).expanduser()
    if not path.is_dir():
        raise model_record.ModelLoadError(f"No such model directory: {path}")
    where = name or str(path)
    if not (path / "config.json").is_file():
        raise model_record.ModelLoadError(
            f"{where} has no config.json; expected a directory written by save_pretrained."
        )
    if not any(path.glob("*.safetensors")):
        pickles = sorted(
            p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")
        )
        if pickles:
            raise model_record.ModelLoadError(
                f"{where} holds only pickle weights ({', '.join(pickles)}), which can run code when loaded; "
                "re-save it with save_pretrained(safe_serialization=True)."
            )
        raise model_record.ModelLoadError(f"{where} has no .safetensors weights.")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise model_record.ModelLoadError(f"{where}/config.json is not readable JSON ({error}).") from None
    if not isinstance(config, dict):
        raise model_record.ModelLoadError(f"{where}/config.json is not a JSON object.")
    model_type = config.get("model_type", "?")
    family = _family_of_model_type(model_type)
    architectures = config.get("architectures") or []
    if family is None:
        from perm_core.families import _registry

        named = architectures[0] if architectures and isinstance(architectures[0], str) else ""
        reason = next((f.refusal(named) for f in _registry().values() if f.refusal(named)), None)
        if reason:  # a class a family knows and refuses (Gemma 3's multimodal model): say why
            raise model_record.ModelLoadError(f"{where}: {named} is not supported: {reason}.")
        supported = sorted({t for f in _registry().values() for t in f.model_types})
        raise model_record.ModelLoadError(
            f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(supported)}."
        )
    task = _task_from_architectures(architectures)
    cls = _architecture_class(where, config, family, task)
    if family.refusal(cls.__name__):  # known and refused: the reason, not the parameters it leaves unclaimed
        raise model_record.ModelLoadError(f"{where}: {cls.__name__} is not supported: {family.refusal(cls.__name__)}.")
    with _quiet_loading():
        model = cls.from_pretrained(
            path, attn_implementation="eager", dtype=dtype, use_safetensors=True, trust_remote_code=False,
            local_files_only=True,
        )  # fmt: skip
    refuse_unclaimed(model, family, where)
    model = model_record.finish(model, dtype)
    info = model_record.ModelInfo(
        name=str(path),
        family=family.name,
        task=task,
        source="local",
        n_params=sum(p.numel() for p in model.parameters()),
        offline=True,
        license="unknown (local directory)",
        description=f"{type(model).__name__} loaded from {path}",
    )
    loaded = _wrap(info, model, path, local_only=True)
    if loaded.tokenizer is None and loaded.image_size is None:
        loaded.info = dataclasses.replace(
            info, description=info.description + " (no tokenizer: inputs are token ids drawn from its vocabulary)"
        )
    return loaded
