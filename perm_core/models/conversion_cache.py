"""The on-disk cache of models converted from installed wheels (smollm2-135m and gemma3-270m from GGUF, dinov2-s from
ONNX): transformers re-reads a GGUF on every load in minutes, a safetensors directory loads in about a second.

Root: $TRANSFORMER_SYMMETRY_CACHE, else $XDG_CACHE_HOME/transformer-symmetry-explorer, else
~/.cache/transformer-symmetry-explorer; one directory per model, keyed by its source's size and its cache format.
A directory is built in a temporary directory beside it and renamed into place: a reader never sees a half-written
one, and of two processes converting at once, both end with one complete copy.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

COMPLETE = "complete.json"


def cache_root() -> Path:
    explicit = os.environ.get("TRANSFORMER_SYMMETRY_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "transformer-symmetry-explorer"


def is_complete(directory: Path) -> bool:
    return (directory / COMPLETE).is_file() and (directory / "model.safetensors").is_file()


def convert_into(target: Path, build: Callable[[Path, Path], dict]) -> float:
    """Build the directory at target atomically; returns the seconds it took. build(checkpoint, scratch) writes the
    model into checkpoint (a fresh directory) and returns what complete.json records of its source; scratch is a
    directory for anything else (a joined GGUF), deleted with whatever was half-written, however build ends."""
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        checkpoint = scratch / "checkpoint"
        checkpoint.mkdir()
        meta = build(checkpoint, scratch)
        seconds = time.perf_counter() - started
        (checkpoint / COMPLETE).write_text(json.dumps({**meta, "convert_seconds": round(seconds, 1)}, indent=2))
        try:
            os.rename(checkpoint, target)  # atomic on one filesystem
        except OSError:
            if not is_complete(target):  # another process did not win the race: a real error
                raise
        return seconds
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_GGUF_PARSE = threading.Lock()


@contextlib.contextmanager
def gguf_parsed_once():
    """transformers builds a new gguf.GGUFReader, which parses every metadata field (a whole vocabulary among them),
    each time it reads a GGUF file: for the tokenizer, for the config and for the weights. Within this context every
    reader of one file is the first one made; a reader is read-only, so sharing it changes nothing that is read."""
    import gguf

    with _GGUF_PARSE:
        original, readers = gguf.GGUFReader, {}

        def shared_reader(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = original(path, mode)
            return readers[key]

        gguf.GGUFReader = shared_reader
        try:
            yield
        finally:
            gguf.GGUFReader = original


def ensure_converted(target: Path, convert: Callable[[], float]) -> Path:
    """target, converted first unless it is complete (an interrupted or foreign directory is rebuilt)."""
    if not is_complete(target):
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        convert()
    return target


def save_plain(model: torch.nn.Module, directory: Path) -> None:
    """Save a GGUF-loaded model as an ordinary float32 checkpoint.

    save_pretrained refuses models loaded with gguf_file ("not serializable"), although the weights are already
    de-quantized tensors. So the config is saved without its quantization_config (the cache must never try to read
    a GGUF again) and the weights with safetensors directly, a tied LM head once (it is the embedding matrix).
    """
    from safetensors.torch import save_file

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(directory)
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
