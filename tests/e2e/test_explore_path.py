"""Real Chromium: Explore draws the followed token, channel and MLP neuron where the key's own permutation sends
them, read back from the shapes plotly drew (each chart's gd.layout.shapes), in every map of every column; another
key draws them elsewhere; choosing another item reruns only the panels that show the path; Play steps through
the blocks in the block panel's own reruns, then stops its timer; and the Guided walk draws its followed channel and
head the same way, on a 1024x768 projector."""

import re

from tests.app.test_explore import expected_outlines, key_permutations
from tests.e2e.conftest import DENSE_VIEWS, show_block_view, wait_for_app
from tests.e2e.test_explore import set_key, wait_verdict
from tests.e2e.test_explore_panels import WATCH, WATCHED, frames, runs_and_charts

FOLLOW = {"token": 5, "channel": 9, "neuron": 17}
URL = ("explore?model=digits-vit&layer=1&on_mlp=1&follow_token=5&follow_channel=9&follow_neuron=17"
       "&weight=vit.layers.1.mlp.fc1.weight")
# Each chart's title and its followed-item outlines as plotly drew them: (item, row centre or null, column centre or
# null; a row outline spans the x domain, a column outline the y domain)
OUTLINES = """() => Array.from(document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')).map(gd => {
  const t = gd.layout.title;
  const title = String((t && (t.text !== undefined ? t.text : t)) || '').replace(/<br>/g, ' ').replace(/<[^>]*>/g, '');
  const shapes = (gd.layout.shapes || []).filter(s => String(s.name || '').startsWith('path '));
  return {title, shapes: shapes.map(s => [s.name.split(' ')[1], s.yref === 'y domain' ? null : (s.y0 + s.y1) / 2,
                                          s.xref === 'x domain' ? null : (s.x0 + s.x1) / 2])};
}).filter(c => c.shapes.length)"""
LEADS = (("Original", "W:"), ("Scrambled", "W′: what"), ("Un-scrambled", "W′ with"))


def drawn_places(page) -> dict[str, list[tuple[str, int, int]]]:
    """Chart title -> (item, column (0 original, 1 scrambled, 2 un-scrambled), place drawn): a patch number for the
    class token's attention over the digit (4x4 patches of 2x2 pixels, 28 screen pixels a pixel), else a row or
    a column."""
    found = {}
    for chart in page.evaluate(OUTLINES):
        column = next(i for i, leads in enumerate(LEADS) if chart["title"].startswith(leads))
        places = []
        for item, row, col in chart["shapes"]:
            if item == "head":  # Explore's head grids' tiles: tests/app/test_explore.py checks them
                continue
            if "class token's attention" in chart["title"]:
                places.append((item, column, 1 + int(row // 56) * 4 + int(col // 56)))  # the token: patch + [CLS]
            else:
                places.append((item, column, round(row if row is not None else col)))
        found[chart["title"]] = places
    return found


# Each picture's drawn width: three pictures of one size side by side must be drawn at one size
PICTURES = """Array.from(document.querySelectorAll('[data-testid="stImage"] img'))"""


def picture_widths(page) -> list[int]:
    """The drawn width of every picture on the page, once each has loaded (a loading one is a few pixels wide)."""
    page.wait_for_function(f"() => {PICTURES}.every(img => img.complete && img.naturalWidth > 0)")
    return page.evaluate(f"{PICTURES}.map(img => Math.round(img.getBoundingClientRect().width))")


def drawn_in_every_block_view(page) -> dict[str, list[tuple[str, int, int]]]:
    """drawn_places in each of the block's views (one at a time, chosen in its "Show" control; the class token's
    overlays are above every view), ending on the hidden states."""
    drawn = {}
    for view in (*DENSE_VIEWS[1:], DENSE_VIEWS[0]):
        show_block_view(page, view)
        drawn |= drawn_places(page)
    return drawn


def assert_drawn_where_the_keys_send(page, keys: dict[str, int]) -> dict:
    want = expected_outlines(FOLLOW, key_permutations(keys, 1))
    drawn = drawn_in_every_block_view(page)
    kinds = {title.split(": ", 1)[-1] for title in drawn}
    assert {"hidden state after block 1", "attention, block 1, head 0", "MLP neurons of block 1",
            "class token's attention block 1", "as trained"} <= kinds, kinds
    wrong = {title: places for title, places in drawn.items()
             if any(place != want[item][column] for item, column, place in places)}
    assert wrong == {}, (want, wrong)
    assert sum(map(len, drawn.values())) >= 27  # 3 overlays, and 3 x 2 on hidden, attention, MLP and weight maps
    # the sentence under the scrambled hidden state (the view drawn_in_every_block_view ends on) says the same places
    sentence = page.get_by_text(re.compile(r"^The keys moved token 5 to row")).first.inner_text()
    assert sentence == f"The keys moved token 5 to row {want['token'][1]} and channel 9 to column {want['channel'][1]}."
    return want


def test_the_followed_path_is_drawn_where_the_keys_permutation_sends_it(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 4000})
    page.goto(f"{app_url}/{URL}")
    wait_verdict(page)
    before = assert_drawn_where_the_keys_send(page, {"tokens": 7, "channels": 42, "mlp": 11})
    set_key(page, "tokens key", "1234")
    wait_verdict(page)
    after = assert_drawn_where_the_keys_send(page, {"tokens": 1234, "channels": 42, "mlp": 11})
    assert after["token"][1] != before["token"][1] and after["channel"] == before["channel"]
    assert page.locator('[data-testid="stException"]').count() == 0


def test_pictures_side_by_side_are_drawn_at_one_size_on_a_projector(app_url, page):
    """Explore's three input pictures at 1024x768 in projector mode: each had been as wide as its caption (240, 250
    and 275 px, "Un-scrambled: ..." the widest); assets/app.css keeps a caption out of its picture's width."""
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{app_url}/explore?model=digits-vit&projector=1")
    wait_verdict(page)
    widths = picture_widths(page)
    assert len(widths) == 3 and len(set(widths)) == 1, widths


def test_the_guided_walk_outlines_its_channel_and_head_where_the_key_sends_them(app_url, page):
    """The walk's steps 2 and 3 on a 1024x768 projector: the followed channel in the three block-0 hidden states and
    the followed head in every layer of both head grids, each where the key's own permutation (symmetries.build)
    sends it."""
    import torch

    from perm_core.engine import symmetries
    from perm_core.explore.exploration import Exploration
    from perm_core.explore.walk import run_step
    from perm_core.models.defaults import default_inputs
    from perm_core.models.registry import load_model

    loaded = load_model("digits-vit", dtype=torch.float64)
    explorer = Exploration(loaded.model, default_inputs(loaded))
    g, n, key = explorer.geometry, explorer.n_tokens, 31
    page.set_viewport_size({"width": 1024, "height": 768})

    page.goto(f"{app_url}/walk?walk_step=2&walk_key={key}&projector=1")
    wait_for_app(page)
    channel = run_step(explorer, "channels", key).extra["follow"]["channel"]
    moved = symmetries.build("channels", key, g, n).spaces[("resid", None)][0].index.tolist().index(channel)
    assert [c["shapes"] for c in page.evaluate(OUTLINES)] == [[["channel", None, place]]
                                                             for place in (channel, moved, channel)]

    page.goto(f"{app_url}/walk?walk_step=3&walk_key={key}&projector=1")
    wait_for_app(page)
    done = run_step(explorer, "heads", key)
    head, layers, step = done.extra["follow"]["head"], done.extra["grid"].layers, 9  # 8x8 tiles, one cell apart
    places = [symmetries.build("heads", key, g, n).spaces[("heads", layer)][0].index.tolist().index(head)
              for layer in layers]
    centre = 3.5  # of an 8-cell tile
    assert [c["shapes"] for c in page.evaluate(OUTLINES)] == [
        [["head", row * step + centre, head * step + centre] for row in range(len(layers))],
        [["head", row * step + centre, place * step + centre] for row, place in enumerate(places)]]
    assert places != [head] * len(layers)  # the key moved the followed head somewhere
    assert page.locator('[data-testid="stException"]').count() == 0


def test_another_followed_token_reruns_only_the_path_panels(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 4000})
    received = frames(page)
    page.goto(f"{app_url}/{URL}")
    wait_verdict(page)
    page.evaluate(WATCH)
    received.clear()
    box = page.get_by_label("Follow token", exact=True)
    box.fill("6")
    box.press("Enter")
    wait_for_app(page)
    ended, _ = runs_and_charts(received)
    assert ended == ["FINISHED_FRAGMENT_RUN_SUCCESSFULLY"]
    kept = [w["title"] for w in page.evaluate(WATCHED) if w["kept"]]
    assert any(t.startswith("un-scrambled vs original") for t in kept)  # the proof was not drawn again
    assert any(t.startswith("Original: every head") for t in kept)
    places = drawn_places(page)["Scrambled: hidden state after block 1"]
    token = key_permutations({"tokens": 7, "channels": 42, "mlp": 11}, 1)["token"].index(6)
    assert ("token", 1, token) in places and "follow_token=6" in page.url


def test_play_steps_through_the_blocks_in_the_panels_own_reruns(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 4000})
    received = frames(page)
    page.goto(f"{app_url}/explore?model=digits-vit")  # opens on the last of three blocks
    wait_verdict(page)
    received.clear()
    seen = []

    def shown() -> str:
        return page.get_by_role("slider", name="Layer (block)").input_value()

    page.get_by_role("button", name="Play").click()  # from the last block: again from block 0
    page.get_by_role("button", name="Pause").wait_for()
    for _ in range(120):  # Play moves a block every 1.5 s: 0, 1, 2, then Play again
        value = shown()
        if not seen or seen[-1] != value:
            seen.append(value)
        if value == "2" and page.get_by_role("button", name="Play").count():
            break
        page.wait_for_timeout(250)
    wait_for_app(page)
    assert [int(float(v)) for v in seen][-3:] == [0, 1, 2], seen  # each block once, in order
    ended, _ = runs_and_charts(received)
    # Play: one full run starts the timer; each step is the block panel's own run; one full run stops the timer
    assert ended.count("FINISHED_SUCCESSFULLY") == 2 and ended.count("FINISHED_FRAGMENT_RUN_SUCCESSFULLY") >= 2, ended
    assert "layer=2" in page.url, (seen, ended, page.url)
    received.clear()
    page.wait_for_timeout(4000)  # the timer is gone: nothing reruns by itself
    assert runs_and_charts(received)[0] == []
    assert page.locator('[data-testid="stException"]').count() == 0
