"""Keys: reproducible across processes, validated, with a key-space size."""

from __future__ import annotations

import math
import subprocess
import sys
import zlib

import pytest
import torch

from perm_core.engine import keys, symmetries
from perm_core.families import family_by_name
from perm_core.models.random_models import random_config

SNIPPET = "from perm_core.engine import keys; print(keys.permutation(987654321, 20, 'channels').tolist(), " \
          "keys.orthogonal(3, 1, 3, 'rotation/0/qk').flatten().tolist())"


def test_same_key_same_transform_in_another_process():
    here = str(keys.permutation(987654321, 20, "channels").tolist()) + " " + str(
        keys.orthogonal(3, 1, 3, "rotation/0/qk").flatten().tolist())
    there = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=".").stdout.strip()
    assert there == here


def test_different_keys_and_purposes_differ():
    assert not torch.equal(keys.permutation(1, 50, "channels"), keys.permutation(2, 50, "channels"))
    assert not torch.equal(keys.permutation(1, 50, "mlp/0"), keys.permutation(1, 50, "mlp/1"))
    assert sorted(keys.permutation(1, 50, "x").tolist()) == list(range(50))


@pytest.mark.parametrize("bad", [-1, 10**30, "abc", 2**64, 1.5, "", None])
def test_bad_keys_get_a_clear_message(bad):
    with pytest.raises(keys.InvalidKeyError, match="A key must be a whole number from 0 to 2\\*\\*64-1"):
        keys.validate_key(bad)


def test_good_keys_accepted():
    assert keys.validate_key("42") == 42
    assert keys.validate_key(2**64 - 1) == 2**64 - 1


def test_orthogonal_and_plane_rotations():
    q = keys.orthogonal(5, 3, 8, "r")
    assert torch.allclose(q @ q.transpose(1, 2), torch.eye(8, dtype=torch.float64).expand(3, 8, 8), atol=1e-13)
    p = keys.plane_rotations(5, 2, 8, "r")
    assert torch.allclose(p @ p.transpose(1, 2), torch.eye(8, dtype=torch.float64).expand(2, 8, 8), atol=1e-13)
    # only planes (i, i+4) are mixed
    assert p[0, 0, 1] == 0 and p[0, 0, 4] != 0


def test_key_space_bits():
    assert keys.permutation_bits(4) == pytest.approx(math.log2(23))  # every permutation but the identity
    assert keys.permutation_bits(2) == 0.0 and keys.permutation_bits(1) == 0.0
    g = family_by_name("bert").geometry(random_config("bert"))
    assert symmetries.key_space_bits("channels", g) == pytest.approx(math.lgamma(33) / math.log(2))
    assert symmetries.key_space_bits("tokens", g, n_tokens=12) == pytest.approx(math.log2(math.factorial(11) - 1))
    assert symmetries.key_space_bits("rotation", g) == math.inf


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_key_never_draws_the_identity(n):
    identity = torch.arange(n)
    for key in range(200):
        assert not torch.equal(keys.permutation(key, n, "heads/0/groups"), identity)
        assert all(not torch.equal(row, identity) for row in keys.permutations(key, 3, n, "x"))
    drawn = {tuple(keys.permutation(key, n, "p").tolist()) for key in range(400)}
    assert len(drawn) == math.factorial(n) - 1  # and every other permutation is reachable


def test_long_keys_parse_decimal_and_hex_up_to_256_bits():
    from perm_core.engine.keys import MAX_LONG_KEY, parse_long_key

    assert parse_long_key("0x" + "f" * 64) == MAX_LONG_KEY == 2**256 - 1
    assert parse_long_key("0XdeadBEEF") == 0xDEADBEEF
    assert parse_long_key(" 12345 ") == 12345 and parse_long_key(7) == 7
    for bad in ("0x" + "1" + "0" * 64, "-1", "0xzz", "", "1.5", True, 2**256):
        with pytest.raises(keys.InvalidKeyError, match="at most 256 bits"):
            parse_long_key(bad)


def test_short_keys_draw_what_they_always_drew_and_long_keys_differ():
    """Keys below 2**64 keep their transforms (every saved link and test key); a long key is its own draw,
    and two long keys that agree in their low 64 bits still differ."""
    import numpy as np

    from perm_core.engine.keys import permutation

    seeded = np.random.SeedSequence([12345, 0, zlib.crc32(b"channels")])
    assert torch.equal(permutation(12345, 20, "channels"),
                       torch.from_numpy(np.random.Generator(np.random.PCG64(seeded)).permutation(20)).long())
    low = 0x1234
    long_a, long_b = low | (1 << 100), low | (1 << 200)
    draws = {k: permutation(k, 64, "channels") for k in (low, long_a, long_b)}
    assert not torch.equal(draws[low], draws[long_a]) and not torch.equal(draws[long_a], draws[long_b])
    assert torch.equal(permutation(long_a, 64, "channels"), draws[long_a])  # reproducible
