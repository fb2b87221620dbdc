"""Long work on a page: a bar that says what is being computed and the time left, and a Stop button.

    with long_run("check", settings, "the check") as progress:
        report = check(..., progress=progress)

The bar and the button appear with the first progress call, so a result that is already cached shows
neither. Stop reruns the page (Streamlit interrupts the running script at its next element update);
the rerun then shows "Stopped" with a button to start again instead of restarting the same work.
"""

from __future__ import annotations

import zlib
from contextlib import contextmanager

import streamlit as st

from perm_core.run.progress import TimeLeft
from ui.state import publish


def _stopped_key(page: str) -> str:
    return f"_{page}_stopped"


def stop_if_stopped(page: str, settings, what: str, on_resume=None) -> None:
    """After Stop on these settings: say so, offer to run again, and end this run of the page."""
    if st.session_state.get(_stopped_key(page)) != settings:
        return
    st.warning(f"Stopped: {what}. Nothing was computed for these settings; change a setting or run it again.")
    st.button(f"Run {what} again", type="primary", key=f"_{page}_resume",
              on_click=lambda: (st.session_state.pop(_stopped_key(page), None), on_resume and on_resume()))
    publish()
    st.stop()


@contextmanager
def long_run(page: str, settings, what: str):
    stop_if_stopped(page, settings, what)
    drawn: dict = {}
    time_left = TimeLeft()

    def progress(fraction: float, message: str) -> None:
        if not drawn:
            drawn["stop"] = st.empty()
            button_key = f"_{page}_stop_{zlib.crc32(repr(settings).encode())}"  # one per run on a page
            drawn["stop"].button(f"Stop {what}", key=button_key, icon=":material/stop_circle:",
                                 on_click=lambda: st.session_state.update({_stopped_key(page): settings}))
            drawn["bar"] = st.progress(0.0)
        drawn["bar"].progress(min(max(fraction, 0.0), 1.0), text=time_left.describe(fraction, message))

    yield progress
    for element in drawn.values():
        element.empty()


def shared_result(runs, request, what: str, compute):
    """A page's shared result (ui.runtime's runs.result) for a long run: compute(progress) under a progress bar
    with the time left and a Stop button, named by the request's page and settings."""
    def run():
        with long_run(request.page, request.settings, what) as progress:
            return compute(progress)

    return runs.result(request, run)
