"""The Guided walk's followed patch, channel and head: in each column the outline sits where the key's own permutation
(perm_core.engine.symmetries.build, not the walk) sends the original position, and back; the tensors drawn there
hold the followed item's values; a wrong permutation is caught."""

import re

import numpy as np
import pytest
import torch

from perm_core.engine import symmetries
from perm_core.explore.exploration import Exploration
from perm_core.explore.walk import run_step
from perm_core.models.defaults import default_inputs
from perm_core.models.registry import load_model
from ui import explore_panels as panels
from ui import walk_panels
from ui.charts.figures_attention import head_grid_figure
from ui.charts.figures_heatmap import heatmap


@pytest.fixture(scope="module")
def explorer():
    loaded = load_model("digits-vit", dtype=torch.float64)
    return Exploration(loaded.model, default_inputs(loaded))


def key_permutation(explorer, symmetry: str, key: int, layer: int | None = None) -> list[int]:
    """New position i holds original item index[i], as the key itself builds it."""
    element = symmetries.build(symmetry, key, explorer.geometry, explorer.n_tokens)
    if symmetry == "tokens":
        return element.tokens.index.tolist()
    space = ("resid", None) if symmetry == "channels" else ("heads", layer)
    return element.spaces[space][0].index.tolist()


def assert_follows(places, permutation: list[int], item: int) -> None:
    """places: where the item is drawn in the original, scrambled and un-scrambled columns."""
    assert list(places) == [item, permutation.index(item), item], (places, item)


def another_permutation(explorer, symmetry: str, key: int, item: int, layer: int | None = None) -> list[int]:
    """A permutation of the same space (another key's) that sends `item` elsewhere: the negative control."""
    want = key_permutation(explorer, symmetry, key, layer).index(item)
    return next(p for p in (key_permutation(explorer, symmetry, k, layer) for k in range(key + 1, key + 50))
                if p.index(item) != want)


@pytest.mark.parametrize("key", [5, 1234])
def test_the_followed_patch_goes_where_the_tokens_key_sends_it_and_back(explorer, key):
    x = run_step(explorer, "tokens", key).extra
    fixed, token = explorer.geometry.fixed_tokens, x["follow"]["token"]
    patches = [panels.followed_patch(x["tokens"], x["follow"], i, fixed) for i in range(3)]
    permutation = key_permutation(explorer, "tokens", key)
    assert_follows([p + fixed for p in patches], permutation, token)
    assert patches[1] != patches[0]  # the walk follows a patch the key moves
    size = explorer.geometry.patch_size
    cols = x["patch_grid"][1]

    def patch_pixels(pixels, patch):
        row, col = divmod(patch, cols)
        return pixels[0, :, row * size:(row + 1) * size, col * size:(col + 1) * size]

    original, shuffled, back = x["pictures"]
    assert torch.equal(patch_pixels(shuffled, patches[1]), patch_pixels(original, patches[0]))  # the pixels moved
    assert torch.equal(back, original)
    with pytest.raises(AssertionError):
        assert_follows([p + fixed for p in patches], another_permutation(explorer, "tokens", key, token), token)


@pytest.mark.parametrize("key", [5, 77])
def test_the_followed_channel_is_outlined_where_the_channels_key_sends_it(explorer, key):
    x = run_step(explorer, "channels", key).extra
    channel = x["follow"]["channel"]
    drawn = []
    for i, matrix in enumerate(x["hidden"]):
        rows_at, cols_at, sentence = walk_panels.channel_heatmap_paths(x, i)
        fig = heatmap(matrix, "t", row_paths=rows_at, col_paths=cols_at)
        (shape,) = [s for s in fig.layout.shapes if s.name.startswith("path ")]
        place = round((shape.x0 + shape.x1) / 2)
        assert shape.name == f"path channel {place}" and rows_at == []  # the channels key moves no token
        assert [int(n) for n in re.findall(r"\d+", sentence)] == [channel, place]
        drawn.append(place)
    permutation = key_permutation(explorer, "channels", key)
    assert_follows(drawn, permutation, channel)
    original, scrambled, _ = (h.numpy() for h in x["hidden"])
    # the outlined column of the scrambled map holds the followed channel's values (round-off apart)
    assert np.abs(scrambled[:, drawn[1]] - original[:, channel]).max() < 1e-12 * np.abs(original).max()
    assert np.abs(scrambled[:, drawn[0]] - original[:, channel]).max() > 1e-3 or drawn[1] == drawn[0]
    with pytest.raises(AssertionError):
        assert_follows(drawn, another_permutation(explorer, "channels", key, channel), channel)


@pytest.mark.parametrize("key", [5, 99])
def test_the_followed_head_is_outlined_where_each_layers_heads_key_sends_it(explorer, key):
    x = run_step(explorer, "heads", key).extra
    grid, head = x["grid"], x["follow"]["head"]
    cells = grid.original.shape[-1]
    drawn = {}  # row -> [place in the original, in the scrambled grid, un-scrambled]
    for i, maps in enumerate((grid.original, grid.scrambled)):
        fig = head_grid_figure(maps, grid.layers, "t", followed=panels.head_places(x["paths"], head, i))
        for shape in (s for s in fig.layout.shapes if s.name.startswith("path ")):
            row, place = round(shape.y0 + 0.5) // (cells + 1), round(shape.x0 + 0.5) // (cells + 1)
            assert shape.name == f"path head {place}"
            drawn.setdefault(row, []).append(place)
    for row, layer in enumerate(grid.layers):
        places = drawn[row] + [dict(panels.head_places(x["paths"], head, 2))[row]]
        permutation = key_permutation(explorer, "heads", key, layer)
        assert_follows(places, permutation, head)
        assert torch.allclose(grid.scrambled[row, places[1]], grid.original[row, head], atol=1e-12)  # its map
        with pytest.raises(AssertionError):
            assert_follows(places, another_permutation(explorer, "heads", key, head, layer), head)
    sentence = panels.head_sentence(x["paths"], grid.layers, head, 1)
    moved = [(layer, drawn[row][1]) for row, layer in enumerate(grid.layers) if drawn[row][1] != head]
    assert all(f"{place} in layer {layer}" in sentence for layer, place in moved) and moved
    assert sentence.endswith(f"the inverse puts it back in place {head}.")


def test_the_followed_patch_ring_is_white_black_white_and_touches_no_other_patch(explorer):
    """The mosaic's ring (ui.charts.figures_input.mosaic_image): across its width white, black, white, about a fifth
    of a patch in all, inside the followed patch only; another patch's ring is elsewhere."""
    from ui.charts.figures_input import mosaic_image, outline_width

    pixels, size = explorer.subject.inputs["pixel_values"], explorer.geometry.patch_size
    plain = np.asarray(mosaic_image(pixels, size, 220))
    ringed = np.asarray(mosaic_image(pixels, size, 220, patch=9))
    step = plain.shape[0] // 4  # 4x4 patches
    width, third = outline_width(step), outline_width(step) // 3
    assert step / 6 <= width <= step / 4 and width % 3 == 0
    top, left = 2 * step, 1 * step  # patch 9: row 2, column 1
    middle = ringed[top + step // 2, left:left + width]
    assert (middle[:third] == 255).all() and (middle[third:2 * third] == 17).all() and (middle[2 * third:] == 255).all()
    changed = np.argwhere((ringed != plain).any(axis=-1))
    assert changed.min(axis=0).tolist() >= [top, left] and changed.max(axis=0).tolist() < [top + step, left + step]
    other = np.argwhere((np.asarray(mosaic_image(pixels, size, 220, patch=10)) != plain).any(axis=-1))
    assert other.min(axis=0)[1] >= left + step  # the control: patch 10's ring is in the next column


def test_the_head_grid_is_derived_once_per_result_and_each_result_keeps_its_own(explorer):
    """A class opening one link shares one result: its head grid is derived once and kept with it. Another key's
    result keeps its own grid (a grid kept per model instead would show the first key's heads: the control)."""
    from perm_core.explore.exploration import _head_grid, head_grid

    first, second = explorer.run({"heads": 5}), explorer.run({"heads": 1234})
    grid = head_grid(explorer, first)
    assert head_grid(explorer, first) is grid  # derived once
    fresh = _head_grid(explorer, first, 12, 12)
    assert torch.equal(grid.original, fresh.original) and torch.equal(grid.scrambled, fresh.scrambled)
    assert grid.holds == fresh.holds
    other = head_grid(explorer, second)
    assert other is not grid and torch.equal(other.original, grid.original)  # the original's maps: one for every key
    assert other.holds == [key_permutation(explorer, "heads", 1234, layer) for layer in other.layers]
    assert other.holds != grid.holds and not torch.equal(other.scrambled, grid.scrambled)
