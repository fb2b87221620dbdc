"""Integer keys -> permutations and orthogonal matrices, reproducible on every machine.

A key and a purpose string ("channels", "heads/3", ...) seed numpy's PCG64 through a
SeedSequence; both are platform independent, so the same key gives the same transform
everywhere and in every process (Python's own hash() is salted per process, crc32 is not).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch

KEY_BITS = 64
MAX_KEY = 2**KEY_BITS - 1
LONG_KEY_BITS = 256  # model authorization: a key as long as a cipher key, written in hex
MAX_LONG_KEY = 2**LONG_KEY_BITS - 1


class InvalidKeyError(ValueError):
    """A key that is not an integer in [0, 2**64)."""


def validate_key(key) -> int:
    if isinstance(key, bool) or not isinstance(key, int | np.integer):
        try:
            text = str(key).strip()
            key = int(text)
        except (TypeError, ValueError):
            raise InvalidKeyError(f"A key must be a whole number from 0 to 2**64-1, got {key!r}.") from None
    key = int(key)
    if not 0 <= key <= MAX_KEY:
        raise InvalidKeyError(f"A key must be a whole number from 0 to 2**64-1 (18446744073709551615), got {key}.")
    return key


def parse_long_key(key) -> int:
    """An authorization key: a whole number or a 0x-prefixed hex string, 0 .. 2**256-1."""
    message = ("An authorization key must be a whole number or a 0x-prefixed hex string of at most 256 bits "
               f"(64 hex digits), got {key!r}.")
    if isinstance(key, bool):
        raise InvalidKeyError(message)
    if not isinstance(key, int | np.integer):
        text = str(key).strip().replace("_", "")
        try:
            key = int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            raise InvalidKeyError(message) from None
    key = int(key)
    if not 0 <= key <= MAX_LONG_KEY:
        raise InvalidKeyError(message)
    return key


def rng_for(key: int, purpose: str) -> np.random.Generator:
    """Keys up to 64 bits seed [low word, high word, purpose] as they always have; a longer key seeds all eight
    of its 32-bit words and the purpose (a different length of entropy, so it never collides with a short key)."""
    key = validate_key(key) if not isinstance(key, int) or key <= MAX_KEY else parse_long_key(key)
    if key <= MAX_KEY:
        words = [key & 0xFFFFFFFF, key >> 32]
    else:
        words = [(key >> (32 * i)) & 0xFFFFFFFF for i in range(LONG_KEY_BITS // 32)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words + [zlib.crc32(purpose.encode())])))


def _moving_permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """A uniform draw among the n! - 1 permutations that move something (n >= 2): a key that draws
    the identity would leave a space unmoved, and a check of an unmoved space proves nothing."""
    while True:
        drawn = rng.permutation(n)
        if n < 2 or (drawn != np.arange(n)).any():
            return drawn


def permutation(key: int, n: int, purpose: str) -> torch.Tensor:
    return torch.from_numpy(_moving_permutation(rng_for(key, purpose), n)).long()


def permutations(key: int, count: int, n: int, purpose: str) -> torch.Tensor:
    rng = rng_for(key, purpose)
    return torch.from_numpy(np.stack([_moving_permutation(rng, n) for _ in range(count)])).long()


def orthogonal(key: int, count: int, n: int, purpose: str) -> torch.Tensor:
    """`count` Haar-random n x n orthogonal matrices (QR of a Gaussian, signs fixed), float64."""
    gauss = torch.from_numpy(rng_for(key, purpose).standard_normal((count, n, n)))
    q, r = torch.linalg.qr(gauss)
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)


def plane_rotations(key: int, count: int, n: int, purpose: str) -> torch.Tensor:
    """Rotations that commute with RoPE: one 2-D rotation inside each rotary plane.

    Hugging Face's rotate_half pairs channel i with channel i + n/2, and both carry the same
    frequency, so a rotation acting only inside those planes commutes with every position's
    rotary matrix; any other orthogonal map does not.
    """
    if n % 2:
        raise ValueError(f"rotary head size must be even, got {n}")
    half = n // 2
    angles = torch.from_numpy(rng_for(key, purpose).uniform(-math.pi, math.pi, (count, half)))
    blocks = torch.zeros(count, n, n, dtype=torch.float64)
    idx = torch.arange(half)
    cos, sin = torch.cos(angles), torch.sin(angles)
    blocks[:, idx, idx] = cos
    blocks[:, idx + half, idx + half] = cos
    blocks[:, idx, idx + half] = -sin
    blocks[:, idx + half, idx] = sin
    return blocks


def permutation_bits(n: int) -> float:
    """log2(n! - 1): the permutations of n items that a key can draw (every one but the identity)."""
    if n < 2:
        return 0.0
    if n <= 20:
        return math.log2(math.factorial(n) - 1)
    return math.lgamma(n + 1) / math.log(2)  # n! - 1 and n! agree to far below a bit
