"""Any Hugging Face checkpoint by its name (org/name, at a revision if asked), loaded as the directory it resolves to.

Resolution is huggingface_hub's own (snapshot_download): the local cache's refs/<revision> and snapshots/<commit>
first, which needs no network and is the only option offline (HF_HUB_OFFLINE, or no route to the Hub). Online, a
checkpoint not complete in the cache is downloaded in two steps: its config, tokenizer and image-processor files,
then exactly the safetensors files its index names (else model.safetensors). Nothing else is fetched: never code
(trust_remote_code stays False) and never pickle weights (.bin, .pt), which can run code when loaded.

The snapshot directory then loads as any save_pretrained directory (models.hub.load_local_dir): as the class its
config.json names, refused unless its family's spec claims every parameter. hub.HUB_MODELS are suggestions the
zoo lists with what they are; any other org/name resolves the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path

import torch

from perm_core.models import hub
from perm_core.models.record import LoadedModel, ModelLoadError

INDEX = "model.safetensors.index.json"
# What a checkpoint needs besides its weights: config, tokenizer, image processor. Named one by one: a pattern such
# as *.json would also match files in the repository's sub-folders (ONNX exports, other frameworks).
METADATA_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                  "added_tokens.json", "merges.txt", "preprocessor_config.json", INDEX, *hub.TOKENIZER_FILES)
# owner/name as the Hub spells a model repository; "--" and ".." are not allowed in one.
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def is_hub_name(name: str) -> bool:
    """A name to resolve on the Hub: a listed suggestion, or owner/name that is not a local directory."""
    if name in hub.HUB_MODELS:
        return True
    return (REPO_ID.fullmatch(name) is not None and "--" not in name and ".." not in name
            and not Path(name).expanduser().is_dir())


def weight_files(directory: Path) -> list[str]:
    """The safetensors files a checkpoint directory loads from: those its index names, else model.safetensors."""
    index = directory / INDEX
    if index.is_file():
        try:
            return sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError):
            return []  # an unreadable index: loading says why
    return ["model.safetensors"]


def complete(directory: Path) -> bool:
    files = weight_files(directory)
    return (directory / "config.json").is_file() and bool(files) and all((directory / f).is_file() for f in files)


def snapshot_dir(name: str, revision: str | None = None) -> Path:
    """The cached snapshot directory of `name` at `revision` (default: main), downloaded first when online and not
    complete in the cache. Raises ModelLoadError (OfflineHubError offline) with one line."""
    from huggingface_hub import constants

    found = _resolved(name, revision, constants.HF_HUB_CACHE)
    if isinstance(found, ModelLoadError):
        raise found
    return found


@functools.cache
def _resolved(name: str, revision: str | None, cache: str) -> Path | ModelLoadError:
    """Cached, failures too: a command asks several times (stored dtype, streaming, loading) and resolves once."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    at = f" at revision {revision}" if revision else ""
    try:
        cached = Path(snapshot_download(name, revision=revision, local_files_only=True, cache_dir=cache,
                                        allow_patterns=["config.json"]))
    except LocalEntryNotFoundError:
        cached = None
    except ValueError as error:  # huggingface_hub's HFValidationError: not a repository name it accepts
        return ModelLoadError(f"{name} is not a Hugging Face model name: {_first_line(error)}")
    offline = hub.hub_offline()
    if cached is not None and (offline or complete(cached)):
        return cached
    if offline:
        return hub.OfflineHubError(
            f"{name}{at} is neither a local directory nor in the local Hugging Face cache ({cache}), and this "
            "machine is offline")
    try:
        directory = Path(snapshot_download(name, revision=revision, cache_dir=cache,
                                           allow_patterns=list(METADATA_FILES)))
        if not (directory / "config.json").is_file():
            return ModelLoadError(f"{name}{at} has no config.json: not a transformers checkpoint")
        snapshot_download(name, revision=directory.name, cache_dir=cache, allow_patterns=weight_files(directory))
    except Exception as error:  # noqa: BLE001 - not found, gated, no network, disk full: one readable line
        return ModelLoadError(f"{name} is no local directory, and downloading it{at} failed: {_first_line(error)}")
    if not complete(directory):
        return ModelLoadError(f"{name}{at} has no safetensors weights ({', '.join(weight_files(directory))}); pickle "
                              "weights (.bin, .pt) are never downloaded: they can run code when loaded")
    return directory


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_hub_checkpoint(name: str, dtype: torch.dtype, revision: str | None = None) -> LoadedModel:
    """The checkpoint `name` at `revision`, loaded from its snapshot directory (module docstring)."""
    directory = snapshot_dir(name, revision)
    loaded = hub.load_local_dir(str(directory), dtype, name=name)
    listed = hub.HUB_MODELS.get(name)
    description = listed.description if listed else f"{type(loaded.model).__name__} from the Hugging Face Hub"
    loaded.info = dataclasses.replace(
        loaded.info, name=name, source="hub", license=listed.license if listed else "see the model card of " + name,
        description=f"{description} (commit {directory.name[:12]})")
    return loaded
