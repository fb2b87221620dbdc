"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
import time

import pytest
import torch

from perm_core import zoo


@pytest.fixture(scope="session")
def smollm(tmp_path_factory):
    """smollm2-135m converted once per session into a temporary cache (not the user's)."""
    previous = os.environ.get("TRANSFORMER_SYMMETRY_CACHE")
    os.environ["TRANSFORMER_SYMMETRY_CACHE"] = str(tmp_path_factory.mktemp("tse-cache"))
    calls = []
    started = time.perf_counter()
    loaded = zoo.load_model("smollm2-135m", progress=lambda f, m: calls.append((f, m)))
    first_seconds = time.perf_counter() - started
    yield loaded, calls, first_seconds
    if previous is None:
        os.environ.pop("TRANSFORMER_SYMMETRY_CACHE", None)
    else:
        os.environ["TRANSFORMER_SYMMETRY_CACHE"] = previous


@pytest.fixture
def one_thread():
    """Small models on a shared 2-core machine: one torch thread avoids oversubscription (5x faster here)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
