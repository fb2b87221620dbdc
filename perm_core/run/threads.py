"""torch's intra-op thread count for a stretch of work, safe when the app's sessions overlap.

torch.set_num_threads sets the calling thread's OpenMP count and the count that threads started later begin with
(Streamlit starts a thread for every script run). Two overlapping stretches that each put back "the count before"
could leave that default at 1 for every later run of every session. Here the process's count is read once at
import, every stretch in progress is counted, and the last one to end puts the process's count back.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

PROCESS_THREADS = torch.get_num_threads()
_requests: list[int] = []  # the counts asked for by the stretches in progress
_guard = threading.Lock()


@contextmanager
def torch_threads(count: int):
    """Run the body with at most `count` intra-op threads (the smallest count any stretch in progress asks for)."""
    with _guard:
        _requests.append(count)
        torch.set_num_threads(min(_requests))
    try:
        yield
    finally:
        with _guard:
            _requests.remove(count)
            torch.set_num_threads(min(_requests) if _requests else PROCESS_THREADS)


def one_thread():
    """Tiny models on a shared 2-core machine: one thread runs them about 5x faster than two."""
    return torch_threads(1)


class TorchWorkCalls(TorchFunctionMode):
    """Counts the torch calls that do work inside its `with`: each lets the GIL go and must win it back, which
    beside a classroom's sessions drawing charts costs milliseconds. Metadata reads (.shape, .numel()) hold it."""

    METADATA = frozenset({"__get__", "numel", "dim", "element_size", "is_contiguous", "numpy", "__getitem__", "size",
                          "data_ptr", "_set_grad_enabled"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") not in self.METADATA:
            self.count += 1
        return func(*args, **(kwargs or {}))
