"""The library's process-wide settings, read from the environment once per process into one frozen object.

| variable                   | default | what it sets                                                          |
|----------------------------|---------|-----------------------------------------------------------------------|
| TSE_PARAMS_CACHE_MB        | 640     | transformed parameter sets kept for key changes (perm_core.fast.param_cache) |
| TSE_KEEP_FREED_MEMORY      | 1       | 0: glibc's malloc defaults for the CLI, a benchmark's baseline        |

The app's own settings (its caches, run budget and slots, audits) are read the same way by ui.runtime.settings.
(TRANSFORMER_SYMMETRY_CACHE, the on-disk cache of converted zoo models, is a path read where it is used:
perm_core.models.conversion_cache.cache_root.)

A value that does not parse is kept as it was written and raises, naming its variable, only where it is read:
a bad cache size breaks the pages that use that cache, and the others go on serving.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

MEBIBYTE = 2**20
DEFAULTS = {"TSE_PARAMS_CACHE_MB": "640", "TSE_KEEP_FREED_MEMORY": "1"}


@dataclass(frozen=True)
class EnvironmentSettings:
    """Each variable's text as written (its default where unset); parsed, or raised naming it, where it is read."""

    DEFAULTS: ClassVar[Mapping[str, str]] = {}
    values: Mapping[str, str]

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ):
        return cls({name: environ.get(name, default) for name, default in cls.DEFAULTS.items()})

    def _number(self, variable: str) -> float:
        text = self.values[variable]
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{variable}={text!r} is not a number") from None
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"{variable}={text!r} must be a finite number >= 0")
        return value

    def bytes(self, variable: str) -> int:
        """A size given in MiB, in bytes."""
        return int(self._number(variable) * MEBIBYTE)

    def count(self, variable: str) -> int:
        """A number of things at once: at least 1."""
        return max(1, int(self._number(variable)))

    def path(self, variable: str) -> Path | None:
        return Path(self.values[variable]).expanduser() if self.values[variable] else None

    def flag(self, variable: str) -> bool:
        return self.values[variable] != "0"


@dataclass(frozen=True)
class Limits(EnvironmentSettings):
    DEFAULTS: ClassVar[Mapping[str, str]] = DEFAULTS
    values: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULTS))

    @property
    def params_cache_bytes(self) -> int:
        return self.bytes("TSE_PARAMS_CACHE_MB")

    @property
    def keep_freed_memory(self) -> bool:
        return self.flag("TSE_KEEP_FREED_MEMORY")


_current = Limits.from_environment()


def current() -> Limits:
    """The settings this process read at start."""
    return _current


def use(limits: Limits) -> Limits:
    """Replace the process's settings (tests, benchmarks); returns the previous ones, to put back."""
    global _current
    previous, _current = _current, limits
    return previous
