"""AppTest: the guided walk's five steps, each sentence's numbers equal to the computation it describes."""

import json
import re

import pytest
import torch
from streamlit.testing.v1 import AppTest

from perm_core.explore.exploration import Exploration
from perm_core.explore.walk import STEPS, run_step
from perm_core.models.defaults import default_inputs
from perm_core.models.registry import load_model
from tests.app.conftest import APP


def walk(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in query.items():
        at.query_params[name] = str(value)
    at.run()
    at.switch_page("pages/walk.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def explorers():
    return {dtype: Exploration(loaded.model, default_inputs(loaded))
            for dtype, loaded in ((d, load_model("digits-vit", dtype=d)) for d in (torch.float64, torch.float32))}


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\*\*(-?[0-9.]+(?:e[+-]\d+)?)\*\*", text)]


def test_next_and_previous_walk_every_step_and_the_url_follows():
    at = walk()
    titles = []
    for index in range(len(STEPS)):
        titles.append(at.title[0].value)
        assert at.query_params["walk_step"] in (str(index + 1), [str(index + 1)])
        assert at.get("plotly_chart"), titles[-1]
        if index < len(STEPS) - 1:
            next(b for b in at.button if b.label == "Next").click().run()
            assert not at.exception, [e.value for e in at.exception]
    assert titles[0].startswith("1.") and titles[-1].startswith("5.") and len(set(titles)) == len(STEPS)
    assert next(b for b in at.button if b.label == "Next").disabled
    next(b for b in at.button if b.label == "Previous").click().run()
    assert at.title[0].value == titles[-2]


@pytest.mark.parametrize("index", range(1, len(STEPS) + 1))
def test_each_sentence_reports_its_own_run(explorers, index):
    at = walk(walk_step=index, walk_key=99)
    text = next(m.value for m in at.markdown if "Key 99" in m.value or "float64 the worst" in m.value)
    expected = run_step(explorers[torch.float64], STEPS[index - 1], 99, explorers[torch.float32])
    shown = numbers(text)
    if STEPS[index - 1] == "tokens":
        assert shown == [expected.extra["predicted_scrambled"], float(f"{expected.extra['probability_gap']:.1e}")]
    elif STEPS[index - 1] == "exact":
        assert shown == [float(f"{expected.restored_error:.1e}"),
                         float(f"{expected.extra['float32'].worst_rel:.1e}")]
    elif STEPS[index - 1] == "channels":
        assert shown == [float(f"{expected.extra['block0_moved']:.2f}"),
                         float(f"{expected.extra['block0_restored']:.1e}")]
        original, scrambled, restored = (h.double() for h in expected.extra["hidden"])  # the charts' tensors
        scale = original.abs().max()
        assert expected.extra["block0_moved"] == pytest.approx(float((scrambled - original).abs().max() / scale))
        assert expected.extra["block0_restored"] == float((restored - original).abs().max() / scale)
        assert expected.extra["block0_restored"] <= expected.restored_error  # block 0 is one of the model's
    elif STEPS[index - 1] == "heads":
        assert shown == [float(f"{expected.restored_error:.1e}")]
    else:
        assert shown == [float(f"{expected.extra['weight_change']:.2f}"),
                         float(f"{expected.extra['attention_error']:.1e}")]
    assert expected.restored_error < 1e-12


def test_the_head_step_shows_moved_heads_in_their_new_places(explorers):
    at = walk(walk_step=3, walk_key=5)
    expected = run_step(explorers[torch.float64], "heads", 5)

    scrambled = json.loads(at.get("plotly_chart")[1].proto.spec)
    labels = [a["text"] for a in scrambled["layout"].get("annotations", []) if a["text"].startswith("<b>")]
    moved = [f"<b>{held}</b>" for holds in expected.extra["grid"].holds for h, held in enumerate(holds) if held != h]
    assert labels == moved and moved


def test_a_bad_key_is_a_message_and_the_walk_goes_on():
    at = walk(walk_key="abc")
    assert at.error and "whole number" in at.error[0].value
    assert at.get("plotly_chart")


def test_projector_mode_enlarges_the_text():
    at = walk(projector=1)
    assert any("font-size: 1.45rem" in h.proto.body for h in at.get("html"))


@pytest.mark.parametrize("index", [1, 2, 3])
def test_projector_mode_enlarges_the_charts_too(index):
    """Paragraphs grew, chart titles and ticks stayed at plotly's 10-13 px: in projector mode every chart's texts
    are at least 16 px; the control without it keeps plotly's sizes."""
    import json

    for projector, smallest in ((1, 16), (0, None)):
        at = walk(walk_step=index, projector=projector)
        for element in at.get("plotly_chart"):
            layout = json.loads(element.proto.spec)["layout"]
            font = layout.get("font", {}).get("size")
            ticks = [axis.get("tickfont", {}).get("size") for name, axis in layout.items() if name.startswith(
                ("xaxis", "yaxis"))]
            if smallest:
                assert font >= smallest and all(t >= smallest for t in ticks), (index, font, ticks)
            else:
                assert font is None or font < 16


def outline_places(at) -> list[list[tuple[str, float]]]:
    """Each chart's followed-item outlines as drawn: (shape name, the outlined column's or tile's left edge)."""
    return [[(s["name"], s["x0"]) for s in json.loads(c.proto.spec)["layout"].get("shapes", [])
             if s.get("name", "").startswith("path ")] for c in at.get("plotly_chart")]


@pytest.mark.parametrize("key", [5, 31])
def test_the_walk_outlines_the_followed_item_where_the_keys_permutation_sends_it(explorers, key):
    """Steps 1-3 draw Explore's outline: the followed patch, channel and head in each column where the key's own
    permutation (symmetries.build) sends its original position, and back; each sentence says the drawn place."""
    from perm_core.engine import symmetries

    explorer = explorers[torch.float64]
    g, n = explorer.geometry, explorer.n_tokens

    def permutation(symmetry: str, space=None) -> list[int]:
        element = symmetries.build(symmetry, key, g, n)
        return element.tokens.index.tolist() if space is None else element.spaces[space][0].index.tolist()

    at = walk(walk_step=1, walk_key=key)
    token = run_step(explorer, "tokens", key).extra["follow"]["token"]
    patches = [token - g.fixed_tokens, permutation("tokens").index(token) - g.fixed_tokens, token - g.fixed_tokens]
    said = [c.value for c in at.caption if c.value.startswith(("Token", "The keys", "The inverse"))]
    assert [int(re.search(r"patch (\d+)", s).group(1)) for s in said] == patches and patches[1] != patches[0]

    at = walk(walk_step=2, walk_key=key)
    channel = run_step(explorer, "channels", key).extra["follow"]["channel"]
    want = [channel, permutation("channels", ("resid", None)).index(channel), channel]
    assert outline_places(at) == [[(f"path channel {c}", c - 0.5)] for c in want]
    said = [c.value for c in at.caption if "channel" in c.value]
    assert [int(re.findall(r"column (\d+)", s)[-1]) for s in said] == want

    at = walk(walk_step=3, walk_key=key)
    done = run_step(explorer, "heads", key)
    head, layers, step = done.extra["follow"]["head"], done.extra["grid"].layers, 8 + 1  # 8x8 tiles, 1 apart
    moved = [permutation("heads", ("heads", layer)).index(head) for layer in layers]
    assert outline_places(at) == [[(f"path head {head}", head * step - 0.5)] * len(layers),
                                  [(f"path head {p}", p * step - 0.5) for p in moved]]
    wrong = [symmetries.build("heads", key + 1, g, n).spaces[("heads", layer)][0].index.tolist().index(head)
             for layer in layers]  # the control: another key's heads land elsewhere
    assert wrong != moved


def test_the_three_hidden_states_start_at_one_height():
    """Step 2's titles take as many lines each, so the three plots start at one height (outside projector mode too,
    where nothing pads them): wrapped whole at 30 characters, "original" took one line and the others two."""
    from ui.charts.figures import wrap_title

    at = walk(walk_step=2, walk_key=7)
    lines = [json.loads(c.proto.spec)["layout"]["title"]["text"].count("<br>") for c in at.get("plotly_chart")]
    assert len(lines) == 3 and len(set(lines)) == 1, lines
    old = [wrap_title(f"block 0 hidden state: {t}", 30).count("<br>") for t in ("original", "scrambled, key 7")]
    assert old[0] != old[1]  # the control: the old titles differed
