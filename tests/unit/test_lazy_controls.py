"""Listing the negative controls (the Explore page does it on every rerun) draws none of them: each is drawn
once, when it is first applied, and is the same element it would have been if drawn at once."""

from __future__ import annotations

import pytest
import torch

from perm_core.engine import keys, symmetries
from perm_core.families import llama
from perm_core.models.random_models import build_random_model


def llama_geometry():
    model, _ = build_random_model("llama", seed=0)
    return llama.FAMILY.geometry(model.config)


def test_listing_controls_draws_nothing_and_applying_one_draws_it_once(monkeypatch):
    geometry = llama_geometry()
    drawn = []
    real_orthogonal = keys.orthogonal
    monkeypatch.setattr(keys, "orthogonal", lambda *a, **k: drawn.append(a) or real_orthogonal(*a, **k))
    symmetries._drawn.cache_clear()

    listed = {name: symmetries.controls(name, 12345, geometry, 9) for name in symmetries.SYMMETRIES}
    assert sum(len(c) for c in listed.values()) >= 8
    assert drawn == []

    residual = next(c for c in listed["channels"] if c.name == "residual_rotation")
    first = residual.scramble
    assert len(drawn) == 1 and residual.scramble is first  # drawn once, then kept
    rotated = first.spaces[("resid", None)][0].blocks[0]
    assert torch.equal(rotated, real_orthogonal(12345, 1, geometry.d_model, "channels/rotation")[0])


@pytest.mark.parametrize("key", [-1, 2**64, "abc"])
def test_a_bad_key_is_refused_when_listing(key):
    geometry = llama_geometry()
    with pytest.raises(keys.InvalidKeyError):
        symmetries.controls("channels", key, geometry)


def test_tokens_controls_need_the_number_of_tokens():
    geometry = llama_geometry()
    with pytest.raises(ValueError, match="number of input tokens"):
        symmetries.controls("tokens", 1, geometry)
