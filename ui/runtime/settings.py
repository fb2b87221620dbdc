"""The app's process-wide settings, read from the environment once per process into one frozen object.

| variable                   | default | what it sets                                                          |
|----------------------------|---------|-----------------------------------------------------------------------|
| TSE_EXPLORATIONS_CACHE_MB  | 192     | Explore's original traces kept (ui.runtime.runs)                      |
| TSE_RESULTS_CACHE_MB       | 192     | Explore's finished results kept (ui.runtime.runs)                     |
| TSE_PAGES_CACHE_MB         | 128     | the other pages' finished runs kept (ui.runtime.runs.page_runs)       |
| TSE_RUN_BUDGET_MB          | 384     | runs' data alive at once, process-wide (ui.runtime.budget)            |
| TSE_PAGE_RUNS              | 2       | runs of the other pages at once (ui.runtime.budget.page_slot)         |
| TSE_CONCURRENT_RUNS        | 2       | Explore runs of one model at once (ui.runtime.budget.model_slot)      |
| TSE_MEMORY_AUDIT_FILE      | unset   | what held the server's memory at its peak (ui.runtime.memory_audit)   |
| TSE_WEIGHTS_HASH_FILE      | unset   | each shared model hashed at load and exit (ui.runtime.weights_audit)  |

The library's own settings (TSE_PARAMS_CACHE_MB, TSE_KEEP_FREED_MEMORY) are read the same way by perm_core.limits.

A value that does not parse is kept as it was written and raises, naming its variable, only where it is read:
a bad cache size breaks the pages that use that cache, and the others go on serving.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from perm_core.limits import EnvironmentSettings

DEFAULTS = {"TSE_EXPLORATIONS_CACHE_MB": "192", "TSE_RESULTS_CACHE_MB": "192", "TSE_PAGES_CACHE_MB": "128",
            "TSE_RUN_BUDGET_MB": "384", "TSE_PAGE_RUNS": "2", "TSE_CONCURRENT_RUNS": "2",
            "TSE_MEMORY_AUDIT_FILE": "", "TSE_WEIGHTS_HASH_FILE": ""}


@dataclass(frozen=True)
class RuntimeSettings(EnvironmentSettings):
    DEFAULTS: ClassVar[Mapping[str, str]] = DEFAULTS
    values: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULTS))

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
    def memory_audit_file(self) -> Path | None:
        return self.path("TSE_MEMORY_AUDIT_FILE")

    @property
    def weights_hash_file(self) -> Path | None:
        return self.path("TSE_WEIGHTS_HASH_FILE")


_current = RuntimeSettings.from_environment()


def current() -> RuntimeSettings:
    """The settings this process read at start."""
    return _current


def use(settings: RuntimeSettings) -> RuntimeSettings:
    """Replace the process's settings (tests, benchmarks); returns the previous ones, to put back."""
    global _current
    previous, _current = _current, settings
    return previous
