"""Projector mode, on every page: readable from the back of a lecture hall on a 1024 x 768 projector.

One switch for the whole app (the session's "projector", mirrored into the URL as projector=1; an older link's
walk_projector=1 still turns it on): the sidebar carries it on every page, the Guided walk in its own row of
controls. When it is on, every page gets the CSS below (large text, nothing under Streamlit's 60-pixel header) and
every chart drawn through ui.export.chart is enlarged (ui.charts.figures_projector.for_projector) and drawn without
its export menu and plotly's toolbar.
"""

from __future__ import annotations

import streamlit as st

from ui.state import parse_bool, seed

KEY = "projector"
OLD_KEY = "walk_projector"  # the Guided walk's own switch, before every page had one: its links keep working
HEADER_PX = 60  # Streamlit's header (its toolbar and the button that opens the sidebar), fixed over the page
# Large text; the page's first line starts below the header (the walk's 3rem of old put the title's top under it)
CSS = """<style>
[data-testid="stMainBlockContainer"] { padding-top: 4.5rem; }
[data-testid="stMainBlockContainer"] [data-testid="stMarkdown"] p,
[data-testid="stMainBlockContainer"] [data-testid="stMarkdown"] li { font-size: 1.45rem; }
[data-testid="stMainBlockContainer"] [data-testid="stCaptionContainer"] p { font-size: 1.15rem; }
[data-testid="stMainBlockContainer"] [data-testid="stAlert"] p { font-size: 1.3rem; }
[data-testid="stMainBlockContainer"] h1 { font-size: 2.6rem; padding-top: 0; }
[data-testid="stMainBlockContainer"] h2 { font-size: 2.0rem; }
[data-testid="stMainBlockContainer"] h3 { font-size: 1.7rem; }
[data-testid="stMainBlockContainer"] .modebar-container { display: none; }
</style>"""


def seed_projector() -> bool:
    """The switch's value for this session: the URL's projector=1 (or walk_projector=1) the first time."""
    default = False
    old = st.query_params.get(OLD_KEY)
    if old is not None:
        try:
            default = parse_bool(old)
        except ValueError:
            pass
    return bool(seed(KEY, default, parse_bool))


def on() -> bool:
    return bool(st.session_state.get(KEY, False))


def _flip(widget_key: str) -> None:
    st.session_state[KEY] = bool(st.session_state[widget_key])


def toggle(where, widget_key: str) -> None:
    """The switch in `where` (the sidebar, the walk's row); each place its own widget, all showing the one state."""
    st.session_state[widget_key] = on()
    where.toggle("Projector", key=widget_key, on_change=_flip, args=(widget_key,),
                 help="large text and charts for a lecture hall's 1024 x 768 projector; no export menus")


def apply_css() -> None:
    if on():
        st.html(CSS)
