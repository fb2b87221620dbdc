"""Opt-in proof that no session mutated a shared model: its weights' hash at load and at server exit.

    TSE_WEIGHTS_HASH_FILE=/tmp/hashes.json streamlit run app.py

With the variable set, every model that ui.runtime.models.shared_model loads is hashed right after loading, and
again when the process exits (Streamlit stops on SIGTERM or Ctrl-C, then Python runs its exit handlers). The
file maps "name/dtype" to {"loaded": sha256, "at_exit": sha256}; it is rewritten after each load, so a crash
still leaves the load hashes. No page, widget or route is added, so visitors cannot reach it. The audit keeps a
reference to each model it hashed (a model evicted from the cache stays alive until exit); unset, nothing is
hashed, kept or written. benchmarks/classroom.py also hashes the same models in a fresh process.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import threading

import torch

from ui.runtime import settings

VARIABLE = "TSE_WEIGHTS_HASH_FILE"
_lock = threading.Lock()
_models: dict[str, torch.nn.Module] = {}
_loaded_hashes: dict[str, str] = {}


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer: name, dtype, shape and raw bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict(keep_vars=False).items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def enabled() -> bool:
    return settings.current().weights_hash_file is not None


def track(name: str, dtype_name: str, model: torch.nn.Module) -> None:
    """Hash a freshly loaded shared model (no-op unless TSE_WEIGHTS_HASH_FILE is set)."""
    if not enabled():
        return
    label = f"{name}/{dtype_name}"
    loaded_hash = weights_hash(model)
    with _lock:
        if not _models:
            atexit.register(write, at_exit=True)
        _models[label] = model
        _loaded_hashes.setdefault(label, loaded_hash)  # a reload after eviction must match the first load
        if _loaded_hashes[label] != loaded_hash:
            _loaded_hashes[label + " (reloaded)"] = loaded_hash
    write(at_exit=False)


def write(at_exit: bool) -> None:
    with _lock:
        table = {label: {"loaded": loaded_hash} for label, loaded_hash in _loaded_hashes.items()}
        if at_exit:
            for label, model in _models.items():
                table[label]["at_exit"] = weights_hash(model)
        target = settings.current().weights_hash_file
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(table, indent=2, sort_keys=True))
        partial.replace(target)
