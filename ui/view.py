"""The view of a run without the sidebar's controls: what app.py and a page without a model (Home, the Guided walk,
the Symmetry matrix) need, importing neither torch nor the library, so a just-started server's Home does not wait
for them. ui.sidebar renders the controls (model, input, keys) and imports both when a page has them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import streamlit as st

from ui.state import DEFAULT_KEYS, use_navigation_registry

if TYPE_CHECKING:
    from perm_core.models.registry import LoadedModel

# The view app.py rendered in this script run. Per thread, not in session state: a script run happens in one
# thread, and the end of a stopped run (app.py's finally) cannot touch session state, which raises the stop again.
_THIS_RUN = threading.local()
# The sidebar's widget keys (a file upload cannot be set through session state, so it is not kept); DEFAULT_KEYS
# names every symmetry (tests/unit/test_view.py holds it to perm_core's SYMMETRIES).
KEPT_KEYS = ("model", "dtype", "device", "img_src", "digit", "img_sample", "txt_src", "ids_src", "n_ids", "ids_seed",
             "txt_sample", "text", *(f"on_{n}" for n in DEFAULT_KEYS), *(f"k_{n}" for n in DEFAULT_KEYS))
NOTES = {"own": "This page has its own controls, on the page. The model, input and keys chosen here for Explore "
                "and Check are kept, and come back with them.",
         "none": "Explore and Check take their model, input and keys from this sidebar: open one of them to "
                 "choose."}


@dataclass
class View:
    model_name: str
    dtype_name: str
    device: str
    loaded: LoadedModel | None = None
    inputs: dict | None = None
    input_id: str = ""  # identifies the input for caching (sample name, digit index, content hash)
    input_label: str = ""
    input_spec: str | None = None  # the CLI's --input for this input (perm_core.models.input_spec); None for uploads
    image: object | None = None  # the PIL image shown, for image models
    credit: str = ""  # attribution the input's licence asks for, shown wherever the input is shown
    keys: dict[str, int] = field(default_factory=dict)  # active symmetries -> validated key
    problems: list[str] = field(default_factory=list)  # st.error in the page
    notices: list[str] = field(default_factory=list)  # st.warning in the page

    @property
    def ready(self) -> bool:
        return self.loaded is not None and self.inputs is not None and not self.problems

    def show_messages(self) -> None:
        for problem in self.problems:
            st.error(problem)
        for notice in self.notices:
            st.warning(notice)


def current_view() -> View | None:
    return st.session_state.get("view")


def ensure_view(scope: str = "full", render=None) -> View:
    """The view of this run. app.py renders the sidebar before the page; a page run on its own (Streamlit's
    old pages/ mode, which AppTest uses after switch_page) reruns once through app.py, else renders it: with
    render(scope) for a page with the sidebar's controls (ui.sidebar.ensure_view passes ui.sidebar.render_sidebar)."""
    if getattr(_THIS_RUN, "view", None) is not None:
        return _THIS_RUN.view
    if not st.session_state.pop("_nav_rerun", False):
        st.session_state["_nav_rerun"] = True  # app.py clears it; a second bare run renders the sidebar here
        use_navigation_registry()
        st.rerun()
    view = without_controls(scope) if scope in NOTES else render(scope)
    end_run()
    return view


_RUN = threading.local()  # whether this script thread is inside app.py's run (the navigation runs the page in it)


def app_run(on: bool) -> None:
    """app.py's run begins (True) or ends (False) in this script thread."""
    _RUN.on = on


def through_app() -> None:
    """The first statement of every page. Streamlit runs a file of pages/ by itself, without app.py ("pages
    directory" mode, its first multipage scheme), for a session whose run starts on a just-started server before any
    run of app.py has called st.navigation, which turns that mode off: a classroom opening links at once got pages
    with no sidebar, no first-import guard (ui.runtime.first_imports) and half-imported libraries. Such a run turns the
    mode off itself and runs again, through app.py, on the same page (a page's hash is its URL path in both)."""
    if getattr(_RUN, "on", False):
        return
    from pathlib import Path

    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    context = get_script_run_ctx()
    if context is None or Path(context.pages_manager.main_script_path).parent.name == "pages":
        return  # a page run as an app of its own (an AppTest of one page)
    PagesManager.uses_pages_directory = False
    st.rerun()


def end_run() -> None:
    """app.py calls this after the page (also when the page stopped early): the next run renders the sidebar
    afresh."""
    _THIS_RUN.view = None


def _keep_sidebar_state() -> None:
    """Streamlit forgets a widget's value when a run does not draw it; writing it back keeps it. The browser
    forgets it too, so the next run that draws the sidebar writes the values again (then they are sent)."""
    for name in KEPT_KEYS:
        if name in st.session_state:
            st.session_state[name] = st.session_state[name]


def without_controls(scope: str) -> View:
    """The sidebar of a page with its own controls ("own") or none ("none"): a note, and the sidebar's choices
    kept for the pages that have them. The view names the model chosen so far ("" before any)."""
    _keep_sidebar_state()
    st.session_state["_sidebar_hidden"] = True
    st.sidebar.caption(NOTES[scope])
    view = View(st.session_state.get("model", ""), st.session_state.get("dtype", "float32"),
                st.session_state.get("device", "cpu"))
    st.session_state["view"] = view
    _THIS_RUN.view = view
    return view
