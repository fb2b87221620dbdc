"""Session-wide test settings: offline, and a private cache so the user's cache is never touched.

The converted zoo models take about 1.7 GB in that cache, and the machines share their disk, so a run removes
the cache it made (a run given TRANSFORMER_SYMMETRY_CACHE keeps it) and says when the disk is nearly full.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

NEEDED_FREE_BYTES = 4 * 2**30  # the private cache plus the fixtures' fresh conversions (smollm2, gemma3, dinov2)

os.environ["HF_HUB_OFFLINE"] = "1"
if "TRANSFORMER_SYMMETRY_CACHE" not in os.environ:
    _private_cache = tempfile.mkdtemp(prefix="tse-test-cache-")
    os.environ["TRANSFORMER_SYMMETRY_CACHE"] = _private_cache
    atexit.register(shutil.rmtree, _private_cache, ignore_errors=True)


def pytest_report_header(config):
    free = shutil.disk_usage(tempfile.gettempdir()).free
    line = f"free disk under {tempfile.gettempdir()}: {free / 2**30:.1f} GiB"
    if free < NEEDED_FREE_BYTES:
        line += f" -- the model tests need about {NEEDED_FREE_BYTES / 2**30:.0f} GiB and may fail with ENOSPC"
    return line
