"""Safetensors checkpoints read and written one tensor at a time: never a whole shard in memory.

The reader parses each shard's header (tensor name -> dtype, shape, byte range) and reads a tensor, or a few of
its rows, with plain positioned reads into a fresh tensor. It does not map the files: mapped pages a read has
touched count in the process's resident memory until the map is closed, and the streamed check's memory bound
is about tensors, not about which pages of a 4 GB shard were last read. The writer lays out a file's header from
the names, dtypes and shapes first, then appends each tensor as it is made.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                "BOOL": torch.bool}
SAFETENSORS_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be streamed: its one-line message says what is wrong."""


@dataclass(frozen=True)
class Entry:
    file: str  # the shard holding the tensor, relative to the checkpoint directory
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the tensor's data in its file
    stop: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Fused:
    """A parameter that loading assembles from several stored tensors (stream.fused: a mixture of experts' experts,
    stored one tensor per expert): read as its pieces, assembled as transformers assembles them."""

    pieces: tuple[str, ...]  # the stored tensors' names, in the order they are assembled
    dtype: torch.dtype
    shape: tuple[int, ...]
    assemble: Callable[[Callable[[str], torch.Tensor]], torch.Tensor]  # (read a piece by name) -> the parameter
    file = None  # in no one file

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[dict[str, dict], dict, int]:
    """(tensor name -> header entry, the file's __metadata__, where the data begins)."""
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except FileNotFoundError:
        raise CheckpointError(f"missing shard {path.name} in {path.parent}") from None
    except (OSError, struct.error, ValueError) as error:
        raise CheckpointError(f"{path} is not a readable safetensors file ({error})") from None
    metadata = header.pop("__metadata__", None) or {}
    return header, metadata, 8 + length


class ShardReader:
    """A checkpoint directory's tensors by name (the index file's weight map when sharded, else model.safetensors),
    each read from disk when asked for."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory).expanduser()
        index_path = self.directory / INDEX
        if index_path.is_file():
            try:
                self.index = json.loads(index_path.read_text())
                weight_map = self.index["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index_path} is not a readable index ({error})") from None
            self.files = sorted(set(weight_map.values()))
        elif (self.directory / SINGLE).is_file():
            self.index, weight_map, self.files = None, None, [SINGLE]
        else:
            raise CheckpointError(f"{self.directory} has neither {INDEX} nor {SINGLE}")
        self.entries: dict[str, Entry] = {}
        self.metadata: dict[str, dict] = {}
        self.order: dict[str, list[str]] = {}  # file -> its tensor names in the order of their bytes
        self.stored: dict[str, str] = {}  # a renamed tensor's name (rename) -> its name in the checkpoint
        self.pieces: dict[str, Entry] = {}  # a fused parameter's stored pieces (fuse), out of `entries`
        self.fused_into: dict[str, str] = {}  # a stored piece -> the fused parameter it is part of
        for file in self.files:
            header, metadata, data_start = read_header(self.directory / file)
            self.metadata[file] = metadata
            for name, entry in header.items():
                if entry.get("dtype") not in TORCH_DTYPES:
                    raise CheckpointError(f"{file}: tensor {name} has dtype {entry.get('dtype')!r}, not one of "
                                          f"{', '.join(TORCH_DTYPES)}")
                start, stop = entry["data_offsets"]
                self.entries[name] = Entry(file, TORCH_DTYPES[entry["dtype"]], tuple(entry["shape"]),
                                           data_start + start, data_start + stop)
            self.order[file] = sorted(header, key=lambda n: self.entries[n].start)
        if weight_map is not None:
            wrong = [name for name, file in weight_map.items() if self.entries.get(name, None) is None
                     or self.entries[name].file != file]
            if wrong:
                raise CheckpointError(f"{INDEX} names {wrong[0]} in {weight_map[wrong[0]]}, which does not hold it"
                                      + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""))

    def rename(self, mapping: dict[str, str]) -> None:
        """Each tensor under its new name from now on (mapping: its name in the checkpoint -> the new one; a name
        not in it is kept); stored_name gives the checkpoint's back."""
        renamed = {mapping.get(name, name): name for name in self.entries}
        if len(renamed) != len(self.entries):
            raise CheckpointError(f"{self.directory}: two tensors would be renamed to the same name")
        self.stored = {new: old for new, old in renamed.items() if new != old}
        self.entries = {new: self.entries[old] for new, old in renamed.items()}
        self.order = {file: [mapping.get(name, name) for name in names] for file, names in self.order.items()}

    def fuse(self, fused: dict[str, Fused]) -> None:
        """Each fused parameter under its name from now on, its stored pieces no longer tensors of their own (they
        keep their place in `order`, as the scramble writes them)."""
        for name, entry in fused.items():
            for piece in entry.pieces:
                self.pieces[piece] = self.entries.pop(piece)
                self.fused_into[piece] = name
            self.entries[name] = entry

    def stored_entry(self, name: str) -> Entry:
        """A tensor as the checkpoint stores it, a fused parameter's piece included (names as in `order`)."""
        return self.pieces[name] if name in self.pieces else self.entries[name]

    def stored_name(self, name: str) -> str:
        return self.stored.get(name, name)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return list(self.entries)

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole tensor, in `dtype` (a floating tensor; others keep theirs) or as stored."""
        entry = self._entry(name)
        if isinstance(entry, Fused):
            return _cast(entry.assemble(self._read_stored), dtype)
        return _cast(self._read_stored(name), dtype)

    def _read_stored(self, name: str) -> torch.Tensor:
        entry = self.pieces.get(name) or self._entry(name)
        tensor = torch.empty(entry.shape, dtype=entry.dtype)
        self._read_into(entry, entry.start, tensor)
        return tensor

    def rows(self, name: str, indices: list[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """The rows `indices` of a tensor (its first axis), read one by one: an embedding table's looked-up rows."""
        entry = self._stored_entry(name)
        row_bytes = math.prod(entry.shape[1:]) * entry.dtype.itemsize
        tensor = torch.empty((len(indices), *entry.shape[1:]), dtype=entry.dtype)
        with open(self.directory / entry.file, "rb") as handle:
            for i, row in enumerate(indices):
                if not 0 <= row < entry.shape[0]:
                    raise CheckpointError(f"row {row} of {name} is outside its {entry.shape[0]} rows")
                _read_at(handle, entry.start + row * row_bytes, tensor[i], entry.file)
        return _cast(tensor, dtype)

    def row_range(self, name: str, start: int, stop: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rows start..stop-1 of a tensor in one read: a chunk of an output head's vocabulary."""
        entry = self._stored_entry(name)
        row_bytes = math.prod(entry.shape[1:]) * entry.dtype.itemsize
        tensor = torch.empty((stop - start, *entry.shape[1:]), dtype=entry.dtype)
        self._read_into(entry, entry.start + start * row_bytes, tensor)
        return _cast(tensor, dtype)

    def _entry(self, name: str) -> Entry | Fused:
        if name not in self.entries:
            raise CheckpointError(f"{self.directory} has no tensor {name}")
        return self.entries[name]

    def _stored_entry(self, name: str) -> Entry:
        """A tensor stored as one (rows are read from one): a fused parameter is not."""
        entry = self._entry(name)
        if isinstance(entry, Fused):
            raise CheckpointError(f"{name} is assembled from {len(entry.pieces)} stored tensors: read it whole")
        return entry

    def _read_into(self, entry: Entry, offset: int, tensor: torch.Tensor) -> None:
        with open(self.directory / entry.file, "rb") as handle:
            _read_at(handle, offset, tensor, entry.file)


class ReplacedReader:
    """A checkpoint's reader with some tensors given other values (`replaced`, by name, whole; the rest read from
    the shards): a control's rerun on a copy with some tensors randomized (verify.controls.explained_unbroken)."""

    def __init__(self, reader: ShardReader, replaced: dict[str, torch.Tensor]):
        self._reader, self.replaced = reader, replaced

    def __getattr__(self, name: str):
        return getattr(self._reader, name)

    def read(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        return _cast(self.replaced[name].clone(), dtype) if name in self.replaced else self._reader.read(name, dtype)

    def rows(self, name: str, indices: list[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        return _cast(self.replaced[name][indices], dtype) if name in self.replaced else self._reader.rows(
            name, indices, dtype)

    def row_range(self, name: str, start: int, stop: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return _cast(self.replaced[name][start:stop].clone(), dtype) if name in self.replaced else (
            self._reader.row_range(name, start, stop, dtype))


def _read_at(handle, offset: int, tensor: torch.Tensor, file: str) -> None:
    """Fill a contiguous tensor with the bytes at `offset` of an open file."""
    if not tensor.numel():
        return
    buffer = tensor.view(-1).view(torch.uint8).numpy()
    handle.seek(offset)
    if handle.readinto(memoryview(buffer)) != buffer.nbytes:
        raise CheckpointError(f"{file} ends before the bytes its header promises")


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None or not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor
    return tensor.to(dtype)


class ShardWriter:
    """One safetensors file written tensor by tensor: the header is laid out from (name, dtype, shape) first, so
    each tensor goes to disk as soon as it is made and none waits for the others."""

    def __init__(self, path: Path, layout: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata: dict):
        header, offset = {}, 0
        for name, dtype, shape in layout:
            size = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": SAFETENSORS_NAMES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            offset += size
        if metadata:
            header = {"__metadata__": metadata, **header}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.path, self.expected = path, [name for name, _, _ in layout]
        self.layout = {name: (dtype, tuple(shape)) for name, dtype, shape in layout}
        self.written: list[str] = []
        self.handle = open(path, "wb")
        self.handle.write(struct.pack("<Q", len(text)) + text)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        position = len(self.written)
        if position >= len(self.expected) or self.expected[position] != name:
            raise ValueError(f"{self.path.name}: expected {self.expected[position:position + 1]}, got {name}")
        if (tensor.dtype, tuple(tensor.shape)) != self.layout[name]:
            raise ValueError(f"{name}: {tensor.dtype} {tuple(tensor.shape)} differs from its header's "
                             f"{self.layout[name]}")
        self.handle.write(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().data)
        self.written.append(name)

    def close(self) -> None:
        self.handle.close()
        if self.written != self.expected:
            os.unlink(self.path)
            raise ValueError(f"{self.path.name}: closed after {len(self.written)} of {len(self.expected)} tensors")
