"""AppTest: the Explore page proves exact un-scrambling, shows the break of a negative control, keeps its view
in the URL, and turns every bad input into a message."""

import base64
import json
import re

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP
from tests.explore_views import BLOCK_VIEWS, block_view_of
from ui.sidebar import default_model

MAX_PAYLOAD = 2 * 1024 * 1024


def explore(**query) -> AppTest:
    query.setdefault("model", "digits-vit")  # the small, fast model; the default dinov2-s: test_explore_photo.py
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in query.items():
        at.query_params[name] = str(value)
    at.run()
    at.switch_page("pages/explore.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def decode(values) -> np.ndarray:
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


def proof_errors(at) -> dict[str, float]:
    """Trace name of the proof chart -> its largest plotted error."""
    proof = next(c for c in charts(at) if "un-scrambled vs original" in title(c))
    return {t["name"]: float(decode(t["y"]).max()) for t in proof["data"] if "tolerance" not in t["name"]}


def difference_map(at) -> np.ndarray:
    """log10 of |un-scrambled - original| / max|original| per cell, as the proof's map draws it."""
    found = [c for c in charts(at) if title(c).startswith("|un-scrambled")]
    assert len(found) == 1
    return decode(found[0]["data"][0]["z"])


def payload(at) -> int:
    return sum(len(c.proto.spec) for c in at.get("plotly_chart"))


def block_views(at) -> list[str]:
    """The views the block's control offers for this model (the control's options are their labels)."""
    control = at.button_group(key="block_view")
    return [view for view in BLOCK_VIEWS if control.format_func(view) in control.options]


def show(at, view: str) -> AppTest:
    """Choose one of the block's views in its control, as a student does, and rerun."""
    at.button_group(key="block_view").set_value(view).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.button_group(key="block_view").value == view
    return at


def in_each_view(at, read, views=None) -> dict:
    """read(at) in each of the block's views in turn (every view the control offers unless views): view -> what
    read returned. The page draws one view at a time, so what a test checked in one run it checks view by view."""
    return {view: read(show(at, view)) for view in (views or block_views(at))}


def drawn_views(at) -> set[str]:
    """The block views whose charts are on the page now."""
    return {block_view_of(title(c).replace("<br>", " ")) for c in charts(at)} - {None}


def test_default_view_is_exact_and_small():
    at = explore()
    verdict = at.success[0].value
    assert "un-scrambled tensors match" in verdict and "float32" in verdict
    moved, restored = (float(x) for x in re.match(r"Scrambled differs by ([\d.e+-]+) .*un-scrambled by ([\d.e+-]+)",
                                                   verdict).groups())
    assert moved >= 0.1 and restored <= 1e-4  # the contrast is the lesson
    shown = {m.label: m.value for m in at.metric}
    assert shown["Un-scrambled differs by"] == f"{restored:.1e}"  # one number, written the same way everywhere
    assert shown["Scrambled differs from the original by"] == f"{moved:.2g}"
    errors = proof_errors(at)
    assert {"hidden state (relative)", "attention map (relative)", "output logits (relative)"} <= set(errors)
    assert 0 < max(errors.values()) < 1e-4
    # Three columns that agree: the un-scrambled heatmap equals the original one, the scrambled one does not.
    hidden = {title(c).split(":")[0]: decode(c["data"][0]["z"]) for c in charts(at) if "hidden state after" in title(c)}
    assert np.abs(hidden["Un-scrambled"] - hidden["Original"]).max() < 1e-4
    assert np.abs(hidden["Scrambled"] - hidden["Original"]).max() > 0.1
    assert payload(at) < MAX_PAYLOAD
    assert at.query_params["model"] == ["digits-vit"] or at.query_params["model"] == "digits-vit"


def test_float64_every_symmetry_and_key_bits():
    query = {f"on_{name}": 1 for name in ("heads", "head_channels", "mlp", "rotation")}
    at = explore(dtype="float64", **query)
    verdict = at.success[0].value
    assert "float64" in verdict
    errors = proof_errors(at)
    assert max(errors.values()) <= 1e-9  # ViT's softmax runs in float32, hence not 1e-16
    assert difference_map(at).max() <= -9  # every cell of the un-scrambled hidden state within 1e-9 (log10)
    text = " ".join(m.value for m in at.markdown)
    assert "bits" in text and "continuous" in " ".join(c.value for c in at.caption)


def test_negative_control_shows_the_break():
    at = explore(control="channels/norms_not_permuted")
    assert not at.success
    assert "breaks, as it must" in at.error[0].value
    errors = proof_errors(at)
    assert errors["hidden state (relative)"] > 1e-3
    hidden = {title(c).split(":")[0]: decode(c["data"][0]["z"]) for c in charts(at) if "hidden state after" in title(c)}
    assert np.abs(hidden["Un-scrambled"] - hidden["Original"]).max() > 1e-3
    assert difference_map(at).max() > -3  # the break shows on the map too

    at.selectbox(key="control").set_value("tokens/positions_not_moved").run()
    assert "breaks, as it must" in at.error[0].value
    assert proof_errors(at)["attention map (relative)"] > 1e-3


def test_each_key_changes_the_scramble_but_not_the_verdict():
    at = explore(on_heads=1, on_mlp=1, on_head_channels=1)
    pictures = {title(c): decode(c["data"][0]["x"]) for c in charts(at) if "key" in title(c)}
    for name, new_key in (("tokens", 8), ("channels", 43), ("heads", 4), ("head_channels", 6), ("mlp", 12)):
        at.text_input(key=f"k_{name}").set_value(str(new_key)).run()
        assert not at.exception
        assert at.success and "un-scrambled tensors match" in at.success[0].value, name
        assert max(proof_errors(at).values()) < 1e-4
        now = {title(c): decode(c["data"][0]["x"]) for c in charts(at) if "key" in title(c)}
        changed = [t for t in now if t.endswith(f"key {new_key}")]
        assert changed, (name, list(now))
        old_title = changed[0].removesuffix(str(new_key)) + str(new_key - 1)
        assert not np.array_equal(now[changed[0]], pictures[old_title]), name
        pictures = now
    assert at.query_params["k_mlp"] in ("12", ["12"])


def test_query_params_round_trip():
    at = explore(k_channels=99, layer=1, head=2, digit=5, on_tokens=0, block_view="attention")  # the head: attention
    assert at.text_input(key="k_channels").value == "99"
    assert at.slider(key="layer").value == 1 and at.slider(key="head").value == 2
    assert at.number_input(key="digit").value == 5
    assert at.toggle(key="on_tokens").value is False
    at.slider(key="layer").set_value(0).run()
    params = {k: at.query_params[k] for k in ("k_channels", "layer", "head", "digit", "on_tokens", "block_view")}
    flat = {k: v[0] if isinstance(v, list) else v for k, v in params.items()}
    assert flat == {"k_channels": "99", "layer": "0", "head": "2", "digit": "5", "on_tokens": "0",
                    "block_view": "attention"}
    # A link with mangled values falls back to defaults instead of failing.
    at = explore(layer="x", head=99, model="nonsense", block_view="attention")
    last_layer = {"digits-vit": 2, "dinov2-s": 11}[default_model()]
    assert at.slider(key="layer").value == last_layer and at.selectbox(key="model").value == default_model()
    assert at.slider(key="head").value == 0


@pytest.mark.parametrize("bad", ["-1", str(10**30), "abc"])
def test_bad_keys_are_messages(bad):
    at = explore(k_channels=bad)
    assert any("whole number" in e.value for e in at.error)
    assert not at.get("plotly_chart")
    at.switch_page("pages/home.py").run()
    assert not at.exception


def test_text_model_minilm_and_bad_texts():
    at = explore(model="minilm")
    assert "un-scrambled tensors match" in at.success[0].value
    assert max(proof_errors(at).values()) < 1e-4
    embeddings = [title(c) for c in charts(at) if "sentence embedding" in title(c)]
    assert len(embeddings) == 3 and "cos to original 1.000000" in embeddings[2]
    assert payload(at) < MAX_PAYLOAD
    # Attention maps of a short text name their tokens, each in the order that map sees them.
    show(at, "attention")
    at.radio(key="txt_src").set_value("text").run()
    at.text_area(key="text").set_value("A man plays the guitar on a small stage.").run()
    original, scrambled, restored = chips_of(at)
    maps = [c for c in charts(at) if "attention, block" in title(c)]
    # the key tokens are the x axis' categories (zero-width spaces keep a repeated token's columns apart)
    axes = [([x.rstrip("\u200b") for x in c["data"][0]["x"]], list(c["layout"]["yaxis"]["ticktext"])) for c in maps]
    assert all(c["layout"]["xaxis"]["type"] == "category" and len(set(c["data"][0]["x"])) == len(original)
               for c in maps)
    assert axes[0] == (original, original) and axes[1] == (scrambled, scrambled) and axes[2] == (restored, restored)
    assert scrambled != original and len(original) <= 16

    at.text_area(key="text").set_value("   ").run()
    assert not at.exception and any("empty" in e.value for e in at.error)
    at.text_area(key="text").set_value(" ".join(["word"] * 5000)).run()
    assert not at.exception and any("truncated" in w.value for w in at.warning)
    assert at.success and payload(at) < MAX_PAYLOAD


def chips_of(at) -> list[list[str]]:
    """The input's three chip rows (original | scrambled | un-scrambled) -> their labels."""
    import re

    rows = [m.value for m in at.markdown if "original position" in m.value]
    return [re.findall(r'original position \d+">([^<]*)</span>', row) for row in rows]


@pytest.mark.parametrize("model", ["random:bert", "random:gpt2", "random:llama", "random:gemma3"])
def test_random_text_models_run_on_token_id_chips(model):
    """No tokenizer: the input is token ids drawn from the vocabulary, shown as id chips like #17."""
    at = explore(model=model, dtype="float64")
    assert at.success and not at.error, [e.value for e in at.error]
    assert max(proof_errors(at).values()) <= 1e-9
    original, scrambled, restored = chips_of(at)
    assert len(original) == 12 and all(label.startswith("#") and label[1:].isdigit() for label in original)
    assert restored == original and sorted(scrambled) == sorted(original) and scrambled != original

    at.number_input(key="n_ids").set_value(5).run()
    assert not at.exception and at.success and len(chips_of(at)[0]) == 5
    at.number_input(key="ids_seed").set_value(9).run()
    assert not at.exception and at.success and chips_of(at)[0] != original[:5]
    at.radio(key="ids_src").set_value("text").run()  # a text without a tokenizer: one hashed id per word
    assert not at.exception and at.success
    words = at.text_area(key="text").value.split()
    assert len(chips_of(at)[0]) == len(words)


def test_the_head_grid_shows_permuted_heads_in_their_new_places():
    """random:llama with tokens and heads scrambled: each tile of the scrambled grid (token order undone) equals
    the original tile of the head its label names, and the labels are the heads key's permutation."""
    at = explore(model="random:llama", dtype="float64", on_channels=0, on_heads=1, k_heads=5)
    grids = {title(c).split(":")[0]: c for c in charts(at) if "every head" in title(c) or "heads change" in title(c)}
    scrambled_name = "Scrambled (token order undone)"
    original, scrambled = (decode(grids[name]["data"][0]["z"]) for name in ("Original", scrambled_name))
    n_layers = len(grids["Original"]["layout"]["yaxis"]["ticktext"])
    n_heads = len(grids["Original"]["layout"]["xaxis"]["ticktext"])
    cells = (original.shape[1] + 1) // n_heads - 1
    step = cells + 1

    def tile(grid, layer, head):
        return grid[layer * step:layer * step + cells, head * step:head * step + cells]

    labels = {(round(a["y"]), round(a["x"])): int(a["text"].strip("<b>/"))
              for a in grids[scrambled_name]["layout"].get("annotations", []) if a["text"].startswith("<b>")}
    assert labels, "a heads key moves heads: some tiles must be labelled"
    moved = 0
    for layer in range(n_layers):
        for head in range(n_heads):
            centre = (round(layer * step + cells / 2 - 0.5), round(head * step + cells / 2 - 0.5))
            holds = labels.get(centre, head)
            moved += holds != head
            assert np.abs(tile(scrambled, layer, head) - tile(original, layer, holds)).max() < 1e-12
            if holds != head:  # and the head really differs from the one that sat there
                assert np.abs(tile(scrambled, layer, head) - tile(original, layer, head)).max() > 1e-6
    assert moved == len(labels) > 0

    # The followed head: outlined in every layer, in the original at its own place and in the scrambled grid at the
    # tile whose label names it; the app picks a head the key moves, and a student's pick moves the outlines.
    def outlined(grid) -> set[tuple[int, int]]:
        return {(round((s["y0"] + 0.5) / step), round((s["x0"] + 0.5) / step))
                for s in grid["layout"].get("shapes", []) if s.get("name", "").startswith("path head")}

    def holding(layer, head):
        return next(place for place in range(n_heads)
                    if labels.get((round(layer * step + cells / 2 - 0.5), round(place * step + cells / 2 - 0.5)),
                                  place) == head)

    followed = at.number_input(key="follow_head").value
    assert any(holding(layer, followed) != followed for layer in range(n_layers))  # a head the key moves
    for pick in (followed, (followed + 1) % n_heads):
        if pick != followed:
            at.number_input(key="follow_head").set_value(pick).run()
            assert not at.exception
            grids = {title(c).split(":")[0]: c for c in charts(at) if "every head" in title(c)
                     or "heads change" in title(c)}
        followed = pick
        assert outlined(grids["Original"]) == {(layer, pick) for layer in range(n_layers)}
        assert outlined(grids[scrambled_name]) == {(layer, holding(layer, pick)) for layer in range(n_layers)}
        sentences = [c.value for c in at.caption if c.value.startswith(("Head ", "The key moved head", "The key left"))]
        assert sentences[0] == f"Head {pick} of every layer is outlined."
        moved_to = [f"{holding(layer, pick)} in layer {layer}" for layer in range(n_layers)
                    if holding(layer, pick) != pick]
        assert all(place in sentences[1] for place in moved_to) and f"head {pick}" in sentences[1]



def test_another_model_follows_its_own_picks():
    """A student's followed token, channel and head hold while the model stays; another model starts from that
    model's own picks (the same a fresh session on it shows), not from numbers chosen for the first one."""
    at = explore(model="random:llama", on_heads=1, k_heads=5)
    fresh = explore(model="random:gpt2", on_heads=1, k_heads=5)
    picks = {item: fresh.number_input(key=f"follow_{item}").value for item in ("token", "channel", "head")}
    for item, limit in (("token", 3), ("channel", 8), ("head", 2)):  # in range for both models, not gpt2's pick
        chosen = next(v for v in range(limit + 1) if v != picks[item])
        at.number_input(key=f"follow_{item}").set_value(chosen).run()
        assert at.number_input(key=f"follow_{item}").value == chosen
    at.sidebar.selectbox(key="model").set_value("random:gpt2").run()
    assert not at.exception
    assert {item: at.number_input(key=f"follow_{item}").value for item in picks} == picks

def test_the_weight_view_shows_w_beside_w_prime_and_the_inverse_gives_it_back():
    at = explore(model="digits-vit", dtype="float64", on_heads=1, layer=1, block_view="weights")
    assert at.selectbox(key="weight").value == "vit.layers.1.attention.q_proj.weight"
    at.selectbox(key="weight").set_value("vit.layers.1.mlp.fc1.weight").run()
    maps = {title(c).split(":")[0].replace("<br>", " "): decode(c["data"][0]["z"]) for c in charts(at)
            if title(c).startswith(("W:", "W′"))}
    assert len(maps) == 3, list(maps)
    original, scrambled, back = (maps[k] for k in ("W", "W′", "W′ with the inverse applied"))
    assert original.shape == scrambled.shape == back.shape
    assert np.abs(back - original).max() == 0  # a permutation moves numbers, it does not change them
    assert np.abs(scrambled - original).max() > 0.1
    from perm_core.models.registry import load_model

    trained = load_model("digits-vit").model.state_dict()["vit.layers.1.mlp.fc1.weight"].numpy()
    assert original.shape == trained.shape and np.allclose(original, trained, atol=1e-6)  # W itself, not a copy
    caption = next(c.value for c in at.caption if c.value.startswith("vit.layers.1.mlp.fc1.weight"))
    assert "gives it back to 0.0e+00 (exactly)" in caption
    assert at.query_params["weight"] in ("vit.layers.1.mlp.fc1.weight", ["vit.layers.1.mlp.fc1.weight"])


def outlines(at) -> dict[str, list[tuple[str, float, float]]]:
    """Each chart's followed token, channel and neuron outlines (shapes named "path <item>"): (item, row centre or
    None, column centre or None), a row outline spanning the whole x domain, a column outline the whole y domain.
    The head grids' followed head is a tile, not a row or column (test_the_head_grid_shows_... checks it)."""
    found = {}
    for chart in charts(at):
        shapes = [s for s in chart["layout"].get("shapes", []) if s.get("name", "").startswith("path ")
                  and not s["name"].startswith("path head")]
        if shapes:
            found[title(chart).replace("<br>", " ")] = [
                (s["name"].split()[1], None if s["yref"] == "y domain" else (s["y0"] + s["y1"]) / 2,
                 None if s["xref"] == "x domain" else (s["x0"] + s["x1"]) / 2) for s in shapes]
    return found


def key_permutations(keys: dict[str, int], layer: int) -> dict[str, list[int]]:
    """Each followable space's permutation as the key itself makes it (perm_core.engine.symmetries.build, not the
    page): new position i holds original item index[i]."""
    import torch

    from perm_core.engine import symmetries
    from perm_core.explore.exploration import Exploration
    from perm_core.models.input_spec import inputs_from_spec
    from perm_core.models.registry import load_model

    loaded = load_model("digits-vit", dtype=torch.float32)
    explorer = Exploration(loaded.model, inputs_from_spec(loaded, "digit:0"))
    g, n = explorer.geometry, explorer.n_tokens
    return {"token": symmetries.build("tokens", keys["tokens"], g, n).tokens.index.tolist(),
            "channel": symmetries.build("channels", keys["channels"], g, n).spaces[("resid", None)][0].index.tolist(),
            "neuron": symmetries.build("mlp", keys["mlp"], g, n).spaces[("mlp", layer)][0].index.tolist()}


def expected_outlines(follow: dict[str, int], perms: dict[str, list[int]]) -> dict[str, tuple[int, int, int]]:
    """Where each followed item must be drawn: at its own place, where its key sent it, and back."""
    return {item: (number, perms[item].index(number), number) for item, number in follow.items()}


def test_the_followed_path_is_drawn_where_the_keys_permutation_sends_it():
    """Every map outlines the followed token (rows; rows and columns of an attention map), channel (the hidden
    state's and a weight's resid axis) and MLP neuron: in the original at its number, in the scrambled column
    where the key's own permutation put it, in the un-scrambled column back (each view of the block in turn). A
    different key draws it elsewhere."""
    follow = {"token": 5, "channel": 9, "neuron": 17}
    at = explore(layer=1, on_mlp=1, follow_token=5, follow_channel=9, follow_neuron=17,
                 weight="vit.layers.1.mlp.fc1.weight")
    for key in (7, 8):
        keys = {"tokens": key, "channels": 42, "mlp": 11}
        want = expected_outlines(follow, key_permutations(keys, 1))
        seen = in_each_view(at, lambda at: (outlines(at), [c.value for c in at.caption]))
        assert set(seen) == {"hidden", "attention", "mlp", "weights"}
        drawn = {name: shapes for found, _ in seen.values() for name, shapes in found.items()}
        checked = 0
        for name, shapes in drawn.items():
            column = next(i for i, leads in enumerate((("Original", "W:"), ("Scrambled", "W′: what"),
                                                       ("Un-scrambled", "W′ with"))) if name.startswith(leads))
            for item, row, col in shapes:
                if "class token's attention" in name:  # a patch of the 4x4 grid of 2x2 patches, drawn 28 px a pixel
                    patch = int(row // 56) * 4 + int(col // 56)
                    assert patch + 1 == want[item][column], (name, patch)
                else:
                    assert (row if row is not None else col) == want[item][column], (name, item, row, col)
                checked += 1
        kinds = {name.split(": ", 1)[-1] for name in drawn}
        assert {"hidden state after block 1", "attention, block 1, head 0", "MLP neurons of block 1",
                "class token's attention block 1", "as trained"} <= kinds, kinds
        assert checked >= 3 * 7
        scrambled = drawn["Scrambled: hidden state after block 1"]
        assert [r for _, r, _ in scrambled if r is not None] == [want["token"][1]]
        sentence = next(c for c in seen["hidden"][1] if c.startswith("The keys moved token 5 to row"))
        assert sentence == (f"The keys moved token 5 to row {want['token'][1]} and channel 9 to column "
                            f"{want['channel'][1]}.")
        if key == 7:
            before = want
            at.text_input(key="k_tokens").set_value("8").run()
            assert not at.exception
    assert before["token"][1] != want["token"][1]  # the control: another key, another place, the one it says


def test_sorted_columns_keep_the_followed_channel_where_its_key_put_it():
    """Sorted by the original's means (smallest first), the channels become a ramp: the scrambled column drawn in
    that order outlines the followed channel at the place of the channel its key put there, and each column sorted
    by its own means draws the same map as the original (a permutation keeps every channel's mean)."""
    at = explore(dtype="float64", on_tokens=0, follow_channel=9, layer=1)

    def hidden():
        return {title(c).split(":")[0]: decode(c["data"][0]["z"]) for c in charts(at)
                if "hidden state after" in title(c)}

    def columns():
        return {name.split(":")[0]: [c for _, _, c in shapes if c is not None]
                for name, shapes in outlines(at).items() if "hidden state after" in name}

    stored = hidden()["Original"]
    order = list(np.argsort(stored.mean(axis=0), kind="stable"))
    moved = key_permutations({"tokens": 7, "channels": 42, "mlp": 11}, 1)["channel"].index(9)
    at.radio(key="column_order").set_value("original").run()
    assert not at.exception
    assert np.array_equal(hidden()["Original"], stored[:, order])
    assert columns() == {"Original": [order.index(9)], "Scrambled": [order.index(moved)],
                         "Un-scrambled": [order.index(9)]}
    at.radio(key="column_order").set_value("own").run()
    maps = hidden()
    assert np.abs(maps["Scrambled"] - maps["Original"]).max() < 1e-9 < np.abs(stored - maps["Original"]).max()
    assert columns() == {"Original": [order.index(9)], "Scrambled": [order.index(9)], "Un-scrambled": [order.index(9)]}
    assert any("(column" in c.value and "as stored)" in c.value for c in at.caption)


def test_previous_next_and_play_step_the_layer():
    """Back and Next move the layer slider one block (the maps follow); Play from the last block starts again
    from block 0 and plays (each later step is the fragment's own rerun: tests/e2e/test_explore_path.py); Pause
    stops it, and touching the slider stops it too."""
    at = explore(layer=2)

    def blocks():
        return sorted({t.split("after block ")[1] for t in map(title, charts(at)) if "hidden state after" in t})

    assert at.button(key="layer_next").disabled and blocks() == ["2"]
    at.button(key="layer_back").click().run()
    assert at.slider(key="layer").value == 1 and blocks() == ["1"]
    at.button(key="layer_back").click().run()
    assert at.slider(key="layer").value == 0 and at.button(key="layer_back").disabled and blocks() == ["0"]
    at.button(key="layer_next").click().run()
    assert at.slider(key="layer").value == 1 and blocks() == ["1"]
    assert at.query_params["layer"] in ("1", ["1"])
    at.slider(key="layer").set_value(2).run()
    assert at.button(key="layer_play").label == "Play"
    at.button(key="layer_play").click().run()  # from the last block: again from the first
    assert at.session_state["playing"] and at.slider(key="layer").value == 0 and blocks() == ["0"]
    assert at.button(key="layer_play").label == "Pause"
    assert any(c.value.startswith("Playing: block 0 of 2") for c in at.caption)
    at.button(key="layer_play").click().run()
    assert not at.session_state["playing"] and at.button(key="layer_play").label == "Play"
    at.button(key="layer_play").click().run()
    assert at.session_state["playing"] and at.slider(key="layer").value == 0
    at.button(key="layer_next").click().run()  # a step by hand stops Play
    assert not at.session_state["playing"] and at.slider(key="layer").value == 1 and not at.exception


def test_the_block_shows_the_chosen_view_alone_and_keeps_it_in_the_url():
    """The chosen block shows one view at a time, under one subheader: each choice draws its own charts and its own
    controls and no other view's (the class token's overlays and the proof stay), goes into the URL and holds when
    the layer changes; a link with a view the page does not have opens on the hidden states and says so."""
    at = explore(layer=1, block_view="nonsense")
    assert [w.value for w in at.warning] == ["This link's `block_view=nonsense` is not a valid value here; using "
                                             "`hidden` instead."]
    assert at.button_group(key="block_view").value == "hidden" and drawn_views(at) == {"hidden"}
    assert at.query_params["block_view"] in ("hidden", ["hidden"])
    assert block_views(at) == ["hidden", "attention", "mlp", "weights"]  # digits-vit: dense, no experts
    controls = {"head": lambda: at.slider, "weight": lambda: at.selectbox, "column_order": lambda: at.radio}
    own = {"hidden": {"column_order"}, "attention": {"head"}, "mlp": {"column_order"}, "weights": {"weight"}}
    for view in ("attention", "mlp", "weights", "hidden"):
        show(at, view)
        assert drawn_views(at) == {view}, view
        assert {key for key, kind in controls.items() if any(w.key == key for w in kind())} == own[view], view
        assert at.query_params["block_view"] in (view, [view])
        subheaders = [s.value for s in at.subheader]
        assert subheaders.count("Inside block 1") == 1 and "Where the class token looks" in subheaders
        titles = [title(c).replace("<br>", " ") for c in charts(at)]
        assert sum("class token's attention block 1" in t for t in titles) == 3 and "un-scrambled vs original" in titles
        assert not at.warning  # the link's warning said once, where the link was opened
    show(at, "weights")
    at.slider(key="layer").set_value(0).run()  # another block, the same view
    assert at.button_group(key="block_view").value == "weights" and drawn_views(at) == {"weights"}
    assert "Inside block 0" in [s.value for s in at.subheader]
    assert at.selectbox(key="weight").value.startswith("vit.layers.0.")
    assert at.query_params["block_view"] in ("weights", ["weights"])


def test_a_picked_head_and_weight_survive_a_visit_to_another_view():
    at = explore(layer=1)
    show(at, "attention").slider(key="head").set_value(1).run()
    show(at, "weights").selectbox(key="weight").set_value("vit.layers.1.mlp.fc1.weight").run()
    show(at, "hidden")
    assert show(at, "attention").slider(key="head").value == 1
    assert show(at, "weights").selectbox(key="weight").value == "vit.layers.1.mlp.fc1.weight"
