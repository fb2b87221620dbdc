"""Resident memory of this process, and the bound a streamed check promises.

The peak is the kernel's own high-water mark (VmHWM), reset at the start of a check by writing 5 to
/proc/self/clear_refs; where that is not allowed, the process's peak so far (which may predate the check) is
reported, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

_STATUS = Path("/proc/self/status")
# What torch and transformers load on their first use in a process (kernels, thread pools, lazily imported
# modules) and the small allocations the heap keeps: measured 30 MiB on a 30 MB-block model and 98 MiB left
# resident after the original run of the 1.1B-parameter benchmark model, whatever the block's size.
FIRST_USE_BYTES = 128 * 2**20
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def resident_bytes() -> int | None:
    return _status_bytes("VmRSS")


def peak_bytes() -> int | None:
    return _status_bytes("VmHWM")


def reset_peak() -> bool:
    """Start the high-water mark afresh at the current resident size; False where the kernel does not allow it."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


@dataclass
class MemoryBound:
    """What a streamed check may hold at once, in bytes, and what it held."""

    largest_block: int  # the largest block's weights in the checked dtype (a head chunk is never larger)
    largest_tensor: int  # its largest weight: a gradient and its un-scrambled copy, compared then dropped
    activations: int  # one block's activations, gradients included, and the run's per-token records
    embedding_rows: int  # the looked-up rows of the embedding table, the embedding's other parameters whole
    transforms: int = 0  # every element's and control's drawn transform and its inverse (per-head rotations for
    # every layer among them), held from start to end
    head_whole: int = 0  # the head's parameters besides its vocabulary rows (BERT's transform, ViT's final norm),
    # read whole: the original and each element's transformed copy, with their gradients
    # a stage's rerun in the other dtype for its round-off allowance (stream.allowance): a float32 check's float64
    # block, its two largest tensors and its activations; a float64 check's float32 rerun holds at most its original's
    # gradients and half a block of weights (or half a block of un-scrambled tensors and a transformed copy), within
    # the three copies above, so nothing is added for it
    allowance: int = 0
    first_use: int = FIRST_USE_BYTES
    baseline: int | None = None  # resident before the check (the interpreter, torch, transformers)
    peak: int | None = None  # resident high-water mark during the check
    peak_since_start: bool = True  # False: the high-water mark could not be reset, so it may predate the check
    stages: dict[str, int] = field(default_factory=dict)  # each stage's own high-water mark above the baseline
    stages_after: dict[str, int] = field(default_factory=dict)  # resident above the baseline as each stage ends

    @property
    def bound(self) -> int:
        return (3 * self.largest_block + 2 * self.largest_tensor + self.activations + self.embedding_rows
                + self.transforms + self.head_whole + self.allowance + self.first_use)

    @property
    def held(self) -> int | None:
        """The peak above the baseline: what the check itself held at most."""
        if self.peak is None or self.baseline is None:
            return None
        return max(self.peak - self.baseline, 0)

    def to_json(self) -> dict:
        return {"bound_bytes": self.bound, "largest_block_bytes": self.largest_block,
                "largest_tensor_bytes": self.largest_tensor,
                "activation_bytes": self.activations, "embedding_rows_bytes": self.embedding_rows,
                "transforms_bytes": self.transforms, "head_whole_bytes": self.head_whole,
                "allowance_bytes": self.allowance,
                "first_use_bytes": self.first_use,
                "baseline_rss_bytes": self.baseline, "peak_rss_bytes": self.peak, "held_bytes": self.held,
                "peak_since_start": self.peak_since_start, "stage_held_bytes": self.stages,
                "stage_resident_after_bytes": self.stages_after}

    @property
    def largest_stage(self) -> str | None:
        return max(self.stages, key=self.stages.get) if self.stages else None


class StagePeaks:
    """Each stage's own high-water mark above the baseline (the mark read, then reset, as each stage ends): which
    stage sets the check's peak. Without a reset (a kernel that refuses it) no stage is told apart."""

    def __init__(self, baseline: int | None, can_reset: bool):
        self.baseline, self.can_reset = baseline, can_reset
        self.stages: dict[str, int] = {}
        self.after: dict[str, int] = {}
        self.peak: int | None = None

    def end(self, stage: str) -> None:
        peak = peak_bytes()
        if peak is None:
            return
        self.peak = max(self.peak or 0, peak)
        if self.can_reset and self.baseline is not None:
            self.stages[stage] = max(peak - self.baseline, 0)
            self.after[stage] = max((resident_bytes() or self.baseline) - self.baseline, 0)
            reset_peak()
