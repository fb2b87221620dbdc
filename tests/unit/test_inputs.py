"""The input pipeline: every kind of image and text a visitor may hand us."""

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from perm_core.data import shipped_json
from perm_core.models import digits, inputs, registry
from perm_core.models.inputs import InputError
from tests import bad_files
from ui.sidebar import frame_count, image_from_upload


@pytest.fixture(scope="module")
def digits_vit():
    return registry.load_model("digits-vit")


@pytest.fixture(scope="module")
def minilm():
    return registry.load_model("minilm")


def png_bytes(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **params)
    return buffer.getvalue()


def digit_drawing() -> Image.Image:
    """A black '1'-like bar on white paper, as a visitor would draw it."""
    canvas = Image.new("L", (120, 160), 255)
    canvas.paste(0, (50, 20, 70, 140))
    return canvas


# --- bad inputs ---


def _png_declaring(width: int, height: int) -> bytes:
    """A tiny real PNG whose IHDR is patched to declare width x height (CRC fixed up)."""
    data = bytearray(png_bytes(Image.new("L", (4, 4), 0)))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def _refused() -> dict[str, tuple[bytes, str]]:
    """Every bad upload the pages are tested with (tests/bad_files.py), and a few more: name -> (bytes, message)."""
    cases = {name: (data, message) for name, (data, _, message) in bad_files.refused().items()}
    cases["paper.pdf"] = (b"%PDF-1.4 definitely not a picture" * 10, "not an image")
    noise = png_bytes(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)))
    cases["half.png"] = (noise[: len(noise) // 2], "corrupt or truncated")
    # declared sizes only: 7000^2 is under PIL's own bomb limit, over ours
    for side in (20_000, 7_000):
        cases[f"declares-{side}x{side}.png"] = (_png_declaring(side, side), "megapixels (possible decompression bomb)")
    return cases


@pytest.mark.parametrize("name", list(_refused()))
def test_bad_bytes_are_refused_with_one_line_naming_the_file(name):
    """The loader's message for each bad upload, and the line the pages show for it (the file's name first)."""
    data, message = _refused()[name]
    with pytest.raises(InputError) as caught:
        inputs.load_image(data)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    image, shown = image_from_upload(name, data)
    assert image is None and shown == f"{name}: {caught.value}"


@pytest.mark.parametrize("name", list(bad_files.accepted()))
def test_odd_but_valid_uploads_load_as_rgb(name):
    data, _ = bad_files.accepted()[name]
    image, problem = image_from_upload(name, data)
    assert problem is None and image.mode == "RGB" and image.size in ((48, 48), (64, 64))
    assert frame_count(data) == (3 if name == "animated.gif" else 1)


def test_file_size_limit(tmp_path):
    with pytest.raises(InputError, match="too large"):
        inputs.load_image(b"\0" * 2048, max_bytes=1024)
    path = tmp_path / "big.png"
    path.write_bytes(b"\0" * 2048)
    with pytest.raises(InputError, match="too large"):
        inputs.load_image(path, max_bytes=1024)
    with pytest.raises(InputError, match="No such image file"):
        inputs.load_image(tmp_path / "missing.png")


# --- image modes ---


def _modes() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    rgb = Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
    rgba = rgb.convert("RGBA")
    rgba.putalpha(0)  # fully transparent: must come out white
    sixteen = Image.fromarray(np.arange(30 * 40, dtype=np.uint16).reshape(30, 40) * 50)
    cmyk = io.BytesIO()
    rgb.convert("CMYK").save(cmyk, format="JPEG")
    return {
        "L": png_bytes(rgb.convert("L")),
        "1": png_bytes(rgb.convert("1")),
        "RGBA": png_bytes(rgba),
        "P": png_bytes(rgb.convert("P")),
        "CMYK": cmyk.getvalue(),
        "I;16": png_bytes(sixteen),
        "RGB": png_bytes(rgb),
    }


@pytest.mark.parametrize("mode", list(_modes()))
def test_every_mode_loads_as_rgb_and_feeds_the_model(mode, digits_vit):
    data = _modes()[mode]
    assert Image.open(io.BytesIO(data)).mode.startswith(mode[:1])  # the fixture really is that mode
    image = inputs.load_image(data)
    assert image.mode == "RGB" and image.size == (40, 30)
    pixels = inputs.image_to_pixels(image, digits_vit)
    assert pixels.shape == (1, 1, 8, 8) and pixels.dtype == torch.float32
    assert torch.isfinite(pixels).all()
    assert pixels.min() >= digits.normalize_pixels(torch.tensor(0.0)) - 1e-6
    assert pixels.max() <= digits.normalize_pixels(torch.tensor(16.0)) + 1e-6


def test_transparent_pixels_become_white():
    rgba = Image.new("RGBA", (10, 10), (255, 0, 0, 0))
    assert inputs.load_image(png_bytes(rgba)).getpixel((5, 5)) == (255, 255, 255)


def test_sixteen_bit_keeps_its_brightness():
    array = np.full((8, 8), 65535, dtype=np.uint16)
    array[:4] = 32896  # about half
    image = inputs.load_image(png_bytes(Image.fromarray(array)))
    assert image.getpixel((0, 7)) == (255, 255, 255)
    assert image.getpixel((0, 0)) == (128, 128, 128)


def test_exif_orientation_is_applied():
    wide = Image.new("RGB", (60, 20), (0, 0, 0))
    wide.paste((255, 255, 255), (0, 0, 10, 20))  # a white stripe on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    buffer = io.BytesIO()
    wide.save(buffer, format="JPEG", exif=exif.tobytes(), quality=95)
    upright = inputs.load_image(buffer.getvalue())
    assert upright.size == (20, 60)
    assert upright.getpixel((10, 3))[0] > 200 and upright.getpixel((10, 57))[0] < 50  # stripe now on top


# --- digits pipeline ---


def test_sample_digits_round_trip_to_the_split(digits_vit):
    samples = inputs.sample_images()
    _, _, test_x, test_y = digits.digits_split()
    _, test_idx = digits.split_indices()
    names = [n for n in samples if n.startswith("Digit")]
    assert len(names) == len(inputs.SAMPLE_DIGITS)
    for name in names:
        image_number = int(name.rsplit("#", 1)[1].rstrip(")"))
        position = list(test_idx).index(image_number)
        pixels = inputs.image_to_pixels(samples[name], digits_vit)
        # 0..16 stored as 0..255 integers: at most half a gray level (of 255) off
        assert torch.allclose(pixels[0], test_x[position], atol=0.5 / 255 / digits.PIXEL_STD + 1e-6)
        label = int(name.split()[1])
        assert test_y[position] == label
        assert digits_vit.model(pixel_values=pixels).logits.argmax().item() == label


def test_dark_on_light_drawing_is_inverted_and_centred(digits_vit):
    pixels = inputs.image_to_pixels(digit_drawing(), digits_vit)
    raw = (pixels[0, 0] * digits.PIXEL_STD + digits.PIXEL_MEAN) * digits.PIXEL_SCALE
    # strokes light, background dark, like the digits; the bar sits in the middle columns
    assert raw[:, 3:5].mean() > 10 and raw[:, :2].max() < 1 and raw[:, 6:].max() < 1
    assert digits_vit.model(pixel_values=pixels).logits.argmax().item() == 1


def test_photos_come_from_scikit_learn():
    samples = inputs.sample_images()
    photos = {n: im for n, im in samples.items() if n.startswith("Photo")}
    assert {n.split()[1] for n in photos} == {"china.jpg", "flower.jpg"}
    assert all(im.size == (640, 427) and im.mode == "RGB" for im in photos.values())


def test_text_model_refuses_images(minilm):
    with pytest.raises(InputError, match="takes text"):
        inputs.image_to_pixels(digit_drawing(), minilm)


# --- texts ---


@pytest.mark.parametrize("text", ["", "   \n\t  "])
def test_empty_text_is_refused(text, minilm):
    with pytest.raises(InputError, match="empty"):
        inputs.prepare_text(text, minilm)


def test_image_model_refuses_text(digits_vit):
    with pytest.raises(InputError, match="takes images"):
        inputs.prepare_text("hello", digits_vit)


def test_short_text_is_untouched(minilm):
    encoding, notice = inputs.prepare_text("A man is playing a guitar.", minilm)
    assert notice is None
    assert set(encoding) >= {"input_ids", "attention_mask"}
    ids = encoding["input_ids"]
    assert ids.shape == (1, 9) and ids[0, 0] == minilm.tokenizer.cls_token_id
    assert ids[0, -1] == minilm.tokenizer.sep_token_id


def test_long_text_is_truncated_with_a_notice(minilm):
    text = " ".join(f"word{i % 10}" for i in range(2500))  # "word3" is two tokens: 5000 + 2 specials
    full = len(minilm.tokenizer(text, verbose=False)["input_ids"])
    assert full == 5002
    encoding, notice = inputs.prepare_text(text, minilm)
    assert encoding["input_ids"].shape == (1, 512)
    assert encoding["input_ids"][0, -1] == minilm.tokenizer.sep_token_id
    assert notice == f"Text truncated to 512 tokens (the model's window); {full - 512} tokens were dropped."
    encoding, notice = inputs.prepare_text(text, minilm, max_tokens=64)
    assert encoding["input_ids"].shape == (1, 64)
    assert notice.startswith("Text truncated to 64 tokens (the chosen limit)")


def test_sample_texts_have_an_origin():
    payload = shipped_json("samples", "texts.json")
    assert "Written for" in payload["origin"]
    texts = inputs.sample_texts()
    assert texts == payload["texts"] and len(texts) >= 4
    assert all(isinstance(t, str) and t.strip() for t in texts.values())
