"""The files the library reads, shipped inside the package (origins and licenses in README.md here): the digits
ViTs' weights (models/<name>/) and the sample texts and paraphrases (samples/).

They are read through importlib.resources, so an installed wheel finds them in site-packages exactly as a checkout
finds them here; nothing in perm_core reaches for a path outside the package.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

_EXTRACTED = contextlib.ExitStack()  # copies made for a package that is not plain files (a zip), removed at exit
atexit.register(_EXTRACTED.close)


def shipped_resource(*parts: str) -> Traversable:
    """The shipped file or directory at parts (e.g. "samples", "texts.json"), as importlib.resources sees it."""
    found = resources.files(__name__)
    for part in parts:
        found = found / part
    return found


@functools.cache
def shipped_path(*parts: str) -> Path:
    """A shipped file or directory as a real path, for readers that need one (from_pretrained takes a directory).
    A package installed as files gives its own path; any other is extracted once and kept until the process ends."""
    return _EXTRACTED.enter_context(resources.as_file(shipped_resource(*parts)))


def shipped_json(*parts: str):
    """A shipped JSON file, parsed."""
    return json.loads(shipped_resource(*parts).read_text(encoding="utf-8"))
