"""Transformer Symmetry Explorer: the navigation (pages register here) and the sidebar every page shares."""

from pathlib import Path

import streamlit as st

from ui import projector
from ui.errors import show_unexpected
from ui.runtime.housekeeping import collect_garbage, give_back_freed_memory, long_lived_objects_frozen
from ui.state import publish
from ui.view import NOTES, app_run, end_run, without_controls

ROOT = Path(__file__).resolve().parent
# (file, title, icon, sidebar) in menu order; a page appears once its file exists. sidebar "full": the
# sidebar's model, input and keys act on the page; "own": the page has its own controls instead; "none": no
# controls (the sidebar then says where they are).
PAGES = (
    ("pages/home.py", "Home", ":material/home:", "none"),
    ("pages/walk.py", "Guided walk", ":material/school:", "none"),
    ("pages/explore.py", "Explore", ":material/shuffle:", "full"),
    ("pages/check.py", "Check", ":material/fact_check:", "full"),
    ("pages/backward.py", "Backward", ":material/undo:", "own"),
    ("pages/authorization.py", "Authorization", ":material/key:", "own"),
    ("pages/split_learning.py", "Split learning", ":material/call_split:", "own"),
    ("pages/rotation.py", "Rotation", ":material/rotate_right:", "own"),
    ("pages/fusion.py", "Fusion", ":material/merge:", "own"),
    ("pages/matrix.py", "Symmetry matrix", ":material/grid_on:", "none"),
)

collect_garbage()  # cycles left by earlier runs (any session's), every few seconds; then their pages
give_back_freed_memory()  # what earlier runs (any session's) freed: a classroom's runs end all the time
# A link in projector mode opens with the menu folded away: the lecture hall sees the page, full width
PROJECTOR_LINK = "1" in (st.query_params.get(projector.KEY), st.query_params.get(projector.OLD_KEY))
st.set_page_config(page_title="Transformer Symmetry Explorer", page_icon=":material/shuffle:", layout="wide",
                   initial_sidebar_state="collapsed" if PROJECTOR_LINK else "auto")
st.html(f"<style>{(ROOT / 'assets' / 'app.css').read_text()}</style>")
projector.seed_projector()
pages = [st.Page(path, title=title, icon=icon, default=path == "pages/home.py")
         for path, title, icon, _ in PAGES if (ROOT / path).exists()]
navigation = st.navigation(pages)
st.session_state.pop("_nav_rerun", None)
app_run(True)
try:
    scope = next(scope for _, title, _, scope in PAGES if title == navigation.title)
    if navigation.title != "Home":  # every other page uses the library: its first import happens once, here
        from ui.runtime.first_imports import library_imported

        library_imported()
    if scope in NOTES:  # a page without the sidebar's controls (Home among them) imports neither torch nor the library
        without_controls(scope)
    else:
        from ui.sidebar import render_sidebar

        render_sidebar(scope)
    if navigation.title != "Guided walk":  # the walk has the switch in its own row of controls
        projector.toggle(st.sidebar, "projector_sidebar")
    projector.apply_css()
    navigation.run()
except Exception as error:  # noqa: BLE001 - st.stop/st.rerun are BaseExceptions and pass; a bug is logged
    show_unexpected(error)
finally:  # also when a page calls st.stop(): the next run renders the sidebar afresh, the URL keeps the view
    app_run(False)
    end_run()
    long_lived_objects_frozen()
    publish()
