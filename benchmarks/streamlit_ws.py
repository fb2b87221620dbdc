"""A Streamlit session without a browser: the websocket protocol the browser speaks (streamlit 1.67).

    session = await StreamlitSession.open("http://127.0.0.1:8501", "explore", "model=digits-vit")
    session.page.errors(), session.page.alerts(), session.query_string
    seconds = await session.set_value("123", key="k_channels")  # send -> end of the run it started
    seconds = await session.click(label="Run check")
    await session.close()

What the browser's frontend does (static/js of streamlit 1.67, App and WidgetStateManager), mirrored here:
- It connects to /_stcore/stream with the subprotocols "streamlit", its XSRF token (here the frontend's own
  placeholder: without an Origin header the server skips the check, which only guards auth cookies) and the
  last session id (none: every page load is a new session, as `page.goto` in the browser driver).
- Its first message asks for a run with the URL's query string and page name (the path) and no widget states.
- Every later rerun carries the state of every widget of the last run: the value a widget had when first
  drawn (the proto's default, or its value when the server set one), then what the user set, or what the
  server set again (set_value). (Streamlit 1.67 would also keep the last run's values of widgets a rerun does
  not mention, but it fires on_change by comparing what is sent, so the client sends what the browser sends.)
  A finished run drops the states of widgets it did not draw; a button's trigger goes in the one rerun it fires.
- st.query_params writes come as page_info_changed (the address bar); the next rerun sends that query string.
- Large elements come once and then as references to the client's cache, whose hashes each rerun lists.
Not mirrored: static files and media (images) are not fetched, and no context_info (locale, theme) is sent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.NumberInput_pb2 import NumberInput
from streamlit.proto.WidgetStates_pb2 import WidgetState

MAIN, SIDEBAR = 0, 1  # RootContainer: the first number of a delta path
TERMINAL = {ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_WITH_COMPILE_ERROR,
            ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY}  # FINISHED_EARLY_FOR_RERUN: the chain goes on
VALUE_WIDGETS = ("text_input", "text_area", "number_input", "selectbox", "radio", "checkbox", "slider")
TRIGGER_WIDGETS = ("button", "download_button")
CACHE_AGE_RUNS = 2  # the frontend's ForwardMsg cache forgets an element not used in the last two runs
ERROR_ALERT = 1  # Alert.Format.ERROR


class RunTimeout(TimeoutError):
    """The run a rerun asked for did not end in time."""


@dataclass
class Page:
    """The elements of the last complete script run, by delta path (sorted: the order on the page)."""

    elements: dict[tuple[int, ...], object] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # page not found, compile error, unknown cache reference

    def of(self, kind: str, root: int | None = None) -> list:
        return [getattr(element, kind) for path, element in sorted(self.elements.items())
                if element.WhichOneof("type") == kind and (root is None or path[0] == root)]

    def alerts(self, root: int | None = MAIN) -> list[str]:
        return [alert.body for alert in self.of("alert", root)]

    def metrics(self) -> list[str]:
        return [f"{m.label}\n{m.body}" + (f"\n{m.delta}" if m.delta else "") for m in self.of("metric", MAIN)]

    def texts(self) -> list[str]:
        """Every text a visitor can read: markdown (captions too), headings, text, code, alerts, exceptions."""
        found = []
        for _, element in sorted(self.elements.items()):
            kind = element.WhichOneof("type")
            proto = getattr(element, kind) if kind else None
            if kind in ("markdown", "heading", "text", "alert"):
                found.append(proto.body)
            elif kind == "code":
                found.append(proto.code_text)
            elif kind == "exception":
                found += [proto.type, proto.message, *proto.stack_trace]
        return found

    def errors(self) -> list[str]:
        """What the browser driver counts: exception boxes, error alerts, a traceback anywhere; and problems."""
        found = [f"exception {e.type}: {e.message}".strip() for e in self.of("exception")]
        found += [alert.body for alert in self.of("alert") if alert.format == ERROR_ALERT]
        if any("Traceback" in text for text in self.texts()):
            found.append("a traceback is shown")
        return found + self.problems

    def shows(self, text: str) -> bool:
        return any(text in shown for shown in self.texts())

    def widget(self, label: str | None = None, key: str | None = None) -> tuple[str, object]:
        """(kind, proto) of the one widget with this label or key (a keyed widget's id ends with -key)."""
        found = []
        for _, element in sorted(self.elements.items()):
            kind = element.WhichOneof("type")
            if kind in VALUE_WIDGETS + TRIGGER_WIDGETS:
                proto = getattr(element, kind)
                if (label is None or proto.label == label) and (key is None or proto.id.endswith(f"-{key}")):
                    found.append((kind, proto))
        if len(found) != 1:
            raise LookupError(f"{len(found)} widgets with label {label!r} and key {key!r} on the page")
        return found[0]


def widget_state(kind: str, proto, value) -> WidgetState:
    """The state the frontend sends for `value` in this widget (a selectbox or radio: the option's label)."""
    state = WidgetState(id=proto.id)
    if kind in ("text_input", "text_area", "selectbox", "radio"):
        state.string_value = str(value)
    elif kind == "number_input":
        if proto.data_type == NumberInput.INT:
            state.int_value = int(value)
        else:
            state.double_value = float(value)
    elif kind == "checkbox":
        state.bool_value = bool(value)
    elif kind == "slider":
        state.double_array_value.data.extend(float(v) for v in value)
    elif kind in TRIGGER_WIDGETS:
        state.trigger_value = True
    else:
        raise ValueError(f"no widget state for a {kind}")
    return state


def drawn_value(kind: str, proto):
    """The value the frontend takes when it draws the widget: the server's if it set one, else the default;
    None when it stores nothing (a button, an empty widget)."""
    if kind in ("selectbox", "radio"):
        if proto.set_value:
            return proto.raw_value if proto.HasField("raw_value") else None
        return proto.options[proto.default] if proto.HasField("default") else None
    if kind == "slider":
        return list(proto.value if proto.set_value else proto.default)
    if kind in ("text_input", "text_area", "number_input"):
        name = "value" if proto.set_value else "default"
        return getattr(proto, name) if proto.HasField(name) else None
    if kind == "checkbox":
        return proto.value if proto.set_value else proto.default
    return None


class StreamlitSession:
    """One visitor's session over one websocket: the page of its last run, its widget states, its query string."""

    def __init__(self, websocket, page_name: str, query_string: str, timeout: float):
        self.websocket, self.timeout = websocket, timeout
        self.page_name, self.query_string = page_name, query_string
        self.page = Page()
        self.page_script_hash = ""
        self.widgets: dict[str, WidgetState] = {}  # the frontend's WidgetStateManager
        self.fragment_of: dict[str, str] = {}  # widget id -> the st.fragment that drew it ("" for none)
        self.cache: dict[str, list] = {}  # hash -> [message, number of the run that last used it]
        self.runs = 0
        self._drawing: dict[tuple[int, ...], object] = {}
        self._problems: list[str] = []

    @classmethod
    async def open(cls, base_url: str, page_name: str = "", query_string: str = "",
                   timeout: float = 900.0) -> StreamlitSession:
        """Connect as a browser that opens base_url/page_name?query_string, and wait for its first run."""
        from websockets.asyncio.client import connect

        address = base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/_stcore/stream"
        # No pings (a browser sends none; a busy server must not drop a client for a late pong); no size limit.
        websocket = await connect(address, subprotocols=["streamlit", "PLACEHOLDER_AUTH_TOKEN"],
                                  ping_interval=None, max_size=None, open_timeout=timeout)
        session = cls(websocket, page_name, query_string, timeout)
        await session.rerun()
        return session

    async def close(self) -> None:
        await self.websocket.close()

    async def set_value(self, value, label: str | None = None, key: str | None = None) -> float:
        """Set a widget of the last run as a visitor does, and rerun: seconds to the end of that run."""
        kind, proto = self.page.widget(label, key)
        self.widgets[proto.id] = widget_state(kind, proto, value)
        return await self.rerun(fragment_id=self.fragment_of.get(proto.id, ""))

    async def click(self, label: str | None = None, key: str | None = None) -> float:
        kind, proto = self.page.widget(label, key)
        return await self.rerun(trigger=widget_state(kind, proto, True))

    async def rerun(self, trigger: WidgetState | None = None, fragment_id: str = "") -> float:
        """Ask for a run with every widget state, as the frontend does; -> seconds until the run chain ended.
        fragment_id: the widget changed was drawn by that st.fragment, which reruns alone (as the frontend asks)."""
        message = BackMsg()
        client = message.rerun_script
        client.query_string = self.query_string
        if fragment_id:
            client.fragment_id = fragment_id
        client.widget_states.widgets.extend([*self.widgets.values(), *([trigger] if trigger else [])])
        if self.page_script_hash:  # after the first run the frontend names the page by its script's hash
            client.page_script_hash = self.page_script_hash
        else:
            client.page_name = self.page_name
        client.cached_message_hashes.extend(self.cache)
        started = time.perf_counter()
        await self.websocket.send(message.SerializeToString())
        try:
            await asyncio.wait_for(self._until_finished(), self.timeout)
        except TimeoutError:
            raise RunTimeout(f"no end of the run within {self.timeout:g} s (query {self.query_string!r})") from None
        return time.perf_counter() - started

    async def _until_finished(self) -> None:
        while True:
            message = ForwardMsg.FromString(await self.websocket.recv())
            kind = message.WhichOneof("type")
            if kind == "ref_hash":
                message = self._cached(message)
                kind = message.WhichOneof("type") if message else None
            elif message.metadata.cacheable:
                self.cache[message.hash] = [message, self.runs]
            if kind == "new_session":
                if not message.metadata.run.fragment_ids:
                    self._drawing, self._problems = {}, []
            elif kind == "delta":
                self._draw(tuple(message.metadata.delta_path), message.delta)
            elif kind == "navigation":  # st.navigation's current page: the frontend's currentPageScriptHash
                self.page_script_hash = message.navigation.page_script_hash
            elif kind == "page_info_changed":
                self.query_string = message.page_info_changed.query_string
            elif kind == "page_not_found":
                self._problems.append(f"page not found: {message.page_not_found.page_name!r}")
            elif kind == "session_event" and message.session_event.HasField("script_compilation_exception"):
                error = message.session_event.script_compilation_exception
                self._problems.append(f"script compilation error {error.type}: {error.message}")
            elif kind == "script_finished" and message.script_finished in TERMINAL:
                self._finish()
                return

    def _cached(self, reference: ForwardMsg) -> ForwardMsg | None:
        entry = self.cache.get(reference.ref_hash)
        if entry is None:
            self._problems.append(f"the server referred to an element this client never had ({reference.ref_hash})")
            return None
        entry[1] = self.runs
        message = ForwardMsg()
        message.CopyFrom(entry[0])
        message.metadata.CopyFrom(reference.metadata)  # the same element, at the reference's place
        return message

    def _draw(self, path: tuple[int, ...], delta) -> None:
        if delta.WhichOneof("type") == "new_transient":  # a spinner's or toast's: not part of the page
            return
        for drawn in [p for p in self._drawing if p[:len(path)] == path and p != path]:
            del self._drawing[drawn]  # whatever was inside what this delta replaces
        if delta.WhichOneof("type") != "new_element":
            self._drawing.pop(path, None)
            return
        element = delta.new_element
        self._drawing[path] = element
        kind = element.WhichOneof("type")
        if kind in VALUE_WIDGETS or kind in TRIGGER_WIDGETS:
            self.fragment_of[getattr(element, kind).id] = delta.fragment_id  # "" outside any fragment
        if kind in VALUE_WIDGETS:
            proto = getattr(element, kind)
            if proto.id not in self.widgets or proto.set_value:
                value = drawn_value(kind, proto)
                if value is not None:
                    self.widgets[proto.id] = widget_state(kind, proto, value)

    def _finish(self) -> None:
        self.runs += 1
        self.page = Page(self._drawing, self._problems)
        drawn = {getattr(e, e.WhichOneof("type")).id for e in self._drawing.values()
                 if e.WhichOneof("type") in VALUE_WIDGETS}
        self.widgets = {wid: state for wid, state in self.widgets.items() if wid in drawn}
        self.cache = {h: entry for h, entry in self.cache.items() if self.runs - entry[1] <= CACHE_AGE_RUNS}
