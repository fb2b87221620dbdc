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


def head_places(paths, head: int, column: int) -> list[tuple[int, int]]:
    """(row of the head grid, place) of the followed head in one column (0 original, 1 scrambled, 2 un-scrambled):
    each drawn layer's own head path (paths[row]) says where its element put that head."""
    places = []
    for row, path in enumerate(paths):
        place = path.path(head)[column] if path.item == "head" and 0 <= head < path.size else None
        if place is not None:
            places.append((row, place))
    return places


def head_sentence(paths, layers, head: int, column: int) -> str:
    """One plain sentence of where the followed head is in a column of head grids, from the places outlined there."""
    here = head_places(paths, head, column)
    if column == 0:
        return f"Head {head} of every layer is outlined." if here else ""
    moved = [(layers[row], place) for row, place in here if place != head]
    back = {place for _, place in head_places(paths, head, 2)}
    if not moved:
        return f"The key left head {head} in its place in every layer."
    places = [f"{place} in layer {layer}" for layer, place in moved]
    where = "place " + (places[0] if len(places) == 1 else ", ".join(places[:-1]) + " and " + places[-1])
    stayed = len(here) - len(moved)
    tail = f" (it stayed in {stayed} layer{'s' if stayed != 1 else ''})" if stayed else ""
    comes_back = f"; the inverse puts it back in place {back.pop()}" if len(back) == 1 else ""
    return f"The key moved head {head} to {where}{tail}{comes_back}."


def channel_heatmap_paths(x: dict, column: int) -> tuple[list, list, str]:
    """(row outlines, column outlines, sentence) of the channels step's map in one column: Explore's own
    placement and words (ui.explore_panels.placed, path_sentence) of the followed channel."""
    rows_at, cols_at = panels.placed(x["paths"], x["follow"], column)
    return rows_at, cols_at, panels.path_sentence(x["paths"], x["follow"], column)
