"""Real Chromium on every page, loaded at 1024 px and then widened to 1440 px without reloading (a projector, then a
laptop's window made wider; a wider window only adds room): at each width nothing a lecturer points at is clipped
(titles, metrics, captions, formulas, chart titles and labels, tables) or covered (a chart's title, axis titles,
legend and annotations by each other, a chart by another), no chart is blank, no exception. Widening without a
reload is the harder case: plotly keeps the margins a chart pushed at the narrower width, and legends placed under a
plot at a fraction of its height then landed on axis titles. Screenshots of every page at every width go to
out/screenshots/ for a person to look at.

The same page loads also check what each application page must show (its proofs, metrics and charts), so that no
page is loaded twice in Chromium for it."""

from pathlib import Path

import pytest

from serve.local_server import DRAWN
from tests.e2e.conftest import wait_for_app

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

# Texts of one chart that cover each other (its title, axis titles, legend, annotations such as subplot titles and
# threshold labels), and charts that cover each other: what a lecturer saw at 1024 px as merged titles, a legend
# over an axis title, 'originarotated model'. Tick labels are left out: a dense axis may touch its neighbours.
OVERLAPS = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const found = [];
  const meet = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 2
    && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 2;
  const plots = Array.from(main.querySelectorAll('.js-plotly-plot')).filter(p => p.offsetParent !== null);
  for (const plot of plots) {
    const texts = Array.from(plot.querySelectorAll('.gtitle, .g-xtitle text, .g-ytitle text, .g-x2title text, '
      + '.g-y2title text, .legend .legendtext, .annotation-text'))
      .map(t => ({text: t.textContent.trim(), box: t.getBoundingClientRect()}))
      .filter(t => t.text && t.box.width > 0);
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        if (meet(texts[i].box, texts[j].box)) {
          found.push('chart texts overlap: "' + texts[i].text.slice(0, 40) + '" / "'
            + texts[j].text.slice(0, 40) + '"');
        }
      }
    }
  }
  for (let i = 0; i < plots.length; i++) {
    for (let j = i + 1; j < plots.length; j++) {
      if (meet(plots[i].getBoundingClientRect(), plots[j].getBoundingClientRect())) {
        found.push('charts overlap: ' + i + ' / ' + j);
      }
    }
  }
  return found;
}"""

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
                button.wait_for(timeout=180_000)
                button.click()
                page.get_by_text("PASSED").first.wait_for(timeout=180_000)
            if name == "matrix":  # measured row by row on the first visit
                page.locator("table.symmetry-matrix").wait_for(timeout=300_000)
        settle(page)
        page.wait_for_timeout(500)  # plotly draws after the script run ends, and again after a resize
        page.wait_for_function(DRAWN, timeout=120_000)  # every chart drawn: an undrawn one has no text to overlap
        assert page.locator('[data-testid="stException"]').count() == 0, (name, width)
        if width == WIDTHS[0] and name in SHOWS:
            SHOWS[name](page)
        screenshot = SCREENSHOTS / f"{name}-{width}.png"
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 20_000, (name, width)  # a page drawn, not a blank frame
        found = (page.evaluate(CLIPPED) + page.evaluate(OVERLAPS)
                 + [f"blank chart: {title}" for title in page.evaluate(BLANK)])
        if found:
            problems[width] = found
    assert problems == {}


FIRST_CHART_TOP = """() => {
  const chart = document.querySelector('[data-testid="stMain"] .js-plotly-plot');
  return chart ? chart.getBoundingClientRect().top : null;
}"""


@pytest.mark.parametrize("step", range(1, 6))
def test_projector_mode_shows_each_steps_chart_on_a_1024_by_768_screen(app_url, page, step):
    """A lecture hall's projector is often 1024 x 768: with projector mode on (a link with walk_projector=1 folds
    the menu away) each step's first chart starts in the top 60% of the screen, its plot in view."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1024, "height": 768})
    page.goto(f"{app_url}/walk?walk_step={step}&walk_projector=1")
    wait_for_app(page, timeout_ms=300_000)
    page.wait_for_function(DRAWN, timeout=120_000)
    page.screenshot(path=str(SCREENSHOTS / f"walk_projector_{step}-1024x768.png"))
    top = page.evaluate(FIRST_CHART_TOP)
    assert top is not None and top <= 0.6 * 768, top
