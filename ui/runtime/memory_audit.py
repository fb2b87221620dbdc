"""Opt-in split of the server's peak resident memory by owner, for benchmarks/classroom.py.

    TSE_MEMORY_AUDIT_FILE=/tmp/memory.json streamlit run app.py

With the variable set, a thread reads the resident size four times a second; at each new peak (16 MiB over the
last) it notes what holds memory: file-backed pages (libraries, memory-mapped weights), glibc's heap in use and
free, its large blocks in their own mappings, the bytes each registered cache holds (`register`), Python's
small-object blocks and the threads alive. The file holds the latest peak's split; it is rewritten at each new
peak and at exit, when it also records the process's lifetime peak resident size (`peak_rss_bytes`, the kernel's
VmHWM: never below any resident size sampled before it, which the watch's samples after an outside reader's last
look can be). No page, widget or route is added. Unset, no thread starts and nothing is written.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

from perm_core.run import malloc
from ui.runtime import settings

VARIABLE = "TSE_MEMORY_AUDIT_FILE"
STEP_BYTES = 16 << 20
INTERVAL_S = 0.25
_PAGE = os.sysconf("SC_PAGE_SIZE")
_caches: dict[str, object] = {}  # name -> an object with .bytes (perm_core.fast.param_cache.TensorCache)
_gauges: dict[str, object] = {}  # name -> a callable giving a number: what is in flight (runs, held bytes)
_started = threading.Lock()
_thread: threading.Thread | None = None
_writing = threading.Lock()
_exiting = threading.Event()  # set by the exit write: the watch must not overwrite it with a peak alone
_t0 = time.monotonic()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


_MALLINFO2 = getattr(ctypes.CDLL(None), "mallinfo2", None)  # glibc 2.33+; None elsewhere: no heap figures
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def enabled() -> bool:
    return settings.current().memory_audit_file is not None


def register(name: str, cache) -> None:
    """Count `cache.bytes` under `name` in each split (kept even when the audit is off: a dict entry)."""
    _caches[name] = cache


def register_gauge(name: str, read) -> None:
    """Note read() under `name` in each split's "in_flight" (kept even when the audit is off: a dict entry)."""
    _gauges[name] = read


def _resident() -> tuple[int, int]:
    """(resident, of which file-backed or shared) bytes, from /proc/self/statm."""
    fields = Path("/proc/self/statm").read_text().split()
    return int(fields[1]) * _PAGE, int(fields[2]) * _PAGE


def peak_rss_bytes() -> int:
    """The process's peak resident size so far (VmHWM, from /proc/self/status)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def split() -> dict:
    """What holds this process's memory now, in bytes."""
    resident, file_backed = _resident()
    figures = {"resident": resident, "file_backed": file_backed,
               "caches": {name: int(cache.bytes) for name, cache in sorted(_caches.items())},
               "in_flight": {name: read() for name, read in sorted(_gauges.items())},
               "python_blocks": sys.getallocatedblocks(), "threads": threading.active_count()}
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        figures.update(heap_in_use=info.uordblks, heap_free=info.fordblks, own_mappings=info.hblkhd)
    return figures


def _write(figures: dict) -> None:
    target = settings.current().memory_audit_file
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(figures, indent=2, sort_keys=True))
    partial.replace(target)


def _at_exit() -> dict:
    """The split at exit, and again after glibc gave its free pages back (malloc_trim): what was live then."""
    figures = {"at_exit": split(), "peak_rss_bytes": peak_rss_bytes()}
    if malloc.trim():
        figures["at_exit_trimmed"] = split()
    return figures


def _watch() -> None:
    peak: dict = {"resident": 0}

    def write_at_exit() -> None:
        with _writing:
            _exiting.set()
            _write({"peak": peak, **_at_exit()})

    atexit.register(write_at_exit)
    while not _exiting.is_set():
        if _resident()[0] >= peak["resident"] + STEP_BYTES:
            with _writing:
                if _exiting.is_set():
                    return
                peak = {**split(), "seconds": round(time.monotonic() - _t0, 2)}
                _write({"peak": peak})
        time.sleep(INTERVAL_S)


def start() -> bool:
    """Start the watch once per process when the variable is set; True if it runs."""
    global _thread
    if not enabled():
        return False
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_watch, name="memory-audit", daemon=True)
            _thread.start()
    return True
