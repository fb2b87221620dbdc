"""The path a followed token, channel or MLP neuron takes across Explore's three columns: computed by the element
itself (perm_core.explore.path), equal to the key's own permutation, mixed (no single place) under a rotation;
where the page draws it (ui.explore_panels, ui.charts.figures_heatmap and figures_path); and the take-home summary's
numbers."""

import re

import numpy as np
import pytest
import torch

from perm_core.engine import symmetries
from perm_core.explore.exploration import Exploration
from perm_core.explore.mlp_view import mlp_view
from perm_core.explore.page_data import PageChoice, block_views, default_follow
from perm_core.explore.path import AxisPath, axis_path, column_order, default_token
from perm_core.models.input_spec import check_command, inputs_from_spec
from perm_core.models.registry import load_model
from ui import explore_panels as panels
from ui.charts.figures_heatmap import heatmap
from ui.summary import explore_summary


@pytest.fixture(scope="module")
def digits():
    loaded = load_model("digits-vit", dtype=torch.float64)
    inputs = inputs_from_spec(loaded, "digit:0")
    return Exploration(loaded.model, inputs), inputs


def views(explorer, inputs, keys, layer=1, weight="vit.layers.1.mlp.fc2.weight"):
    result = explorer.run(keys, None, layer)
    return result, block_views(explorer, result, PageChoice(layer, 0, weight), mlp_view(explorer, result, None, layer),
                               inputs, keys, None)


def test_every_path_is_the_keys_own_permutation_and_another_key_moves_it(digits):
    explorer, inputs = digits
    g, n = explorer.geometry, explorer.n_tokens
    seen = []
    for tokens_key in (7, 8):
        keys = {"tokens": tokens_key, "channels": 42, "mlp": 11}
        _, block = views(explorer, inputs, keys)
        token = symmetries.build("tokens", tokens_key, g, n).tokens.index.tolist()
        channel = symmetries.build("channels", 42, g, n).spaces[("resid", None)][0].index.tolist()
        neuron = symmetries.build("mlp", 11, g, n).spaces[("mlp", 1)][0].index.tolist()
        for item in range(n):
            want = (item, token.index(item), item)
            assert block.tokens.path(item) == block.hidden_paths[0].path(item) == want
            assert block.attention_paths[0].path(item) == block.attention_paths[1].path(item) == want
            assert block.mlp.paths[0].path(item) == want
        for item in range(g.d_model):
            want = (item, channel.index(item), item)
            assert block.hidden_paths[1].path(item) == block.weight.paths[0].path(item) == want  # fc2: resid rows
        for item in range(g.d_mlp):
            assert block.mlp.paths[1].path(item) == block.weight.paths[1].path(item) == (item, neuron.index(item), item)
        assert [p.item for p in (*block.hidden_paths, *block.attention_paths, *block.mlp.paths, *block.weight.paths)
                ] == ["token", "channel", "token", "token", "token", "neuron", "channel", "neuron"]
        seen.append([block.tokens.path(i)[1] for i in range(n)])
    assert seen[0] != seen[1]  # the control: another tokens key sends the tokens elsewhere


def test_a_rotation_leaves_no_single_place_and_an_off_key_no_move(digits):
    explorer, _ = digits
    g, n = explorer.geometry, explorer.n_tokens
    rotated = symmetries.build("rotation", 13, g, n)
    v = axis_path(("v", 0), g.n_heads * g.head_dim, rotated)
    assert v.item is None and v.held is None and v.path(3) == (3, None, None)
    assert axis_path("resid", g.d_model, rotated).path(5) == (5, 5, 5)  # rotations leave the residual stream
    fused = axis_path(None, 4, rotated)
    assert fused.item is None and fused.path(2) == (2, 2, 2)
    with pytest.raises(ValueError):
        axis_path("resid", g.d_model, rotated).path(g.d_model)


def test_the_app_picks_the_hottest_patch_and_the_loudest_channel_that_move(digits):
    explorer, inputs = digits
    attention = explorer.original["blocks.2.attn"].tensor[0, :, 0, 1:].mean(0)
    hidden = explorer.original["blocks.2.hidden"].tensor[0]
    hottest = [1 + int(i) for i in attention.argsort(descending=True)]
    loudest = [int(i) for i in hidden.abs().mean(0).argsort(descending=True)]
    assert default_follow(explorer, inputs) == {"token": hottest[0], "channel": loudest[0]}
    _, block = views(explorer, inputs, {"tokens": 7, "channels": 42, "mlp": 11})
    picks = default_follow(explorer, inputs, block)
    moved = [t for t in hottest if block.tokens.path(t)[1] != t]
    assert picks["token"] == moved[0] and picks["channel"] == next(
        c for c in loudest if block.hidden_paths[1].path(c)[1] != c)
    assert block.mlp.paths[1].path(picks["neuron"])[1] != picks["neuron"]
    # a permutation that leaves the hottest patch in place (and moves every other patch): the next hottest
    n = explorer.n_tokens
    others = [t for t in range(n) if t not in (0, hottest[0])]
    held = list(range(n))
    for k, t in enumerate(others):
        held[t] = others[(k + 1) % len(others)]
    back = [held.index(i) for i in range(n)]
    keeps_top = AxisPath("token", n, tuple(held), tuple(back))
    grid = attention.reshape(4, 4).numpy()
    assert keeps_top.path(hottest[0]) == (hottest[0], hottest[0], hottest[0])
    assert default_token(n, 1, grid, keeps_top) == hottest[1]
    identity = AxisPath("token", n, tuple(range(n)), tuple(range(n)))
    assert default_token(n, 1, grid, identity) == hottest[0]  # nothing moves: the hottest all the same
    assert default_token(n, 1, None, identity) == 1 and default_token(n, 1, None, keeps_top) == 1


def test_sorted_columns_draw_the_same_ramp_after_a_permutation():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 9))
    perm = rng.permutation(9)
    order, moved = column_order(values), column_order(values[:, perm])
    assert np.array_equal(values[:, list(order)], values[:, perm][:, list(moved)])
    assert np.all(np.diff(values[:, list(order)].mean(0)) >= 0)


def test_outlines_and_sentences_use_the_same_places(digits):
    explorer, inputs = digits
    _, block = views(explorer, inputs, {"tokens": 7, "channels": 42})
    follow = {"token": 4, "channel": 10}
    rows, cols = block.hidden_paths
    scrambled = (rows.path(4)[1], cols.path(10)[1])
    assert panels.placed(block.hidden_paths, follow, 1) == ([("token", scrambled[0])], [("channel", scrambled[1])])
    assert panels.path_sentence(block.hidden_paths, follow, 0) == (
        "In the original, token 4 is row 4 and channel 10 is column 10.")
    assert panels.path_sentence(block.hidden_paths, follow, 1) == (
        f"The keys moved token 4 to row {scrambled[0]} and channel 10 to column {scrambled[1]}.")
    assert panels.path_sentence(block.attention_paths, follow, 2) == (
        "The inverse puts token 4 back in row and column 4.")
    orders = panels.column_orders([np.arange(64.0)[None] % 7] * 3, "original")
    assert panels.placed(block.hidden_paths, follow, 1, orders)[1] == [("channel", orders[1].index(scrambled[1]))]
    fig = heatmap(np.zeros((17, 64)), "t", row_paths=[("token", scrambled[0])],
                  col_paths=[("channel", scrambled[1])])
    cores = [s for s in fig.to_plotly_json()["layout"]["shapes"] if s["name"].startswith("path ")]
    assert [((s["y0"] + s["y1"]) / 2 if s["xref"] == "x domain" else (s["x0"] + s["x1"]) / 2) for s in cores] == [
        scrambled[0], scrambled[1]]
    # a decimated map (a cell per block of rows / columns) outlines the cell that holds the place
    big = heatmap(np.zeros((300, 384)), "t", row_paths=[("token", 201)], col_paths=[("channel", 383)])
    row_step = big.data[0].y[1] - big.data[0].y[0]
    col_step = big.data[0].x[1] - big.data[0].x[0]
    row_shape, col_shape = [s for s in big.layout.shapes if s.name.startswith("path ")]
    assert row_shape.y0 <= 201 // row_step * row_step <= row_shape.y1 and row_shape.y1 - row_shape.y0 == row_step
    assert col_shape.x0 <= 383 // col_step * col_step <= col_shape.x1 and col_shape.x1 - col_shape.x0 == col_step
    assert panels.followed_patch(block.tokens, follow, 1, 1) == block.tokens.path(4)[1] - 1


def test_play_steps_one_block_and_stops_at_the_last():
    assert panels.next_layer(0, 3) == (1, True)
    assert panels.next_layer(1, 3) == (2, False)
    assert panels.next_layer(2, 3) == (2, False)
    assert panels.next_layer(0, 1) == (0, False)


def test_the_take_home_summary_carries_the_results_numbers(digits):
    explorer, inputs = digits
    from perm_core.explore.page_data import _proof_rows

    result = explorer.run({"tokens": 7, "channels": 42})
    command = check_command("digits-vit", "float64", {"tokens": 7, "channels": 42}, "digit:0", backward=False)
    rows = _proof_rows(explorer, result)
    text = explore_summary("digits-vit", "test digit #0", "tokens 7, channels 42", result, result.verdict(), rows,
                           command)
    assert text.startswith("# Explore: digits-vit (float64)") and "**Keys:** tokens 7, channels 42" in text
    assert f"**Verdict:** {result.verdict()}" in text and "none (the keys applied correctly)" in text
    figures_found = dict(re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", text, re.M))
    assert figures_found[f"scrambled differs from the original by (relative; {result.moved_what})"] == \
        f"{result.moved:.2g}"
    assert float(figures_found["un-scrambled differs from the original by (worst relative error)"]) == \
        float(f"{result.worst_rel:.1e}")
    assert float(figures_found["worst absolute error"]) == float(f"{result.worst_abs:.1e}")
    assert float(figures_found["tolerance (float64)"]) == result.tolerance
    assert int(figures_found["tensors compared"]) == len(result.errors)
    kinds = re.findall(r"^\| ([a-z_ ]+) \| (\d+) \| ([\d.e+-]+) \| ([\d.e+-]+) \|$", text, re.M)
    assert sum(int(k[1]) for k in kinds) == len(result.errors)
    assert max(float(k[2]) for k in kinds) == float(f"{result.worst_rel:.1e}")
    for kind, count, rel, _ in kinds:
        mine = [e for e, r in zip(result.errors, rows, strict=True) if r["kind"] == kind]
        assert int(count) == len(mine) and float(rel) == float(f"{max(e.max_rel_error for e in mine):.1e}")
    assert f"```bash\n{command}\n```" in text and "--forward-only" in command and "--input digit:0" in command
