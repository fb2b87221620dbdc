"""Inputs: user images and texts -> model-ready tensors, plus the shipped samples.

Everything a visitor can upload passes through here, so every failure becomes an
InputError with one clear line the app can show as is.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from perm_core.data import shipped_json
from perm_core.models import digits
from perm_core.run.stateless import own_dtype

if TYPE_CHECKING:
    from perm_core.models.registry import LoadedModel

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000  # ~6300 x 6300; decoding more would take seconds and hundreds of MB
MAX_TEXT_CHARS = 200_000  # tokenizing megabytes of text would stall the app for nothing


class InputError(ValueError):
    """A user input the models cannot take; the message is one user-facing line."""


# --- images ---


def load_image(
    data: bytes | str | os.PathLike,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> Image.Image:
    """Decode an upload or a file into an RGB PIL image, upright, transparency on white.

    Handles grayscale, 1-bit, palette, CMYK, 16-bit and 32-bit gray, alpha and EXIF
    orientation. Refuses non-images, truncated files, oversize files and images whose
    header declares more than max_pixels (checked before any pixel is decoded).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) > max_bytes:
            raise InputError(
                f"File is too large ({len(raw) / 2**20:.1f} MB; the limit is {max_bytes / 2**20:g} MB)."
            )
    else:
        path = Path(data)
        if not path.is_file():
            raise InputError(f"No such image file: {path}")
        if path.stat().st_size > max_bytes:
            size_mb = path.stat().st_size / 2**20
            raise InputError(f"File is too large ({size_mb:.1f} MB; the limit is {max_bytes / 2**20:g} MB).")
        raw = path.read_bytes()
    if not raw:
        raise InputError("The file is empty.")

    with warnings.catch_warnings():
        # PIL only warns between MAX_IMAGE_PIXELS and twice that; make it an error too.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(raw))  # reads the header only
            width, height = image.size
            if width * height > max_pixels:
                raise InputError(_too_many_pixels(width * height, max_pixels, f"{width}x{height}"))
            image.load()
        except InputError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            raise InputError(_too_many_pixels(None, max_pixels, None)) from error
        except UnidentifiedImageError as error:
            raise InputError("This file is not an image format we can read (try PNG or JPEG).") from error
        except (OSError, SyntaxError, ValueError, EOFError) as error:
            raise InputError(f"The image file is corrupt or truncated ({error}).") from error
        try:
            image = ImageOps.exif_transpose(image)
        except Exception:  # noqa: BLE001 - a broken EXIF block should not lose the picture
            pass
    return _to_rgb(image)


def _too_many_pixels(count: int | None, limit: int, dims: str | None) -> str:
    what = f"Image is {dims} pixels ({count / 1e6:.0f} megapixels)" if dims else "Image is too large"
    return f"{what}; the limit is {limit / 1e6:g} megapixels (possible decompression bomb), not decoded."


def _to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        image = _high_depth_to_l(image)
        mode = "L"
    if mode == "P":
        # A palette with a transparent index must be composited like RGBA.
        mode = "RGBA" if "transparency" in image.info else "RGB"
        image = image.convert(mode)
    if mode in ("PA", "LA", "La", "RGBa", "RGBA"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV, RGB


def _high_depth_to_l(image: Image.Image) -> Image.Image:
    """16/32-bit gray -> 8-bit, keeping relative brightness (PIL's own convert clips at 255)."""
    array = np.asarray(image, dtype=np.float64)
    if image.mode.startswith("I;16"):
        array = array / 257.0
    elif image.mode == "I":
        array = array / 257.0 if array.max(initial=0) > 255 else array
    else:  # "F": unknown range, stretch it
        lo, hi = float(array.min(initial=0)), float(array.max(initial=0))
        array = (array - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(array)
    return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8), mode="L")


def image_to_pixels(image: Image.Image, loaded: LoadedModel) -> torch.Tensor:
    """A PIL image -> pixel_values [1, C, H, W] at the model's resolution and normalization."""
    if loaded.image_size is None:
        raise InputError(f"{loaded.info.name} takes text, not images.")
    config = loaded.model.config
    if getattr(config, "digits_preprocessing", None) is not None:
        pixels = _digits_pixels(image, loaded.image_size, config.digits_preprocessing)
    elif getattr(loaded, "image_processor", None) is not None:
        pixels = loaded.image_processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
    else:
        # No processor (random models, bare local dirs): ViT's usual 0.5 / 0.5 normalization.
        mode = "L" if loaded.image_channels == 1 else "RGB"
        resized = image.convert(mode).resize((loaded.image_size, loaded.image_size), Image.Resampling.BICUBIC)
        array = np.asarray(resized, dtype=np.float32).reshape(loaded.image_size, loaded.image_size, -1)
        pixels = (torch.from_numpy(array).permute(2, 0, 1)[None] / 255.0 - 0.5) / 0.5
    return pixels.to(own_dtype(loaded.model))


def _digits_pixels(image: Image.Image, size: int, preprocessing: dict) -> torch.Tensor:
    """Make any picture look like a scikit-learn digit: light strokes on black, 0..16, 8x8.

    Inversion heuristic: digits are light-on-dark, most drawings and scans are dark-on-light.
    The outer ring of pixels is almost always background, so if its median brightness is
    above mid-gray the picture is inverted. Larger pictures are then cropped to the ink's
    bounding box, padded to a square (no margin: the digits fill their frame) and
    box-averaged down, which is how the digits were made (4x4 block counts of a
    size-normalized 32x32 bitmap). On test digits upscaled to 128x128 and inverted, this
    path keeps 94 % accuracy (97.8 % on the native 8x8 images). Finally the
    brightest pixel is stretched to 16: in the digits, strokes saturate at 16, while a thin
    pen stroke averaged over a block would otherwise stay faint.
    """
    gray = np.asarray(image.convert("L"), dtype=np.float32)
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    if np.median(border) > 127.5:
        gray = 255.0 - gray
    if gray.shape != (size, size):
        gray = _fit_ink(gray)
        resized = Image.fromarray(gray.astype(np.uint8), mode="L").resize((size, size), Image.Resampling.BOX)
        gray = np.asarray(resized, dtype=np.float32)
        if gray.max() > 0:
            gray = gray * (255.0 / gray.max())
    # The constants travel in the model's config.json, so a retrained model brings its own.
    scale, mean, std = preprocessing["scale"], preprocessing["mean"], preprocessing["std"]
    raw = torch.from_numpy(gray / 255.0 * scale)[None, None]  # digits' own 0..16 range
    return (raw / scale - mean) / std


def _fit_ink(gray: np.ndarray, threshold: float = 32.0, margin: float = 0.0) -> np.ndarray:
    """Crop to the bounding box of pixels brighter than threshold, centred in a square."""
    rows, cols = np.nonzero(gray > threshold)
    if len(rows) == 0:
        return gray  # no ink: leave the picture alone rather than zoom into noise
    crop = gray[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    side = int(round(max(crop.shape) * (1 + 2 * margin)))
    canvas = np.zeros((side, side), dtype=np.float32)
    top, left = (side - crop.shape[0]) // 2, (side - crop.shape[1]) // 2
    canvas[top : top + crop.shape[0], left : left + crop.shape[1]] = crop
    return canvas


# --- texts ---


def model_window(loaded: LoadedModel) -> int | None:
    """The longest input the model can take, in tokens (None if unbounded/unknown)."""
    limits = []
    tokenizer_limit = getattr(loaded.tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and tokenizer_limit < 1_000_000:  # HF uses 1e30 for "unset"
        limits.append(tokenizer_limit)
    positions = getattr(loaded.model.config, "max_position_embeddings", None)
    if isinstance(positions, int):
        limits.append(positions)
    return min(limits) if limits else None


def takes_text(loaded: LoadedModel) -> bool:
    """Whether the model reads token ids (with or without a tokenizer) rather than pixels."""
    return loaded.image_size is None


DEFAULT_N_TOKENS = 12  # token ids drawn when a text model has no tokenizer and no text is given


def prepare_text(
    text: str, loaded: LoadedModel, max_tokens: int | None = None, limit_reason: str = "the chosen limit"
) -> tuple[dict[str, torch.Tensor], str | None]:
    """Text -> (encoding of [1, T] tensors, truncation notice or None). limit_reason: what the notice calls
    max_tokens when it is what truncates (a caller that chose no limit names its own, e.g. the app's).

    With a tokenizer: the tokenizer's ids. Without one (random:* models, weights-only directories):
    each whitespace-separated word becomes one vocabulary id, a hash of the word, so the same text
    always gives the same ids and a repeated word the same id.
    """
    if not takes_text(loaded):
        raise InputError(f"{loaded.info.name} takes images, not text.")
    if not isinstance(text, str) or not text.strip():
        raise InputError("Please enter some text: the input is empty.")
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"Text is too long ({len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}).")
    window = model_window(loaded)
    limit = min(x for x in (window, max_tokens) if x is not None) if (window or max_tokens) else None
    if loaded.tokenizer is None:
        return _hashed_words(text, loaded, limit, "the model's window" if limit == window else limit_reason)

    full_length = len(loaded.tokenizer(text, truncation=False, verbose=False)["input_ids"])
    if full_length == 0:
        raise InputError(f"The tokenizer of {loaded.info.name} turns this text into no tokens at all.")
    notice = None
    if limit is not None and full_length > limit:
        reason = "the model's window" if limit == window else limit_reason
        notice = f"Text truncated to {limit} tokens ({reason}); {full_length - limit} tokens were dropped."
    encoding = loaded.tokenizer(
        text, truncation=limit is not None, max_length=limit, return_tensors="pt", verbose=False
    )
    return dict(encoding), notice


def _hashed_words(text: str, loaded: LoadedModel, limit: int | None, reason: str):
    import hashlib

    vocab = _vocab_size(loaded)
    words = text.split()
    notice = None
    if limit is not None and len(words) > limit:
        notice = f"Text truncated to {limit} tokens ({reason}); {len(words) - limit} tokens were dropped."
        words = words[:limit]
    ids = [int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:8], "little") % vocab for word in words]
    ids_tensor = torch.tensor([ids], dtype=torch.long)
    return {"input_ids": ids_tensor, "attention_mask": torch.ones_like(ids_tensor)}, notice


def _vocab_size(loaded: LoadedModel) -> int:
    vocab = getattr(loaded.model.config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise InputError(f"{loaded.info.name} has no vocabulary size in its config; cannot draw token ids.")
    return vocab


def token_ids(loaded: LoadedModel, n_tokens: int = DEFAULT_N_TOKENS, seed: int = 0) -> dict[str, torch.Tensor]:
    """n_tokens ids drawn uniformly from the model's vocabulary by a generator seeded with `seed`.

    The same (model vocabulary, n_tokens, seed) always gives the same ids, tokenizer or not.
    """
    if not takes_text(loaded):
        raise InputError(f"{loaded.info.name} takes images, not token ids.")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise InputError(f"The number of tokens must be a whole number of at least 1, got {n_tokens!r}.")
    window = model_window(loaded)
    if window is not None and n_tokens > window:
        raise InputError(f"{n_tokens} tokens do not fit the model's window of {window}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise InputError(f"The seed must be a whole number from 0 to 2**63-1, got {seed!r}.")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, _vocab_size(loaded), (1, n_tokens), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def token_labels(loaded: LoadedModel, ids) -> list[str]:
    """What to print for each id: the tokenizer's string, or `#17` when the model has no tokenizer."""
    ids = [int(i) for i in (ids.flatten().tolist() if isinstance(ids, torch.Tensor) else ids)]
    if loaded.tokenizer is None:
        return [f"#{i}" for i in ids]
    return [loaded.tokenizer.decode([i]) for i in ids]


# --- samples ---

SAMPLE_DIGITS = (0, 3, 5, 8)  # first held-out example of each of these classes


def sample_images() -> dict[str, Image.Image]:
    """Sample pictures, name -> RGB image. Names state their origin.

    Digits are native 8x8 images from the held-out TEST split of scikit-learn's digits
    (never seen in training), brightness 0..16 mapped to 0..255; upscale them for display
    with nearest-neighbour. Photos are scikit-learn's two bundled sample images.
    """
    from sklearn.datasets import load_sample_images

    samples: dict[str, Image.Image] = {}
    _, _, test_x, test_y = digits.digits_split(raw=True)
    _, test_idx = digits.split_indices()
    for label in SAMPLE_DIGITS:
        position = int((test_y == label).nonzero()[0])
        values = np.rint(test_x[position, 0].numpy() * 255.0 / digits.PIXEL_SCALE).astype(np.uint8)
        name = f"Digit {label} (scikit-learn digits, test split, image #{int(test_idx[position])})"
        samples[name] = Image.fromarray(values, mode="L").convert("RGB")
    photos = load_sample_images()
    for filename, array in zip(photos.filenames, photos.images, strict=True):
        samples[f"Photo {Path(filename).name} (scikit-learn sample image)"] = Image.fromarray(array)
    return samples


def photo_credits() -> dict[str, str]:
    """Sample photo name (as in sample_images) -> its credit line, read from scikit-learn's own
    sklearn/datasets/images/README.txt (the photos are CC BY 2.0 and ask for attribution).

    For each image the README gives an attribution line, the licence and the page the photo was taken from;
    all three are shown. Where the account of the source page differs from the attributed name (the README
    gives danielbuechele for both photos, while flower.jpg's page belongs to another account), that account is
    named too, so the credit never hides what the source says.
    """
    import re
    from importlib import resources

    try:
        text = (resources.files("sklearn.datasets") / "images" / "README.txt").read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, OSError):
        return {}
    credits = {}
    for block in re.split(r"\n\s*\n(?=Image:)", text.strip()):
        name = re.search(r"^Image:\s*(\S+)", block, re.M)
        who = re.search(r"^Attribution:\s*(?:Some rights reserved by\s*)?(.+?)\s*\[\d\]\s*$", block, re.M)
        notes = dict(re.findall(r"^\[(\d)\]\s*(\S+)\s*$", block, re.M))
        if not (name and who):
            continue
        licence_url = next((u for u in notes.values() if "creativecommons.org/licenses/" in u), "")
        version = re.search(r"/licenses/([a-z-]+)/([\d.]+)", licence_url)
        licence = f"CC {version.group(1).upper()} {version.group(2)}" if version else "a Creative Commons licence"
        source = next((u for u in notes.values() if "/photos/" in u and u.rstrip("/").count("/") > 4), "")
        account = re.search(r"/photos/([^/]+)/", source)
        author = who.group(1).strip()
        line = f"Photo {name.group(1)}: by {author}"
        if account and account.group(1) != author:
            line += f" (scikit-learn's attribution; the source page belongs to {account.group(1)})"
        line += f", {licence}" + (f" ({licence_url})" if licence_url else "")
        line += (f", from {source}" if source else "") + ", shipped with scikit-learn."
        credits[f"Photo {name.group(1)} (scikit-learn sample image)"] = line
    return credits


def sample_texts() -> dict[str, str]:
    """Short texts written for this project (perm_core/data/samples/texts.json), name -> text."""
    payload = shipped_json("samples", "texts.json")
    return dict(payload["texts"])
