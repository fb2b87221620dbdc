"""Every process-wide setting, read from the environment once per process into one frozen object.

| variable                   | default | what it sets                                                          |
|----------------------------|---------|-----------------------------------------------------------------------|
| TSE_PARAMS_CACHE_MB        | 640     | transformed parameter sets kept for key changes (perm_core.fast.param_cache) |
| TSE_EXPLORATIONS_CACHE_MB  | 192     | Explore's original traces kept (ui.runtime.runs)                      |
| TSE_RESULTS_CACHE_MB       | 192     | Explore's finished results kept (ui.runtime.runs)                     |
| TSE_PAGES_CACHE_MB         | 128     | the other pages' finished runs kept (ui.runtime.runs.page_runs)       |
| TSE_RUN_BUDGET_MB          | 384     | runs' data alive at once, process-wide (ui.runtime.budget)            |
| TSE_PAGE_RUNS              | 2       | runs of the other pages at once (ui.runtime.budget.page_slot)         |
| TSE_CONCURRENT_RUNS        | 2       | Explore runs of one model at once (ui.runtime.budget.model_slot)      |
| TSE_KEEP_FREED_MEMORY      | 1       | 0: glibc's malloc defaults for the CLI, a benchmark's baseline        |
| TSE_MEMORY_AUDIT_FILE      | unset   | what held the server's memory at its peak (ui.runtime.memory_audit)   |
| TSE_WEIGHTS_HASH_FILE      | unset   | each shared model hashed at load and exit (ui.runtime.weights_audit)  |

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

MEBIBYTE = 2**20
DEFAULTS = {"TSE_PARAMS_CACHE_MB": "640", "TSE_EXPLORATIONS_CACHE_MB": "192", "TSE_RESULTS_CACHE_MB": "192",
            "TSE_PAGES_CACHE_MB": "128", "TSE_RUN_BUDGET_MB": "384", "TSE_PAGE_RUNS": "2",
            "TSE_CONCURRENT_RUNS": "2", "TSE_KEEP_FREED_MEMORY": "1", "TSE_MEMORY_AUDIT_FILE": "",
            "TSE_WEIGHTS_HASH_FILE": ""}


@dataclass(frozen=True)
class Limits:
    values: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULTS))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Limits:
        return cls({name: environ.get(name, default) for name, default in DEFAULTS.items()})

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

    @property
    def params_cache_bytes(self) -> int:
        return self.bytes("TSE_PARAMS_CACHE_MB")

    @property
    def explorations_cache_bytes(self) -> int:
        return self.bytes("TSE_EXPLORATIONS_CACHE_MB")

    @property
    def results_cache_bytes(self) -> int:
        return self.bytes("TSE_RESULTS_CACHE_MB")

    @property
    def pages_cache_bytes(self) -> int:
        return self.bytes("TSE_PAGES_CACHE_MB")

    @property
    def run_budget_bytes(self) -> int:
        return self.bytes("TSE_RUN_BUDGET_MB")

    @property
    def page_runs(self) -> int:
        return self.count("TSE_PAGE_RUNS")

    @property
    def concurrent_runs(self) -> int:
        return self.count("TSE_CONCURRENT_RUNS")

    @property
    def keep_freed_memory(self) -> bool:
        return self.flag("TSE_KEEP_FREED_MEMORY")

    @property
    def memory_audit_file(self) -> Path | None:
        return self.path("TSE_MEMORY_AUDIT_FILE")

    @property
    def weights_hash_file(self) -> Path | None:
        return self.path("TSE_WEIGHTS_HASH_FILE")


_current = Limits.from_environment()


def current() -> Limits:
    """The settings this process read at start."""
    return _current


def use(limits: Limits) -> Limits:
    """Replace the process's settings (tests, benchmarks); returns the previous ones, to put back."""
    global _current
    previous, _current = _current, limits
    return previous
