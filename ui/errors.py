"""Failures a visitor sees as one line, while the server log keeps the traceback.

.streamlit/config.toml sets client.showErrorDetails = "none", so Streamlit never sends a traceback to the
browser; these helpers make sure the details still reach the server log (Streamlit's own logger, so they
land in the same stream as its messages), with a short reference that ties the page's line to the log.
"""

from __future__ import annotations

import sys
import uuid

import streamlit as st
from streamlit.logger import get_logger

LOG = get_logger("transformer_symmetry_explorer")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def logged(error: BaseException, what: str = "") -> str:
    """Log `error` with its traceback; -> its first line (after `what`, if given) and the log reference."""
    reference = uuid.uuid4().hex[:8]
    LOG.error("%s (reference %s)", what or type(error).__name__, reference, exc_info=error)
    line = first_line(error)
    if what and not line.startswith(what):  # ModelLoadError already says "Could not load NAME: ..."
        line = f"{what}: {line}"
    return f"{line} (reference {reference} in the server log)"


def show_failure(error: BaseException, what: str = "") -> None:
    st.error(logged(error, what), icon=":material/error:")


def show_unexpected(error: BaseException) -> None:
    """A bug, not a bad input: say so without internals (the type and message are in the log)."""
    if "streamlit.testing.v1.app_test" in sys.modules:  # under AppTest a page bug must stay an at.exception
        raise error
    reference = uuid.uuid4().hex[:8]
    LOG.error("Unexpected error on a page (reference %s)", reference, exc_info=error)
    st.error(f"Something went wrong on this page ({type(error).__name__}); it has been logged on the server "
             f"with reference {reference}. Other pages and sessions keep working; change a setting or reload.",
             icon=":material/error:")
