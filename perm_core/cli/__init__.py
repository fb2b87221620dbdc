"""CLI commands: one module each, with register(subparsers) setting `run` as the handler."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from perm_core.models.registry import DTYPES  # noqa: F401  (re-exported for the commands)


class UsageError(Exception):
    """Bad usage or an unusable model: one line on stderr, exit code 2."""


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
INDEX = "model.safetensors.index.json"


def _weight_headers(directory: Path) -> dict[str, dict]:
    """file name -> its safetensors header (tensor name -> {dtype, shape, data_offsets}): the files the index
    names when the checkpoint is sharded, else model.safetensors, else every *.safetensors file."""
    import json
    import struct

    if (directory / INDEX).is_file():
        files = sorted(set(json.loads((directory / INDEX).read_text()).get("weight_map", {}).values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    headers = {}
    for name in files:
        with open(directory / name, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        headers[name] = {k: v for k, v in header.items() if k != "__metadata__"}
    return headers


def local_directory(name: str, revision: str | None = None) -> Path | None:
    """The safetensors directory a name stands for: a local directory, or a Hugging Face checkpoint's snapshot in
    the local cache (downloaded first when online); None for anything else, or a Hub name that does not resolve
    (loading then says why)."""
    from perm_core.models.hub import looks_like_path
    from perm_core.models.hub_checkpoints import is_hub_name, snapshot_dir
    from perm_core.models.record import ModelLoadError

    if is_hub_name(name):
        try:
            return snapshot_dir(name, revision)
        except ModelLoadError:
            return None
    path = Path(name).expanduser()
    return path if looks_like_path(name) and path.is_dir() else None


def stored_dtype(name: str, revision: str | None = None) -> torch.dtype | None:
    """The floating dtype a local or Hub checkpoint's weights are stored in (the coarsest, when they are mixed: its
    rounding is the one the whole checkpoint carries); None for a zoo or random model, made in the dtype asked
    for, or a directory whose headers cannot be read (loading then says why)."""
    directory = local_directory(name, revision)
    if directory is None:
        return None
    try:
        found = {SAFETENSORS_DTYPES[entry["dtype"]] for header in _weight_headers(directory).values()
                 for entry in header.values() if entry.get("dtype") in SAFETENSORS_DTYPES}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return max(found, key=lambda d: torch.finfo(d).eps, default=None)


def largest_shard_bytes(name: str, dtype: torch.dtype, revision: str | None = None) -> int | None:
    """For a sharded local checkpoint, its largest shard's tensor bytes with floating tensors in `dtype`: as
    `max_shard_size`, save_pretrained's greedy split in the same tensor order then cuts the same shards (a limit
    below the original one still fits every original shard, and closes each where the original did). None
    when the checkpoint is not sharded."""
    directory = local_directory(name, revision)
    if directory is None or not (directory / INDEX).is_file():
        return None
    sizes = []
    for header in _weight_headers(directory).values():
        total = 0
        for entry in header.values():
            if entry["dtype"] in SAFETENSORS_DTYPES:
                total += math.prod(entry["shape"]) * dtype.itemsize
            else:
                total += entry["data_offsets"][1] - entry["data_offsets"][0]
        sizes.append(total)
    return max(sizes, default=None)


def key_or_usage_error(text) -> int:
    """A validated key, or UsageError with the key's own one-line message."""
    from perm_core.engine.keys import InvalidKeyError, validate_key

    try:
        return validate_key(text)
    except InvalidKeyError as error:
        raise UsageError(str(error)) from None


def load_or_usage_error(name: str, dtype: torch.dtype = torch.float32, revision: str | None = None,
                        device: str | None = None):
    """A model by any name load_model takes (at a Hub revision, moved to a device), or UsageError with the loader's
    one-line reason (unknown, offline, unsupported, a device this machine lacks)."""
    from perm_core.families import UnsupportedModelError, family_of
    from perm_core.models.registry import ModelLoadError, load_model
    from perm_core.run.progress import terminal_bar

    device_or_usage_error(device)  # before a load that may take minutes
    try:
        with terminal_bar(f"load {name}") as progress:  # a first conversion takes minutes
            loaded = load_model(name, dtype=dtype, progress=progress, revision=revision, device=device)
        family_of(loaded.model)
    except (ModelLoadError, UnsupportedModelError, OSError, ValueError) as error:
        raise UsageError(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
    return loaded


def add_model_options(parser, revisions=("--revision",)) -> None:
    """--revision (one per model the command takes) and --device, as every command that loads a model has them."""
    for flag in revisions:
        parser.add_argument(flag, metavar="REV", help="branch, tag or commit of a Hugging Face checkpoint (org/name); "
                                                      "default main, resolved from the local cache first")
    parser.add_argument("--device", metavar="DEVICE", help="cpu, cuda (cuda:N) or mps: where the model and its "
                                                           "inputs run (default: cpu)")


def host_only_when_streaming(device: str | None, command: str, whole: str) -> None:
    """UsageError for a device other than the CPU with --stream: the streamed paths read the shards into host memory.
    `command` is what the line calls the streamed run; `whole`, how to run the whole model instead."""
    if device is not None and device != "cpu":
        raise UsageError(f"--device {device}: {command} runs on the CPU only (its shards are read into host memory); "
                         f"drop --device, or {whole} without --stream")


def device_or_usage_error(device: str | None) -> None:
    """A device this machine has, or UsageError with why not (None: the default, the CPU)."""
    from perm_core.run.devices import DeviceError, resolve_device

    if device is not None:
        try:
            resolve_device(device)
        except DeviceError as error:
            raise UsageError(f"--device {device}: {error}") from None


def versioned(document: dict) -> dict:
    """A document as the CLI prints it: its schema_version first (perm_core.schemas), then its fields."""
    from perm_core.schemas import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, **document}


def print_json(value) -> None:
    """Strict JSON on stdout: non-finite numbers are written as the strings "nan", "inf", "-inf"."""
    import json

    from perm_core.verify.tolerances import json_safe

    print(json.dumps(json_safe(value), indent=2, allow_nan=False))
