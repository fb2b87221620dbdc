"""Session-wide test settings: offline, and a private cache so the user's cache is never touched.

The converted zoo models take about 1.7 GB in that cache, and the machines share their disk, so a run removes
the cache it made (a run given TRANSFORMER_SYMMETRY_CACHE keeps it) and says when the disk is nearly full.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

NEEDED_FREE_BYTES = 4 * 2**30  # the private cache plus the fixtures' fresh conversions (smollm2, gemma3, dinov2)

os.environ["HF_HUB_OFFLINE"] = "1"
if "TRANSFORMER_SYMMETRY_CACHE" not in os.environ:
    # Under pytest-xdist the controller makes the cache before it starts the workers, which inherit it: a model
    # converted on one worker is there for the other (conversions are atomic renames; a lost race is harmless).
    _private_cache = tempfile.mkdtemp(prefix="tse-test-cache-")
    os.environ["TRANSFORMER_SYMMETRY_CACHE"] = _private_cache
    atexit.register(shutil.rmtree, _private_cache, ignore_errors=True)

# The e2e tests' one app server, shared by the xdist workers (tests/e2e/conftest.py): the first worker to need it
# starts it and writes its address here; the process that made this folder (the controller) stops it at exit.
if "TSE_TEST_SHARED_DIR" not in os.environ:
    _shared = tempfile.mkdtemp(prefix="tse-test-shared-")
    os.environ["TSE_TEST_SHARED_DIR"] = _shared

    def _stop_shared_server(folder: str = _shared) -> None:
        from tests.e2e.shared_server import stop_shared_server

        stop_shared_server(Path(folder))
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(_stop_shared_server)

# The session's cache (shared by the xdist workers and the e2e servers they start); fixtures that test a conversion
# point TRANSFORMER_SYMMETRY_CACHE at a cache of their own for a while, and hand their result over with keep_converted.
SESSION_CACHE = Path(os.environ["TRANSFORMER_SYMMETRY_CACHE"])


def keep_converted(cache: Path) -> None:
    """Move each complete conversion in a fixture's own cache into the session's cache (unless it is there already),
    so that later tests and servers load it instead of converting it again. A rename: no copy, no extra disk."""
    if cache == SESSION_CACHE:
        return
    SESSION_CACHE.mkdir(parents=True, exist_ok=True)
    for converted in cache.iterdir():
        target = SESSION_CACHE / converted.name
        if converted.name.startswith(".") or not (converted / "complete.json").is_file() or target.exists():
            continue
        try:
            os.rename(converted, target)
        except OSError:  # another filesystem, or another worker's conversion won the race: nothing lost
            pass


if os.environ.get("PYTEST_XDIST_WORKER"):
    # One torch thread per worker: n workers on n cores, instead of n workers each spinning n threads.
    import torch

    torch.set_num_threads(1)


def pytest_report_header(config):
    free = shutil.disk_usage(tempfile.gettempdir()).free
    line = f"free disk under {tempfile.gettempdir()}: {free / 2**30:.1f} GiB"
    if free < NEEDED_FREE_BYTES:
        line += f" -- the model tests need about {NEEDED_FREE_BYTES / 2**30:.0f} GiB and may fail with ENOSPC"
    return line


# The order files start in (make test runs pytest-xdist with --dist loadfile --no-loadscope-reorder, so each worker
# takes the next file in this order as it finishes one). The files whose fixtures convert the large zoo models go
# first, so that the e2e servers load those conversions instead of making their own; then the browser tests, the
# longest files, while both workers are free; the many short unit files last, to even out the end of the run.
_CONVERTS_FIRST = ("tests/unit/test_gemma3.py", "tests/unit/test_zoo.py")
# Then the wheel's install into a fresh environment: minutes, most of them pip unpacking torch, spent while the other
# workers run instead of at the end of the run.
_STARTS_EARLY = ("tests/unit/test_wheel.py",)
_DIRECTORY_ORDER = ("tests/e2e/", "tests/app/", "tests/unit/")


def _run_order(item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path in _CONVERTS_FIRST:
        return (0, _CONVERTS_FIRST.index(path))
    if path in _STARTS_EARLY:
        return (1, _STARTS_EARLY.index(path))
    rank = next((i for i, prefix in enumerate(_DIRECTORY_ORDER) if path.startswith(prefix)), len(_DIRECTORY_ORDER))
    return (2 + rank, 0)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_run_order)  # stable: a file's tests keep their order, files within a directory theirs
