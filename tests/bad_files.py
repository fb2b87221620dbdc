"""Bad and unusual uploads, made on the fly in memory (never committed): name -> (bytes, MIME type, message).

Shared by the loader's unit test (tests/unit/test_inputs.py), the pages' AppTest (tests/app/test_bad_uploads.py)
and the real upload in Chromium (tests/e2e/test_bad_input.py)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_png(side: int = 20_000) -> bytes:
    """A real, valid side x side 1-bit PNG (all black), streamed row by row: about 50 kB on disk, 400 MP."""
    row = b"\x00" + b"\x00" * ((side + 7) // 8)  # filter byte + packed bits
    compressor = zlib.compressobj(9)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def animated_gif() -> bytes:
    frames = [Image.fromarray(np.full((48, 48), shade, np.uint8)).convert("P") for shade in (0, 128, 255)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buffer.getvalue()


def cmyk_jpeg() -> bytes:
    rgb = np.random.default_rng(2).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buffer, "JPEG")
    return buffer.getvalue()


def gray16_png() -> bytes:
    values = np.random.default_rng(3).integers(0, 65535, (64, 64)).astype(np.uint16)
    image = Image.fromarray(values)
    assert image.mode == "I;16"
    return _png(image)


def photo_png() -> bytes:
    return _png(Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)))


def photo_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(4).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


# name -> (bytes, MIME, what the page must say); None: the model runs on it (a verdict, no error)
def refused() -> dict[str, tuple[bytes, str, str]]:
    return {
        "notes.txt": (b"just some notes, not an image\n", "text/plain", "is not an image format we can read"),
        "script.py": (b"import os\nos.system('echo hi')\n", "text/x-python", "is not an image format we can read"),
        "empty.png": (b"", "image/png", "The file is empty"),
        "corrupt.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "image/png", "is not an image format"),
        "truncated.png": (photo_png()[:300], "image/png", "corrupt or truncated"),
        "truncated.jpg": (photo_jpeg()[:400], "image/jpeg", "corrupt or truncated"),
        "huge-20000x20000.png": (huge_png(), "image/png", "possible decompression bomb"),
    }


def accepted() -> dict[str, tuple[bytes, str]]:
    return {"animated.gif": (animated_gif(), "image/gif"), "cmyk.jpg": (cmyk_jpeg(), "image/jpeg"),
            "gray16.png": (gray16_png(), "image/png")}
