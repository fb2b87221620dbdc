"""The view state lives in widget keys and is mirrored into the URL's query parameters.

`seed(name, default, parse)` gives a widget key its first value: from the URL if it parses, else the
default. `publish()` writes every seeded key back into st.query_params after the widgets ran, so
copying the address bar reproduces the view.
"""

from __future__ import annotations

import streamlit as st

_SEEDED = "_seeded_params"
# One key per symmetry for the whole app: the sidebar starts with these, and every page with a key of its own starts
# from the sidebar's current key for the symmetry it applies, so a class following the lecturer sees one key.
DEFAULT_KEYS = {"tokens": 7, "channels": 42, "heads": 3, "head_channels": 5, "mlp": 11, "rotation": 13, "experts": 17,
                "router_shift": 19}


def seed(name: str, default, parse=str, valid=None):
    """Set st.session_state[name] once per session (URL first), and register it for publish()."""
    registry = st.session_state.setdefault(_SEEDED, {})
    registry[name] = default
    if name in st.session_state:
        return st.session_state[name]
    value = default
    raw = st.query_params.get(name)
    if raw is not None:
        try:
            parsed = parse(raw)
            accepted = valid is None or valid(parsed)
        except (TypeError, ValueError):
            accepted = False
        if accepted:
            value = parsed
        else:  # a mangled link falls back to the default, and says so where the control is
            st.warning(f"This link's `{name}={_shown(raw)}` is not a valid value here; using "
                       f"`{_shown(_encode(default))}` instead.", icon=":material/link_off:")
    st.session_state[name] = value
    return value


def _shown(raw: str) -> str:
    """A link's value inside a code span: short, one line, no backticks (it must not become markdown)."""
    text = " ".join(str(raw).split()).replace("`", "'")
    return text if len(text) <= 40 else text[:40] + "…"


def parse_bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "on", "yes"):
        return True
    if raw.lower() in ("0", "false", "off", "no"):
        return False
    raise ValueError(raw)


def parse_list(raw: str) -> list[str]:
    return [item for item in raw.split(",") if item]


def seed_choice(name: str, options, default, parse=str):
    """seed() for a choice among options that can change with another control (a model's losses, layers):
    a value that is no longer an option falls back to the default instead of breaking the widget."""
    options = list(options)
    seed(name, default, parse, valid=lambda v: v in options)
    if st.session_state[name] not in options:
        st.session_state[name] = default
    return st.session_state[name]


def picks_reset(picker: str, owner: str) -> bool:
    """Whether `picker`'s picks (a followed token, channel, neuron or head) belong to another owner (another model or
    input) than this run's and go back to the app's picks for this one; records `owner` as theirs."""
    mark = f"_{picker}_for"
    another = st.session_state.get(mark) not in (None, owner)
    st.session_state[mark] = owner
    return another


def seed_subset(name: str, options, default) -> list:
    """seed() for a multiselect: a comma-separated list in the URL, unknown items dropped."""
    options = list(options)
    seed(name, list(default), lambda raw: [v for v in parse_list(raw) if v in options])
    return st.session_state[name]


def _encode(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def publish() -> None:
    """Mirror the seeded keys that are alive in this run into the URL (only when they changed)."""
    wanted = {}
    for name in st.session_state.get(_SEEDED, {}):
        if name in st.session_state and st.session_state[name] is not None:
            wanted[name] = _encode(st.session_state[name])
    current = {k: st.query_params.get(k) for k in wanted}
    if current != wanted:
        st.query_params.update(wanted)


def use_navigation_registry() -> None:
    """Make Streamlit run app.py (st.navigation) on every run, even when a page's URL is opened first.

    Streamlit treats an app with a pages/ folder as an old-style multipage app until app.py has run
    once in the process: opening /explore first would run pages/explore.py alone, without the shared
    sidebar and with a menu of file names. The flag is process-wide and st.navigation clears it too.
    """
    from streamlit.runtime.pages_manager import PagesManager

    PagesManager.uses_pages_directory = False



def key_or_stop(text) -> int:
    """A validated key; otherwise the key's own message as st.error, and this page stops here."""
    from perm_core.engine.keys import InvalidKeyError, validate_key

    try:
        return validate_key(text)
    except InvalidKeyError as error:
        st.error(str(error))
        st.stop()


use_navigation_registry()


def lecture_key(symmetry: str) -> str:
    """The key a page with its own key field starts from: the sidebar's key for that symmetry in this session when
    there is one, else the app's default for it."""
    chosen = st.session_state.get(f"k_{symmetry}")
    return str(chosen).strip() if isinstance(chosen, str) and chosen.strip() else str(DEFAULT_KEYS[symmetry])
