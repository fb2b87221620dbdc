"""The streamed scramble: a checkpoint's weights transformed one tensor at a time and written in the same shards,
in the same order, under the same index; every other file of the directory (config, tokenizer) copied beside.

Each parameter is transformed in float64 and rounded once to the written dtype, as cli.scramble.rounded_once does,
so the written tensors equal the whole-model scramble's, each under the name the checkpoint stores it by. Tensors
the class does not own as parameters (buffers a checkpoint may carry) are written as they are.

A parameter that loading assembles from several stored tensors (a mixture of experts' experts, stored one per
expert: stream.fused) is assembled, transformed whole (reordering the experts moves one expert's stored tensors into
another's place) and split back into its stored tensors by transformers' reverse conversion when its first piece is
written; each piece is kept until it is written and dropped then, so at most one fused parameter's pieces wait at a
time where a checkpoint keeps a layer's experts together, as transformers writes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import transform_param
from perm_core.stream.encoder_decoder import streamed_model
from perm_core.stream.fused import stored_pieces
from perm_core.stream.layout import StreamedModel
from perm_core.stream.shards import INDEX, ShardReader, ShardWriter

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")


def stream_scramble(directory, key_by_symmetry: dict[str, int], out, dtype: torch.dtype | None = None,
                    progress=None) -> StreamedModel:
    """Write the scrambled checkpoint to `out`; floating tensors in `dtype` (default: as each is stored).
    Returns the streamed model (its family and class name are the record's)."""
    reader = ShardReader(directory)
    model = streamed_model(directory, torch.float64, reader)  # one stack's stages, or an encoder-decoder's
    scramble = symmetries.build_many(key_by_symmetry, model.geometry)
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    waiting: dict[str, torch.Tensor] = {}  # a fused parameter's transformed pieces not yet written, by stored name

    def transformed(name: str) -> torch.Tensor:
        """The stored tensor `name` (as in reader.order) of the scrambled checkpoint, in float64 if it is floating."""
        fused = reader.fused_into.get(name)
        if fused is not None:
            if name not in waiting:
                whole = transform_param(reader.read(fused, torch.float64), model.claims[fused], scramble)
                waiting.update(stored_pieces(model.model, fused, whole, reader.entries[fused].pieces))
                del whole
            return waiting.pop(name)
        tensor = reader.read(name)
        if name in model.claims and tensor.is_floating_point():
            tensor = transform_param(tensor.to(torch.float64), model.claims[name], scramble)
        return tensor

    for number, file in enumerate(reader.files):
        if progress:
            progress(number / len(reader.files), f"writing {file}")
        names = reader.order[file]

        def written_dtype(name: str) -> torch.dtype:
            stored = reader.stored_entry(name).dtype
            return dtype if dtype is not None and stored.is_floating_point else stored

        layout = [(reader.stored_name(name), written_dtype(name), reader.stored_entry(name).shape) for name in names]
        total += sum(reader.stored_entry(name).numel * written_dtype(name).itemsize for name in names)
        writer = ShardWriter(out / file, layout, reader.metadata[file])
        for name in names:
            tensor = transformed(name)
            writer.write(reader.stored_name(name), tensor.to(written_dtype(name)))
            del tensor
        writer.close()
    if reader.index is not None:
        index = dict(reader.index)
        index["metadata"] = {**(index.get("metadata") or {}), "total_size": total}
        (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for path in reader.directory.iterdir():
        if path.is_file() and path.name not in (INDEX, "key.json") and not path.name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(path, out / path.name)
    if dtype is not None:  # the config names the dtype its weights are stored in
        config = json.loads((out / "config.json").read_text())
        for field in ("dtype", "torch_dtype"):
            if field in config:
                config[field] = str(dtype).removeprefix("torch.")
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if progress:
        progress(1.0, "done")
    return model
