"""Transformer Symmetry Explorer: the navigation (pages register here) and the sidebar every page shares."""

from pathlib import Path

import streamlit as st

from ui.sidebar import end_run, render_sidebar
from ui.state import publish

ROOT = Path(__file__).resolve().parent
# (file, title, icon) in menu order; a page appears once its file exists.
PAGES = (
    ("pages/home.py", "Home", ":material/home:"),
    ("pages/explore.py", "Explore", ":material/shuffle:"),
    ("pages/check.py", "Check", ":material/fact_check:"),
    ("pages/backward.py", "Backward", ":material/undo:"),
    ("pages/authorization.py", "Authorization", ":material/key:"),
    ("pages/split_learning.py", "Split learning", ":material/call_split:"),
    ("pages/rotation.py", "Rotation", ":material/rotate_right:"),
    ("pages/fusion.py", "Fusion", ":material/merge:"),
)

st.set_page_config(page_title="Transformer Symmetry Explorer", page_icon=":material/shuffle:", layout="wide")
pages = [st.Page(path, title=title, icon=icon, default=path == "pages/home.py")
         for path, title, icon in PAGES if (ROOT / path).exists()]
navigation = st.navigation(pages)
st.session_state.pop("_nav_rerun", None)
render_sidebar()
try:
    navigation.run()
finally:  # also when a page calls st.stop(): the next run renders the sidebar afresh
    end_run()
publish()
