"""glibc malloc settings: a one-shot process (the CLI) keeps what it frees; a server (the app) gives it back.

By default glibc serves every allocation above 128 KiB (raised up to 32 MiB as they are freed) with its own
mmap, and gives it back to the system on free; the next one of the same size faults every page in again and
the kernel zeroes it. A float64 check of smollm2-135m allocates about 1 GB of gradients per backward: 375,000
page faults and 0.6 s of system time each. Keeping freed memory for reuse costs nothing in a process that
ends after one command; the app does not do this (it gives freed pages back, see ui/runtime/housekeeping.py).
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

_GLIBC = ctypes.CDLL(None)  # the symbols the process already has
_MALLOPT = getattr(_GLIBC, "mallopt", None)  # glibc; None elsewhere (macOS), where nothing changes
if _MALLOPT is not None:
    _MALLOPT.argtypes = (ctypes.c_int, ctypes.c_int)
_MALLOC_TRIM = getattr(_GLIBC, "malloc_trim", None)
CAN_TRIM = _MALLOC_TRIM is not None


def trim() -> bool:
    """Return to the system the free pages glibc keeps, between live blocks and in every arena (malloc_trim);
    False where there is no glibc."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and keep what is freed there for the next one; True if set."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_MMAP_THRESHOLD, _KEEP)) and bool(_MALLOPT(M_TRIM_THRESHOLD, _NEVER_TRIM))


# A server's blocks of 1 MiB and more (traces, attention maps, transformed weights) each get their own mapping,
# given back to the system when freed. glibc's default raises its threshold to 32 MiB after the first such free,
# and from then on serves them from heaps, where a freed block stays resident until every block around it is
# freed too: a classroom's server (benchmarks/classroom.py, 30 sessions) peaked at 2.15-2.29 GiB with 450-700
# MiB of it free heap, and at 1.91 GiB with this setting and two arenas, at the same CPU time (224 s against
# 226-231 s). At 256 KiB the system calls cost 12% more CPU.
SERVER_MMAP_THRESHOLD = 1 << 20
# glibc gives threads up to 8 arenas per core, each keeping its own free memory, so a server's dozens of session
# threads hold freed memory the others cannot use. Two arenas for all: only the environment can say so (glibc
# fixes the limit when the first thread asks for an arena, before the app's code runs). make run and the
# benchmarks' and tests' servers start with it.
SERVER_ENVIRONMENT = {"MALLOC_ARENA_MAX": "2"}


def give_freed_memory_back() -> bool:
    """Serve large blocks from their own mappings, returned to the system when freed; True if set."""
    if _MALLOPT is None:
        return False
    return bool(_MALLOPT(M_MMAP_THRESHOLD, SERVER_MMAP_THRESHOLD))
