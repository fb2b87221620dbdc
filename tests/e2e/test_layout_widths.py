"""Real Chromium on every page, loaded at 1024 px and then widened to 1440 px without reloading (a projector, then a
laptop's window made wider; a wider window only adds room): at each width nothing a lecturer points at is clipped
(titles, metrics, captions, formulas, chart titles and labels, tables) or covered (a chart's title, axis titles,
legend and annotations by each other, a chart by another), no chart is blank, no exception. Widening without a
reload is the harder case: plotly keeps the margins a chart pushed at the narrower width, and legends placed under a
plot at a fraction of its height then landed on axis titles. Screenshots of every page at every width go to
out/screenshots/ for a person to look at.

Explore shows one view of the chosen block at a time (hidden states, attention, MLP neurons or weights, chosen in its
"Show" control and kept in the link): each view of Explore, on dinov2-s and on random:gpt2, is a page of its own here
(opened by its link), so that each view's charts are drawn at 1024 px and widened.

The same page loads also check what each application page must show (its proofs, metrics and charts), so that no
page is loaded twice in Chromium for it."""

import json
from pathlib import Path

import plotly
import pytest

from serve.local_server import DRAWN
from tests.e2e.conftest import DENSE_VIEWS, block_views_shown, patiently, wait_for_app, with_block_view

SCREENSHOTS = Path(__file__).resolve().parents[2] / "out" / "screenshots"
WIDTHS = (1024, 1440)
PAGES = {
    "home": "",
    "explore": "explore",
    "explore_text": "explore?model=random:gpt2",  # next-token outputs and their formula
    "check": "check?model=digits-vit",
    "backward": "backward",
    "authorization": "authorization?au_model=digits-vit&au_attack_steps=100",  # the attacker's sweep, short
    "split_learning": "split_learning?sl_epochs=2&sl_attack_epochs=3&sl_victims=40",
    "rotation": "rotation",
    "fusion": "fusion?fx_width=32&fx_epochs=1&fx_run=1",  # the experiment's pairs tiny: the same charts in seconds
    "matrix": "matrix",
    "walk_tokens": "walk?walk_step=1",
    "walk_heads": "walk?walk_step=3&walk_projector=1",
    "walk_exact": "walk?walk_step=5",
}
# Explore's pages above open on the block's hidden states; each other view of the block is a page of its own
EXPLORE_PAGES = ("explore", "explore_text")
PAGES |= {f"{name}_{view}": with_block_view(PAGES[name], view) for name in EXPLORE_PAGES for view in DENSE_VIEWS[1:]}


def block_view(name: str) -> str | None:
    """The block view a page of Explore here shows (its name's last part, or the hidden states); None elsewhere."""
    return next((view for view in DENSE_VIEWS[1:] if name.endswith(f"_{view}")), "hidden") if name.startswith(
        EXPLORE_PAGES) else None

# Every element whose content is wider than its box, and every chart text outside its chart.
CLIPPED = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const clipped = [];
  const selectors = 'h1, h2, h3, [data-testid="stMetricValue"], [data-testid="stMetricLabel"], '
    + '[data-testid="stCaptionContainer"], [data-testid="stMarkdownContainer"] p, .katex-display, '
    + '[data-testid="stWidgetLabel"], .stMarkdownEllipsis, .stMarkdownEllipsis p';
  for (const el of main.querySelectorAll(selectors)) {
    if (el.offsetParent !== null && el.scrollWidth > el.clientWidth + 3) {
      const what = el.getAttribute('data-testid') || el.className;
      clipped.push(el.tagName + ' ' + what + ': ' + el.textContent.slice(0, 80));
    }
  }
  // A table cut at the right: st.table's own table wider than its box, or a data frame's grid scrolling sideways
  for (const table of main.querySelectorAll('[data-testid="stTable"]')) {
    if (table.offsetParent !== null && table.scrollWidth > table.clientWidth + 3) {
      clipped.push('table: ' + table.textContent.slice(0, 80));
    }
  }
  for (const frame of main.querySelectorAll('[data-testid="stDataFrame"]')) {
    const scroller = frame.querySelector('.dvn-scroller');
    if (frame.offsetParent !== null && scroller && scroller.scrollWidth > scroller.clientWidth + 3) {
      clipped.push('data frame: ' + (frame.getAttribute('aria-label') || frame.textContent.slice(0, 80)));
    }
  }
  for (const plot of main.querySelectorAll('.js-plotly-plot')) {
    const box = plot.getBoundingClientRect();
    for (const text of plot.querySelectorAll('.gtitle, .annotation-text, .legendtext')) {
      const r = text.getBoundingClientRect();
      if (r.width > 0 && (r.left < box.left - 2 || r.right > box.right + 2)) {
        clipped.push('chart text: ' + text.textContent.slice(0, 80));
      }
    }
  }
  return clipped;
}"""

# Two boxes that overlap by more than `margin` px both across and down: the one box test of the checks below
MEET = """  const meet = (a, b, margin) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > margin
    && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > margin;"""

# Texts of one chart that cover each other (its title, axis titles, legend, annotations such as subplot titles and
# threshold labels), and charts that cover each other: what a lecturer saw at 1024 px as merged titles, a legend
# over an axis title, 'originarotated model'. Tick labels are left out: a dense axis may touch its neighbours.
OVERLAPS = """() => {
""" + MEET + """
  const main = document.querySelector('[data-testid="stMain"]');
  const found = [];
  const plots = Array.from(main.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null);
  for (const plot of plots) {
    const texts = Array.from(plot.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text, .g-x2title text, '
      + '.g-y2title text, .legend .legendtext, .annotation-text'))
      .map(t => ({text: t.textContent.trim(), box: t.getBoundingClientRect()}))
      .filter(t => t.text && t.box.width > 0);
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        if (meet(texts[i].box, texts[j].box, 2)) {
          found.push('chart texts overlap: "' + texts[i].text.slice(0, 40) + '" / "'
            + texts[j].text.slice(0, 40) + '"');
        }
      }
    }
  }
  for (let i = 0; i < plots.length; i++) {
    for (let j = i + 1; j < plots.length; j++) {
      if (meet(plots[i].getBoundingClientRect(), plots[j].getBoundingClientRect(), 2)) {
        found.push('charts overlap: ' + i + ' / ' + j);
      }
    }
  }
  return found;
}"""

# Tick labels of one chart that collide: horizontal tick labels of every axis of the chart (the panels of Rotation's
# side by side read "0 5 10 150 5 10 15" at 1024 px: the last tick of one panel ran into the first of the next), the
# labels of a y axis, and slanted labels (the key tokens under an attention map at 1024 px). Slanted labels' boxes
# overlap where their letters do not, so two of one axis, drawn at the same angle, collide when their baselines lie
# closer than 0.8 of their font size across the text: the anchor of each (its x, y through the page's transform)
# is on its baseline, and the baselines are parallel.
TICKS = """() => {
""" + MEET + """
  const found = [];
  const angle = t => { const m = /rotate\\(([-\\d.]+)/.exec(t.getAttribute('transform') || ''); return m ? +m[1] : 0; };
  for (const plot of document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')) {
    if (plot.offsetParent === null) continue;
    const title = (plot.querySelector('.gtitle') || {}).textContent || '(untitled)';
    const texts = Array.from(plot.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text'))
      .filter(t => t.textContent.trim())
      .map(t => {
        const anchor = new DOMPoint(+t.getAttribute('x') || 0, +t.getAttribute('y') || 0)
          .matrixTransform(t.getScreenCTM());
        return {text: t.textContent.trim(), box: t.getBoundingClientRect(), angle: angle(t),
                layer: t.closest('g[class$="layer-above"]'), anchor,
                size: parseFloat(getComputedStyle(t).fontSize) || 10};
      })
      .filter(t => t.box.width > 0);
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const [a, b] = [texts[i], texts[j]];
        let collide;
        if (a.angle === 0 && b.angle === 0) {
          collide = meet(a.box, b.box, 1);
        } else {
          const rad = a.angle * Math.PI / 180;
          const across = Math.abs((b.anchor.x - a.anchor.x) * Math.sin(rad)
            - (b.anchor.y - a.anchor.y) * Math.cos(rad));
          collide = a.layer === b.layer && a.angle === b.angle && meet(a.box, b.box, 1)
            && across < 0.8 * Math.min(a.size, b.size);
        }
        if (collide) {
          found.push('tick labels collide in "' + title.slice(0, 40) + '": "' + a.text + '" / "' + b.text + '"');
        }
      }
    }
  }
  return found;
}"""

# A legend over a chart's axis labels (its tick labels, slanted or not, and axis titles): under the plot at a fraction
# of its height it covered the tensor names on Check and the walk's step 5.
LEGEND_OVER_LABELS = """() => {
""" + MEET + """
  const found = [];
  for (const plot of document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')) {
    if (plot.offsetParent === null) continue;
    const legends = Array.from(plot.querySelectorAll('.legend .traces')).map(t => t.getBoundingClientRect())
      .filter(r => r.width > 0);
    const labels = Array.from(plot.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text, '
      + '.g-xtitle text, .g-ytitle text, .g-x2title text, .g-y2title text'))
      .filter(t => t.textContent.trim()).map(t => ({text: t.textContent.trim(), box: t.getBoundingClientRect()}));
    for (const legend of legends) {
      for (const label of labels) {
        if (meet(legend, label.box, 1)) {
          found.push('legend over the axis label "' + label.text.slice(0, 40) + '"');
        }
      }
    }
  }
  return found;
}"""

# Words cut in two by a line break ("ViTForImageC / lassification" in the symmetry matrix): a word whose letters lie
# on more than one line. Words are split at spaces, hyphens and slashes (where a break is a line break, not a cut);
# each text node on its own (a <wbr> between the words of a class name makes them separate nodes).
BROKEN_WORDS = """() => {
  const found = [];
  const main = document.querySelector('[data-testid="stMain"]');
  const blocks = main.querySelectorAll('h1, h2, h3, p, li, th, td, [data-testid="stMetricLabel"], '
    + '[data-testid="stCaptionContainer"], [data-testid="stWidgetLabel"]');
  const seen = new Set();
  for (const block of blocks) {
    if (block.offsetParent === null) continue;
    const walker = document.createTreeWalker(block, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (seen.has(node) || node.parentElement.closest('.katex, code, pre')) continue;
      seen.add(node);
      const text = node.textContent;
      const words = /[^\\s\\-\\/\u2011\u2013\u2014]+/g;
      for (let match = words.exec(text); match; match = words.exec(text)) {
        if (match[0].length < 2) continue;
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const tops = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
          .map(r => Math.round(r.top)));
        if (tops.size > 1) found.push('word cut across lines: ' + match[0].slice(0, 40));
      }
    }
  }
  return found;
}"""

# The page's title (or first text) under Streamlit's header, which is fixed over the page: the walk's projector mode
# started the page 3rem from the top, and the header's 60 px covered the top of the title.
UNDER_HEADER = """() => {
  const header = document.querySelector('[data-testid="stHeader"]');
  const first = document.querySelector('[data-testid="stMain"] h1, [data-testid="stMain"] [data-testid="stMarkdown"]');
  if (!header || !first) return [];
  const bottom = header.getBoundingClientRect().bottom, top = first.getBoundingClientRect().top;
  return top < bottom - 1 ? ['under the header: "' + first.textContent.slice(0, 40) + '" at ' + Math.round(top)
    + ' px, the header ends at ' + Math.round(bottom) + ' px'] : [];
}"""

# Every layout check of a drawn page, by name (each has a planted case in test_layout_checks_catch_planted_defects)
LAYOUT_CHECKS = {"clipped": CLIPPED, "overlaps": OVERLAPS, "ticks": TICKS, "legend": LEGEND_OVER_LABELS,
                 "broken words": BROKEN_WORDS, "under the header": UNDER_HEADER}


def layout_problems(page) -> list[str]:
    """Every layout check's findings on the page as it is drawn now, and every blank chart."""
    found = [problem for check in LAYOUT_CHECKS.values() for problem in page.evaluate(check)]
    return found + [f"blank chart: {title}" for title in page.evaluate(BLANK)]


BLANK = """() => Array.from(document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')).filter(
  plot => plot.querySelectorAll('.plot path, .plot image, .plot rect, .layer-above image, .imagelayer image, '
    + '.heatmaplayer image, .barlayer path, .scatterlayer path, .gl-container canvas').length === 0
).map(plot => (plot.querySelector('.gtitle') || {}).textContent || '(untitled)')"""


# How many elements the page holds, and whether a script run is going on: a page has settled when it is not
# running and its count held still for a while (a page whose run has not begun yet holds only its frame)
ELEMENTS = """() => [document.querySelectorAll('[data-testid="stMain"] [data-testid="stElementContainer"]').length,
  !!document.querySelector('[data-testid="stStatusWidget"]')]"""


def settle(page, timeout_ms: int = 300_000) -> None:
    waited, last, still = 0, None, 0
    while still < 3:
        page.wait_for_timeout(250)
        waited += 250
        count, running = page.evaluate(ELEMENTS)
        still = still + 1 if count == last and count > 0 and not running else 0
        last = count
        assert waited < timeout_ms, f"the page did not settle in {timeout_ms / 1000:.0f} s"


def rotation_shows_its_proof(page) -> None:
    """The proof, side-by-side heatmaps and the near misses."""
    assert page.get_by_text("Rotated model is the same function").count() >= 1
    assert page.get_by_text("broken, as it must be").count() >= 1
    assert page.locator('[data-testid="stPlotlyChart"]').count() >= 8


def split_learning_shows_its_measurements(page) -> None:
    """It trained, attacked, and shows the table (every column in view) and the reconstructions."""
    assert page.get_by_text("What the measurements say").count() == 1
    assert page.locator(".js-plotly-plot .main-svg").count() >= 3
    table = page.locator('[data-testid="stTable"]')
    assert table.count() == 1 and "channels recovered" in table.inner_text()
    labels = page.locator('[data-testid="stMetricLabel"]').all_inner_texts()
    assert any("Scrambled: held-out" in label for label in labels)
    assert page.get_by_text("Without protection the decoder's reconstructions reach SSIM").count() == 1


def backward_shows_gradients_and_training(page) -> None:
    """Gradient heatmaps, the error chart and the SGD lock-step, the gradients un-scrambled within 1e-9."""
    assert page.get_by_text("gradients (the input's and every parameter's) un-scramble to the original").count() >= 1
    assert page.get_by_text("the scrambled world's update equals the scrambled original update").count() >= 1
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 11
    error_text = page.locator('[data-testid="stMetric"]').filter(has_text="Max relative gradient error")
    assert float(error_text.locator('[data-testid="stMetricValue"]').inner_text()) < 1e-9


def fusion_shows_methods_and_experiment(page) -> None:
    """The four methods, the three alignments' proofs (plain averaging aligns nothing), the barrier curves; then the
    experiment over seed pairs (tiny here: 32 wide, one epoch) with its sentence and four charts."""
    assert page.get_by_text("Over 5 seed pairs, adding per-head rotations").count() == 1
    alerts = page.locator('[data-testid="stAlert"]')
    texts = [alerts.nth(i).inner_text() for i in range(alerts.count())]
    assert sum("broken, as it must be" in text for text in texts) == 3  # the three alignments' proofs
    assert sum("nothing to prove" in text or "no aligned B to prove" in text for text in texts) == 1  # averaging
    assert page.locator('[data-testid="stPlotlyChart"]').count() == 8  # the pair's four, the experiment's four


def authorization_shows_the_keys_worth(page) -> None:
    """The right key restores the model exactly, no key does not, the attacker recovers the key (100 steps), and the
    key's size in bits."""
    assert page.get_by_text("The right key restores the model exactly").count() >= 1
    assert page.get_by_text("The key is broken").count() >= 1
    values = {}
    for i in range(page.locator('[data-testid="stMetric"]').count()):
        metric = page.locator('[data-testid="stMetric"]').nth(i)
        values[metric.locator('[data-testid="stMetricLabel"]').inner_text().strip()] = metric.locator(
            '[data-testid="stMetricValue"]').inner_text().strip()
    percent = {label: float(value.rstrip("%")) / 100 for label, value in values.items() if value.endswith("%")}
    assert percent["Right key"] > 0.95 and percent["No key"] < 0.3 and percent["Chance"] == 0.1
    assert values["Key recovered"] == "exactly" and values["Attacker's unlocked model"] == values["Right key"]
    assert page.get_by_text("Keys are 64-bit whole numbers, as on every page").count() == 1
    assert page.get_by_text("64! orderings of the residual channels, 296 bits").count() == 1


# What an application page must show, checked on the layout test's own load of it (at the first width)
SHOWS = {"rotation": rotation_shows_its_proof, "split_learning": split_learning_shows_its_measurements,
         "backward": backward_shows_gradients_and_training, "fusion": fusion_shows_methods_and_experiment,
         "authorization": authorization_shows_the_keys_worth}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_page_is_readable_at_every_width(app_url, page, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 2400})  # Streamlit scrolls inside its own container
        if width == WIDTHS[0]:
            page.goto(f"{app_url}/{PAGES[name]}")
            wait_for_app(page, timeout_ms=300_000)
            if name == "check":
                button = page.get_by_role("button", name="Run check")
                patiently(lambda ms, run=button: run.wait_for(timeout=ms), 180_000)
                button.click()
                patiently(lambda ms: page.get_by_text("PASSED").first.wait_for(timeout=ms), 180_000)
            if name == "matrix":  # measured row by row on the first visit
                patiently(lambda ms: page.locator("table.symmetry-matrix").wait_for(timeout=ms), 300_000)
        settle(page)
        page.wait_for_timeout(500)  # plotly draws after the script run ends, and again after a resize
        # every chart drawn: an undrawn one has no text to overlap
        patiently(lambda ms: page.wait_for_function(DRAWN, timeout=ms), 120_000)
        assert page.locator('[data-testid="stException"]').count() == 0, (name, width)
        if block_view(name) is not None:  # the view the link asked for, and no other
            assert block_views_shown(page) == {block_view(name)}, (name, width)
        if width == WIDTHS[0] and name in SHOWS:
            SHOWS[name](page)
        screenshot = SCREENSHOTS / f"{name}-{width}.png"
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 20_000, (name, width)  # a page drawn, not a blank frame
        found = layout_problems(page)
        if found:
            problems[width] = found
    assert problems == {}


FIRST_CHART_TOP = """() => {
  const chart = document.querySelector('[data-testid="stMain"] .js-plotly-plot');
  return chart ? chart.getBoundingClientRect().top : null;
}"""

# In projector mode: each chart's title lines (plotly draws a <br> line as a tspan.line), its smallest font, and the
# export menus left on the page
PROJECTOR_CHARTS = """() => ({
  titles: Array.from(document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot .gtitle')).map(t => ({
    text: t.textContent.trim(), lines: Math.max(1, t.querySelectorAll('tspan.line').length)})),
  exports: Array.from(document.querySelectorAll('[data-testid="stMain"] button')).filter(
    b => b.textContent.includes('Export')).length,
  modebars: document.querySelectorAll('[data-testid="stMain"] .modebar-container .modebar-group').length,
})"""


def projector_link(path: str) -> str:
    return path + ("&" if "?" in path else "?") + "projector=1"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_projector_mode_at_1024_by_768_on_every_page(app_url, page, name):
    """A lecture hall's projector is often 1024 x 768: with projector mode on (a link with projector=1 folds the menu
    away) every page starts below Streamlit's header, no chart title takes more than two lines, no export menu or
    chart toolbar is left, and the layout checks find nothing; the walk's first chart starts in the top 60%."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{app_url}/{projector_link(PAGES[name])}")
    wait_for_app(page, timeout_ms=300_000)
    if name == "check":
        page.get_by_role("button", name="Run check").click()
        patiently(lambda ms: page.get_by_text("PASSED").first.wait_for(timeout=ms), 180_000)
    if name == "matrix":
        patiently(lambda ms: page.locator("table.symmetry-matrix").wait_for(timeout=ms), 300_000)
    settle(page)
    page.wait_for_timeout(500)
    patiently(lambda ms: page.wait_for_function(DRAWN, timeout=ms), 120_000)
    page.screenshot(path=str(SCREENSHOTS / f"projector_{name}-1024x768.png"))
    if block_view(name) is not None:
        assert block_views_shown(page) == {block_view(name)}, name
    assert page.evaluate(UNDER_HEADER) == []
    charts = page.evaluate(PROJECTOR_CHARTS)
    assert [t for t in charts["titles"] if t["lines"] > 2] == []
    assert charts["exports"] == 0 and charts["modebars"] == 0
    if name.startswith("walk"):
        top = page.evaluate(FIRST_CHART_TOP)
        assert top is not None and top <= 0.6 * 768, top
    page.set_viewport_size({"width": 1024, "height": 2400})  # the rest of the page, drawn at the same width
    page.wait_for_timeout(500)
    assert layout_problems(page) == []


# Where the walk's Previous and Next buttons are
BUTTONS = """() => ['Previous', 'Next'].map(name => {
  const button = Array.from(document.querySelectorAll('[data-testid="stMain"] button')).find(
    b => b.textContent.trim().endsWith(name));
  if (!button) return null;
  const r = button.getBoundingClientRect();
  return {name, left: Math.round(r.left), top: Math.round(r.top)};
})"""


def buttons_moved(boxes: dict) -> list[str]:
    """boxes: step -> [Previous's box, Next's box]. Every step must draw both where the first step drew them."""
    first_step, first = next(iter(boxes.items()))
    return [f"step {step}: {box['name']} at ({box['left']}, {box['top']}), step {first_step} at "
            f"({reference['left']}, {reference['top']})" for step, found in boxes.items()
            for box, reference in zip(found, first, strict=True)
            if box is None or abs(box["left"] - reference["left"]) > 1 or abs(box["top"] - reference["top"]) > 1]


@pytest.mark.parametrize("projector", [0, 1])
def test_previous_and_next_stay_in_place_on_every_step(app_url, page, projector):
    """A lecturer clicks Next in the same place on every step: titles that wrap (steps 2 and 5) used to push the
    buttons down. Clicked through all five steps, at 1024 and at 1440 px."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 768})
        page.goto(f"{app_url}/walk?walk_step=1&projector={projector}")
        wait_for_app(page, timeout_ms=300_000)
        boxes = {1: page.evaluate(BUTTONS)}
        for step in range(2, 6):
            page.get_by_role("button", name="Next").click()
            wait_for_app(page, timeout_ms=120_000)
            page.wait_for_function(f"() => document.querySelector('[data-testid=\"stMain\"] h1')"
                                   f".textContent.startsWith('{step}.')", timeout=120_000)
            boxes[step] = page.evaluate(BUTTONS)
        assert buttons_moved(boxes) == [], width


# The planted defects each layout check must catch, each beside its fixed form that it must pass
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def planted(page, body: str, figures: dict | None = None, width: int = 1024) -> None:
    """A bare page with Streamlit's header and main area (their test ids) holding `body`, and plotly figures drawn
    into the divs their keys name."""
    page.set_viewport_size({"width": width, "height": 900})
    page.set_content('<html><body style="margin:0;font-family:sans-serif">'
                     '<header data-testid="stHeader" style="position:fixed;top:0;left:0;right:0;height:60px;'
                     'background:white"></header>'
                     f'<section data-testid="stMain">{body}</section></body></html>')
    page.add_script_tag(path=str(PLOTLY_JS))
    for div, fig in (figures or {}).items():
        spec = json.loads(fig.to_json())
        page.evaluate("([div, spec]) => Plotly.newPlot(div, spec.data, spec.layout)", [div, spec])


def test_layout_checks_catch_planted_defects(page):
    import numpy as np
    import plotly.graph_objects as go
    import torch
    from plotly.subplots import make_subplots

    from ui.charts import figures_fusion
    from ui.charts.figures_heatmap import heatmap
    from ui.charts.figures_proof import tensor_error_chart
    from ui.matrix_table import class_name_html

    # tick labels that collide: two panels' x ticks close together, as Rotation's side by side had them
    rng = np.random.default_rng(0)
    a = rng.normal(size=(16, 16))
    old = make_subplots(1, 2, horizontal_spacing=0.0)
    for col in (1, 2):
        old.add_trace(go.Heatmap(z=a, showscale=False), 1, col)
    old.update_layout(width=300, height=260, margin=dict(l=30, r=10, t=20, b=30), font_size=14)
    new = figures_fusion.side_by_side(torch.tensor(a), torch.tensor(a), "side by side")
    new.update_layout(width=300)
    planted(page, '<div id="old"></div><div id="new"></div>', {"old": old, "new": new})
    assert any("tick labels collide" in f for f in page.evaluate(TICKS))
    page.evaluate("() => document.getElementById('old').remove()")
    assert page.evaluate(TICKS) == []

    # slanted tick labels that collide: an attention map's twelve key tokens at -60 degrees in a third of a
    # 1024-pixel page (a fixed list of ticks), against the same map with its tokens as categories
    tokens = [f"#{7 * i}" for i in range(12)]
    attention = rng.random((12, 12))
    attention /= attention.sum(1, keepdims=True)
    old = go.Figure(go.Heatmap(z=attention))
    old.update_layout(width=200, height=300, xaxis=dict(tickmode="array", tickvals=list(range(12)), ticktext=tokens,
                                                        tickangle=-60, tickfont_size=9))
    new = heatmap(attention, "attention", "key token", "query token", colorscale="Viridis", symmetric=False,
                  y_labels=tokens, x_labels=tokens)
    new.update_layout(width=200)
    planted(page, '<div id="old"></div><div id="new"></div>', {"old": old, "new": new})
    assert any("tick labels collide" in f and "#7" in f for f in page.evaluate(TICKS))
    page.evaluate("() => document.getElementById('old').remove()")
    assert page.evaluate(TICKS) == []

    # a legend over the axis labels: under the plot at a fraction of its height (Check's chart had y=-0.12)
    names = [f"blocks.{i}.hidden" for i in range(6)]
    old = go.Figure([go.Bar(x=names, y=[1, 2, 3, 4, 5, 6], name="relative"),
                     go.Bar(x=names, y=[2, 3, 4, 5, 6, 7], name="absolute")])
    old.update_layout(width=700, height=300, legend=dict(orientation="h", y=-0.12), xaxis=dict(tickangle=-45))
    new = tensor_error_chart(names, [1e-7] * 6, [1e-8] * 6, "tensors", 1e-6)
    new.update_layout(width=700)
    planted(page, '<div id="old"></div><div id="new"></div>', {"old": old, "new": new})
    assert any("legend over the axis label" in f for f in page.evaluate(LEGEND_OVER_LABELS))
    page.evaluate("() => document.getElementById('old').remove()")
    assert page.evaluate(LEGEND_OVER_LABELS) == []

    # two charts over each other (the same box test at its 2 px margin)
    planted(page, '<div id="old" style="position:absolute;top:100px"></div><div id="new" style="position:absolute;'
                  'top:200px;left:100px"></div>', {"old": old, "new": new})
    assert "charts overlap: 0 / 1" in page.evaluate(OVERLAPS)
    page.evaluate("() => document.getElementById('old').remove()")
    assert page.evaluate(OVERLAPS) == []

    # a word cut across lines: a class name in a narrow cell that may break anywhere
    css = Path(__file__).resolve().parents[2].joinpath("assets", "app.css").read_text()
    def cell(name: str) -> str:
        return (f'<style>{css}</style><table class="symmetry-matrix" style="width:90px"><tr><th>{name}</th>'
                '</tr></table>')

    planted(page, cell("ViTForImageClassification"))
    assert any("ViTForImageClassification" in f for f in page.evaluate(BROKEN_WORDS))
    planted(page, cell(class_name_html("ViTForImageClassification")))
    assert page.evaluate(BROKEN_WORDS) == []

    # a title under the header: the page starts 3rem from the top (the walk's old projector mode)
    planted(page, '<div style="padding-top:3rem"><h1 style="margin:0">2. Shuffle the channels</h1></div>')
    assert page.evaluate(UNDER_HEADER) != []
    planted(page, '<div style="padding-top:4.5rem"><h1 style="margin:0">2. Shuffle the channels</h1></div>')
    assert page.evaluate(UNDER_HEADER) == []

    # buttons that move: a title above them that wraps on one step and not on the other
    steps = {}
    for step, title in ((1, "1. Short"), (2, "2. A title long enough to wrap onto a second line in a narrow box")):
        planted(page, f'<div style="width:300px;padding-top:5rem"><h1>{title}</h1><button>Previous</button>'
                      '<button>Next</button></div>')
        steps[step] = page.evaluate(BUTTONS)
    assert buttons_moved(steps) and buttons_moved({1: steps[1], 2: steps[1]}) == []
