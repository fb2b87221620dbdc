"""The Guided walk's followed item: where the key sent one patch or one head, drawn and said as Explore draws and
says it (ui.explore_panels), from the element's own transform of its space (perm_core.explore.path.AxisPath)."""

from __future__ import annotations

from ui import explore_panels as panels
from ui.charts.figures_input import mosaic_image

PICTURE_TITLES = ("the digit", "shuffled, key {key}", "shuffled back")  # one line each: the sentences below line up


def followed_pictures(columns, x: dict, patch_size: int, fixed_tokens: int, key: int) -> None:
    """The digit, its patches shuffled and shuffled back (x: the tokens step's extra), each with the followed token's
    patch outlined where the key put it, and one sentence of where that is."""
    tokens, follow = x["tokens"], x["follow"]
    start = panels.followed_patch(tokens, follow, 0, fixed_tokens)
    for i, (column, pixels, title) in enumerate(zip(columns, x["pictures"], PICTURE_TITLES, strict=True)):
        patch = panels.followed_patch(tokens, follow, i, fixed_tokens)
        column.image(mosaic_image(pixels, patch_size, 220, patch=patch), caption=title.format(key=key))
        if patch is not None and x["patch_grid"] is not None:
            column.caption(panels.patch_sentence(follow["token"], patch, x["patch_grid"][1], i, stayed=patch == start))


def channel_heatmap_paths(x: dict, column: int) -> tuple[list, list, str]:
    """(row outlines, column outlines, sentence) of the channels step's map in one column: Explore's own
    placement and words (ui.explore_panels.placed, path_sentence) of the followed channel."""
    rows_at, cols_at = panels.placed(x["paths"], x["follow"], column)
    return rows_at, cols_at, panels.path_sentence(x["paths"], x["follow"], column)
