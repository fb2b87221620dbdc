"""Resident memory of this process, and the bound a streamed check promises.

The peak is the kernel's own high-water mark (VmHWM), reset at the start of a check by writing 5 to
/proc/self/clear_refs; where that is not allowed, the process's peak so far (which may predate the check) is
reported, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    embedding_rows: int  # the looked-up rows of the embedding table
    first_use: int = FIRST_USE_BYTES
    baseline: int | None = None  # resident before the check (the interpreter, torch, transformers)
    peak: int | None = None  # resident high-water mark during the check
    peak_since_start: bool = True  # False: the high-water mark could not be reset, so it may predate the check

    @property
    def bound(self) -> int:
        return (3 * self.largest_block + 2 * self.largest_tensor + self.activations + self.embedding_rows
                + self.first_use)

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
                "first_use_bytes": self.first_use,
                "baseline_rss_bytes": self.baseline, "peak_rss_bytes": self.peak, "held_bytes": self.held,
                "peak_since_start": self.peak_since_start}
