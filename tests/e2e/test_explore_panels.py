"""Real Chromium: on Explore a display change reruns and redraws only its own panel (a step of the layer slider in
each of the block's views, a step of the head slider, the choice of another block view), a key change redraws every
panel the key reaches, and every number the page states still equals the chart it describes after a sequence of
both. (Streamlit's browser leaves a chart whose figure is sent unchanged as drawn, so the DOM alone cannot tell a
panel's rerun from the page's: the websocket's frames say which ran.)

Each test watches the page's DOM with a MutationObserver: every plotly chart drawn before the action is held by the
browser, and after it the test asks which of those very elements were touched (or removed) and reads each chart's
data from plotly's own graph div (gd.data), the arrays the browser drew."""

import base64
import re

import numpy as np
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from tests.e2e.conftest import (
    CHART_TITLE,
    DENSE_VIEWS,
    block_view_of,
    block_views_shown,
    chart_titles,
    show_block_view,
    wait_for_app,
    with_block_view,
)
from tests.e2e.test_explore import set_key, wait_verdict

URL = "explore?model=digits-vit"  # three blocks, three heads: the slider moves and the page is quick
CHARTS = '[data-testid="stPlotlyChart"]'
# What a block view's own redraw must leave alone besides the other charts: the verdict and other alerts, the metrics
OUTSIDE = '[data-testid="stAlert"], [data-testid="stMetric"]'


def watch_js(selector: str = CHARTS) -> str:
    """Holds every element of the main area `selector` matches now (plotly charts unless told) and records which of
    them any later DOM change inside them touches (an element that is replaced leaves the page: isConnected).
    Changes above an element (Streamlit fading the page while a run is on) are not the element's. Each is named by
    its chart's title, or by its first 300 characters of text."""
    return "() => {" + CHART_TITLE + """
  const charts = Array.from(document.querySelectorAll('[data-testid="stMain"] :is(""" + selector + """)'));
  const touched = new Set();
  if (window.__tseObserver) window.__tseObserver.disconnect();
  window.__tseObserver = new MutationObserver(records => {
    for (const record of records) {
      for (const chart of charts) if (chart.contains(record.target)) touched.add(chart);
    }
  });
  window.__tseObserver.observe(document.querySelector('[data-testid="stMain"]'),
                               {subtree: true, childList: true, attributes: true, characterData: true});
  const name = el => { const gd = el.querySelector('.js-plotly-plot');
                       return gd ? title(gd) : el.textContent.trim().slice(0, 300); };
  const titles = new Map(charts.map(chart => [chart, name(chart)]));
  window.__tseWatched = {charts, touched, titles};
  return charts.length;
}"""


WATCH = watch_js()
# For each watched chart: its title then, and whether it is still in the page untouched.
WATCHED = """() => window.__tseWatched.charts.map(chart => ({
  title: window.__tseWatched.titles.get(chart), kept: chart.isConnected && !window.__tseWatched.touched.has(chart)}))"""
# Every chart's traces as plotly holds them (typed arrays as lists; a base64 array as plotly was sent it).
CHART_DATA = "() => {" + CHART_TITLE + """
  const plain = v => ArrayBuffer.isView(v) ? Array.from(v) : Array.isArray(v) ? v.map(plain) : v;
  return Array.from(document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')).map(gd => ({
    title: title(gd), data: gd.data.map(trace => ({name: trace.name || '', y: plain(trace.y), z: plain(trace.z)}))}));
}"""


def frames(page) -> list:
    """Every websocket frame the page receives from now on, as it arrives."""
    received = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: received.append(payload)))
    return received


def runs_and_charts(payloads) -> tuple[list[str], int]:
    """How each run the frames report ended (ForwardMsg.ScriptFinishedStatus names), and how many charts they
    carried in full."""
    ended, charts = [], 0
    for payload in payloads:
        if isinstance(payload, str):
            continue
        message = ForwardMsg.FromString(payload)
        kind = message.WhichOneof("type")
        if kind == "script_finished":
            ended.append(ForwardMsg.ScriptFinishedStatus.Name(message.script_finished))
        elif kind == "delta" and message.delta.WhichOneof("type") == "new_element":
            charts += message.delta.new_element.WhichOneof("type") == "plotly_chart"
    return ended, charts


def values(raw) -> np.ndarray:
    """A trace's array: nested lists, or {"dtype", "bdata", "shape"} as plotly was sent it."""
    if isinstance(raw, dict) and "bdata" in raw:
        flat = np.frombuffer(base64.b64decode(raw["bdata"]), dtype=raw["dtype"])
        shape = [int(n) for n in str(raw.get("shape", len(flat))).split(",")]
        return flat.reshape(shape).astype(np.float64)
    return np.asarray(raw, dtype=np.float64)


def watch(page, selector: str = CHARTS) -> None:
    page.evaluate(watch_js(selector))


def step_layer(page, arrow: str) -> int:
    thumb = page.get_by_role("slider", name="Layer (block)")
    thumb.focus()
    thumb.press(arrow)
    wait_for_app(page)
    return int(float(thumb.input_value()))


def in_block_panel(title: str) -> bool:
    """A chart of the chosen block (its maps, MLP neurons, weights, difference map): what the layer slider moves."""
    return bool(re.search(r"block \d+", title)) or title.startswith(("W:", "W′"))


def metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]').filter(has_text=label)
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


def claims(page) -> dict[str, tuple[str, str]]:
    """Each number the page states beside a chart: (what the page says, what the chart draws, formatted alike). The
    weights' numbers are read in the block's Weights view, the head's in its Attention view (the proof and the
    metrics are on the page in both); the block each view's titles name, in both. Ends on the Attention view."""
    found = {}
    for view in ("weights", "attention"):
        show_block_view(page, view)
        charts = page.evaluate(CHART_DATA)
        layer = int(float(page.get_by_role("slider", name="Layer (block)").input_value()))
        block_titles = sorted({m for c in charts for m in re.findall(r"block (\d+)", c["title"])})
        found[f"block ({view})"] = (str([str(layer)]), str(block_titles))
        if view == "weights":
            proof = next(c for c in charts if c["title"].startswith("un-scrambled vs original"))
            relative = [y for trace in proof["data"] if trace["name"].endswith("(relative)")
                        for y in values(trace["y"])]
            weights = {c["title"]: values(c["data"][0]["z"]) for c in charts if c["title"].startswith(("W:", "W′"))}
            trained, held, back = (weights[t] for t in ("W: as trained", "W′: what the scrambled model holds",
                                                        "W′ with the inverse applied"))
            caption = page.get_by_text("the scrambled model's copy differs").inner_text()
            changed, restored = re.search(r"by up to ([0-9.e+-]+), and the inverse gives it back to ([0-9.e+-]+)",
                                          caption).groups()
            found |= {"worst un-scrambled error": (metric(page, "Un-scrambled differs by"), f"{max(relative):.1e}"),
                      "tensors compared": (metric(page, "Tensors compared"), str(len(relative))),
                      "weight changed": (changed, f"{np.abs(held - trained).max():.3g}"),
                      "weight restored": (restored, f"{np.abs(back - trained).max():.1e}")}
        else:
            head = int(float(page.get_by_role("slider", name="Head").input_value()))
            heads = sorted({m for c in charts for m in re.findall(r"head (\d+)", c["title"])})
            found["head"] = (str([str(head)]), str(heads))
    return found


# Each block view's own charts: its three maps (the hidden states also their difference map)
VIEW_CHART_COUNTS = {"hidden": 4, "attention": 3, "mlp": 3, "weights": 3}
OVERLAYS = 3  # the class token's attention over the digit, in each column: above the view, in the block's panel


def test_a_layer_step_redraws_only_its_panel_in_every_block_view(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 3600})
    received = frames(page)
    page.goto(f"{app_url}/{URL}")
    wait_verdict(page)
    took = page.get_by_text("Scrambled side took").inner_text()
    layer = 2  # the page opens on the last of digits-vit's three blocks
    for view, arrow in zip(DENSE_VIEWS, ("ArrowLeft", "ArrowLeft", "ArrowRight", "ArrowRight"), strict=True):
        if view != "hidden":  # the page opens on the hidden states
            show_block_view(page, view)
        before = chart_titles(page)
        watch(page)
        received.clear()
        layer += -1 if arrow == "ArrowLeft" else 1
        assert step_layer(page, arrow) == layer, view
        ended, sent = runs_and_charts(received)
        # The server ran the block's fragment alone (not the page) and sent no chart but the block's.
        assert ended == ["FINISHED_FRAGMENT_RUN_SUCCESSFULLY"] and sent == sum(in_block_panel(t) for t in before), (
            view, ended, sent)

        watched = page.evaluate(WATCHED)
        panel = [w for w in watched if in_block_panel(w["title"])]
        others = [w for w in watched if not in_block_panel(w["title"])]
        # the overlays and the view's maps; the proof, the head grids, the outputs and the key
        assert len(panel) == OVERLAYS + VIEW_CHART_COUNTS[view] and len(others) >= 5, (view, watched)
        assert {block_view_of(w["title"]) for w in panel} == {None, view}, (view, watched)  # None: the overlays
        assert [w["title"] for w in others if not w["kept"]] == [], view  # not one other chart was touched
        assert not any(w["kept"] for w in panel), view  # every chart of the block was drawn anew
        assert any(t.startswith("un-scrambled vs original") for t in (w["title"] for w in others))
        assert page.get_by_text("Scrambled side took").inner_text() == took  # the proof's run: the same one
        after = chart_titles(page)
        assert [t for t in after if in_block_panel(t) and "block" in t and f"block {layer}" not in t] == [], view
        assert len(after) == len(before) and block_views_shown(page) == {view}, view
        assert f"block_view={view}" in page.url or view == "hidden", page.url


def test_another_block_view_redraws_only_the_block_panel(app_url, page):
    """A click on the "Show" control's buttons reruns the block's panel alone: the verdict, the metrics, the proof
    and every other chart stay as drawn, and the chosen view's charts (and no other view's) are on the page."""
    page.set_viewport_size({"width": 1400, "height": 3600})
    received = frames(page)
    page.goto(f"{app_url}/{URL}")
    wait_verdict(page)
    took = page.get_by_text("Scrambled side took").inner_text()
    assert block_views_shown(page) == {"hidden"}  # the page opens on the hidden states
    for view in ("mlp", "attention", "weights", "hidden"):
        before = chart_titles(page)
        watch(page, f"{CHARTS}, {OUTSIDE}")
        received.clear()
        show_block_view(page, view)
        ended, sent = runs_and_charts(received)
        after = chart_titles(page)
        assert ended == ["FINISHED_FRAGMENT_RUN_SUCCESSFULLY"], (view, ended)
        assert sent == sum(in_block_panel(t) for t in after), (view, sent, after)  # the block's charts alone
        watched = page.evaluate(WATCHED)
        outside = [w for w in watched if not in_block_panel(w["title"])]
        assert [w["title"] for w in outside if not w["kept"]] == [], view  # verdict, metrics, other charts: kept
        assert any(w["title"].startswith("un-scrambled vs original") for w in outside)
        assert any("un-scrambled tensors match" in w["title"] for w in outside)  # the verdict
        assert sum("Un-scrambled differs by" in w["title"] for w in outside) == 1  # a metric
        assert [w["title"] for w in watched if block_view_of(w["title"]) is not None and w["kept"]] == [], view
        # the chosen view's charts, and no other view's
        assert block_views_shown(page) == {view}, (view, after)
        assert sum(block_view_of(t) == view for t in after) == VIEW_CHART_COUNTS[view], (view, after)
        assert len(after) - len(before) == VIEW_CHART_COUNTS[view] - sum(block_view_of(t) is not None for t in before)
        assert page.get_by_text("Scrambled side took").inner_text() == took
        assert f"block_view={view}" in page.url or view == "hidden", page.url
    assert page.locator('[data-testid="stException"]').count() == 0


def test_a_head_step_redraws_only_the_attention_map(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 3600})
    received = frames(page)
    page.goto(f"{app_url}/{with_block_view(URL, 'attention')}")
    wait_verdict(page)
    assert block_views_shown(page) == {"attention"}
    watch(page)
    received.clear()
    thumb = page.get_by_role("slider", name="Head")
    thumb.focus()
    thumb.press("ArrowRight")
    wait_for_app(page)
    assert runs_and_charts(received) == (["FINISHED_FRAGMENT_RUN_SUCCESSFULLY"], 3)  # the attention map's alone
    watched = page.evaluate(WATCHED)
    redrawn = sorted(w["title"] for w in watched if not w["kept"])
    assert len(redrawn) == 3 and all(t.endswith("attention, block 2, head 0") for t in redrawn), redrawn
    assert sum("head 1" in t for t in chart_titles(page)) == 3


def test_a_key_change_redraws_every_panel_the_key_reaches(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 3600})
    page.goto(f"{app_url}/{URL}")
    wait_verdict(page)
    step_layer(page, "ArrowLeft")  # a display change first: the key change keeps the chosen block

    def chart_data() -> dict:
        return {c["title"]: c["data"] for c in page.evaluate(CHART_DATA)}

    hidden_before = chart_data()
    show_block_view(page, "weights")
    weights_before = chart_data()
    set_key(page, "channels key", "1234")
    wait_verdict(page)
    assert "k_channels=1234" in page.url and "layer=1" in page.url and "block_view=weights" in page.url
    assert block_views_shown(page) == {"weights"}  # the key change keeps the chosen view
    weights_after = chart_data()
    show_block_view(page, "hidden")
    hidden_after = chart_data()

    def z(data, title):
        return values(data[title][0]["z"])

    # The channels key reaches the scrambled side of every block view and the proof; the originals stay.
    for before, after, title in ((hidden_before, hidden_after, "Scrambled: hidden state after block 1"),
                                 (weights_before, weights_after, "W′: what the scrambled model holds")):
        assert not np.array_equal(z(before, title), z(after, title)), title
    for before, after, title in ((hidden_before, hidden_after, "Original: hidden state after block 1"),
                                 (weights_before, weights_after, "W: as trained")):
        assert np.array_equal(z(before, title), z(after, title)), title
    for before, after in ((hidden_before, hidden_after), (weights_before, weights_after)):
        assert any("key 1234" in t for t in after) and not any("key 1234" in t for t in before)
        proof = next(t for t in after if t.startswith("un-scrambled vs original"))
        assert [values(tr["y"]).tolist() for tr in before[proof]] != [values(tr["y"]).tolist()
                                                                       for tr in after[proof]]
    assert page.locator('[data-testid="stException"]').count() == 0


def test_numbers_equal_their_charts_after_steps_and_key_changes(app_url, page):
    page.set_viewport_size({"width": 1400, "height": 3600})
    page.goto(f"{app_url}/{URL}")
    wait_verdict(page)
    seen = []
    for action in ("ArrowLeft", "key 99", "ArrowLeft", "head", "key 5", "ArrowRight"):
        if action.startswith("key"):
            set_key(page, "channels key", action.split()[1])
            wait_verdict(page)
        elif action == "head":  # the Head slider is in the Attention view, where claims() ends
            thumb = page.get_by_role("slider", name="Head")
            thumb.focus()
            thumb.press("ArrowRight")
            wait_for_app(page)
        else:
            step_layer(page, action)
        found = claims(page)
        assert {k: v for k, v in found.items() if v[0] != v[1]} == {}, (action, found)
        seen.append((found["block (weights)"][0], found["head"][0], found["worst un-scrambled error"][0]))
    assert [s[:2] for s in seen] == [("['1']", "['0']"), ("['1']", "['0']"), ("['0']", "['0']"),
                                    ("['0']", "['1']"), ("['0']", "['1']"), ("['1']", "['1']")]
    assert all(float(s[2]) < 1e-4 for s in seen)
    assert "k_channels=5" in page.url and "layer=1" in page.url and "head=1" in page.url
