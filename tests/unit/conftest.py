"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
import time

import pytest
import torch

from perm_core.models import registry
from tests.conftest import keep_converted


@pytest.fixture(scope="session")
def smollm(tmp_path_factory):
    """smollm2-135m converted once per session into a temporary cache of its own (not the user's, not the
    session's): (loaded, progress calls, seconds, that cache). The cache variable is put back right after the
    conversion, so later tests and servers on this worker keep the session's cache."""
    previous = os.environ.get("TRANSFORMER_SYMMETRY_CACHE")
    cache = tmp_path_factory.mktemp("tse-cache")
    os.environ["TRANSFORMER_SYMMETRY_CACHE"] = str(cache)
    calls = []
    started = time.perf_counter()
    try:
        loaded = registry.load_model("smollm2-135m", progress=lambda f, m: calls.append((f, m)))
    finally:
        if previous is None:
            os.environ.pop("TRANSFORMER_SYMMETRY_CACHE", None)
        else:
            os.environ["TRANSFORMER_SYMMETRY_CACHE"] = previous
    yield loaded, calls, time.perf_counter() - started, cache
    keep_converted(cache)


@pytest.fixture
def one_thread():
    """Small models on a shared 2-core machine: one torch thread avoids oversubscription (5x faster here)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
