"""glibc malloc settings for a one-shot process (the CLI) that allocates and frees model-sized tensors.

By default glibc serves every allocation above 128 KiB (raised up to 32 MiB as they are freed) with its own
mmap, and gives it back to the system on free; the next one of the same size faults every page in again and
the kernel zeroes it. A float64 check of smollm2-135m allocates about 1 GB of gradients per backward: 375,000
page faults and 0.6 s of system time each. Keeping freed memory for reuse costs nothing in a process that
ends after one command; the app does not do this (it gives freed pages back, see ui/resources.py).
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# mallopt takes an int: the largest (2 GiB - 1) is above any single tensor the CLI allocates
_KEEP = 2**31 - 1
# mallopt(3): -1 disables trimming. With a threshold of _KEEP a float64 gemma3-270m check, which frees over 2 GiB
# at the end of a step, gave it back (resident 11.5 -> 10.0 GiB) and faulted 650,000+ pages in again at every
# step: 40.6 s against 29.9 s with trimming off.
_NEVER_TRIM = -1

_MALLOPT = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc; None elsewhere (macOS), where nothing changes
if _MALLOPT is not None:
    _MALLOPT.argtypes = (ctypes.c_int, ctypes.c_int)


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and keep what is freed there for the next one; True if set."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_MMAP_THRESHOLD, _KEEP)) and bool(_MALLOPT(M_TRIM_THRESHOLD, _NEVER_TRIM))
