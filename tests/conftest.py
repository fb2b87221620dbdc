"""Session-wide test settings: offline, and a private cache so the user's cache is never touched."""

from __future__ import annotations

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMER_SYMMETRY_CACHE", tempfile.mkdtemp(prefix="tse-test-cache-"))
