"""The model's input as pictures: a pixel batch as RGB, a patch mosaic with its grid, tokens as coloured chips,
an image as a data URI."""

from __future__ import annotations

import numpy as np

from ui.charts.figures import to_numpy
from ui.charts.figures_path import PATH_COLORS


def pixels_to_rgb(pixels) -> np.ndarray:
    """A normalized pixel batch [1, C, H, W] -> an RGB uint8 array [H, W, 3], stretched to its own min..max.

    A permutation of patches keeps the min and max, so scrambled pixels get exactly the original's colours.
    """
    array = to_numpy(pixels)[0]
    lo, hi = float(array.min()), float(array.max())
    array = (array - lo) / (hi - lo) if hi > lo else np.zeros_like(array)
    array = (np.moveaxis(array, 0, -1) * 255).round().astype(np.uint8)
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return array


def mosaic_image(pixels, patch_size: int, display: int = 240, smooth: bool = False, patch: int | None = None):
    """A normalized pixel batch [1, C, H, W] -> an upscaled PIL image with its patch grid drawn. smooth: a grey
    picture as dark ink on white, upscaled smoothly (an 8x8 digit drawn as white squares on black is not
    recognisable); the grid lines then thin and light. patch: a followed patch (row-major number), outlined as the
    charts outline a followed token (black between white rings, see outline_width)."""
    from PIL import Image, ImageDraw

    array = pixels_to_rgb(pixels)
    if smooth and bool((array[..., 0] == array[..., 1]).all() and (array[..., 1] == array[..., 2]).all()):
        array = 255 - array
    height, width = array.shape[:2]
    scale = max(1, display // max(height, width))
    image = Image.fromarray(array).resize((width * scale, height * scale),
                                          Image.Resampling.BICUBIC if smooth else Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(image)
    grid = (255, 200, 120) if smooth else (255, 160, 0)
    step = patch_size * scale
    for offset in range(step, width * scale, step):
        draw.line([(offset, 0), (offset, height * scale)], fill=grid, width=1)
    for offset in range(step, height * scale, step):
        draw.line([(0, offset), (width * scale, offset)], fill=grid, width=1)
    if patch is not None:
        row, col = divmod(patch, width // patch_size)
        box = [col * step, row * step, (col + 1) * step - 1, (row + 1) * step - 1]
        third = outline_width(step) // 3  # white, black, white: the ring shows on black and on white pixels alike
        draw.rectangle(box, outline=(255, 255, 255), width=3 * third)
        draw.rectangle([box[0] + third, box[1] + third, box[2] - third, box[3] - third], outline=(17, 17, 17),
                       width=third)
    return image


def outline_width(step: int) -> int:
    """The followed patch's ring in a mosaic of `step`-pixel patches: about a fifth of a patch (6 pixels at least),
    so it still reads on a projector when the picture is drawn at two thirds of its size; a multiple of 3."""
    return 3 * max(2, round(step / 15))


def token_chips(tokens: list[str], origins: list[int], followed: int | None = None) -> str:
    """HTML: tokens as coloured chips; the colour follows each token's original position. followed: the original
    position of a followed token, its chip outlined as the charts outline it."""
    import html

    n = max(len(tokens), 1)
    chips = []
    for token, origin in zip(tokens, origins, strict=True):
        hue = int(300 * origin / n)
        outline = (f"outline:2.5px solid {PATH_COLORS['token']};box-shadow:0 0 0 4px white;font-weight:bold;"
                   if origin == followed else "")
        chips.append(f'<span style="background:hsl({hue},70%,85%);color:#111;border-radius:4px;padding:1px 4px;'
                     f'margin:1px;display:inline-block;font-family:monospace;font-size:0.85em;{outline}" '
                     f'title="original position {origin}">{html.escape(token)}</span>')
    return '<div style="line-height:1.9">' + "".join(chips) + "</div>"


def image_data_uri(rgb: np.ndarray, exact: bool | None = None) -> str:
    """An RGB array as a data URI: PNG when exact (by default for small pictures: every pixel kept), else JPEG
    (photos: a sixth of the bytes)."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    kind = "png" if (rgb.shape[0] * rgb.shape[1] <= 4096 if exact is None else exact) else "jpeg"
    Image.fromarray(rgb).save(buffer, format=kind.upper(), **({"optimize": True} if kind == "png" else {
        "quality": 90}))
    return f"data:image/{kind};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
