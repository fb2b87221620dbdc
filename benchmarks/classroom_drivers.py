"""The two ways benchmarks/classroom.py can be a student: Streamlit's websocket protocol, or a real browser.

Both give a `visitor()` with the same few actions, each returning once the script run it started is over:
goto(page, query, shown), set_key(name, value, shown), click(label, shown), snapshot(), query, close(); and
replica(): the replica the proxy's cookie keeps the visitor on (serve/haproxy.cfg.template), None without a proxy.
`shown` is text the run must have produced; a page error (exception, error alert) also ends the wait, and
snapshot() reports it. Anything else that goes wrong raises: the scenario records it as a failed session.
"""

from __future__ import annotations

import asyncio
import urllib.request
from http.cookies import SimpleCookie
from urllib.parse import unquote

from benchmarks.streamlit_ws import StreamlitSession

TIMEOUT_S = 900  # a loaded server is slow, not broken
REPLICA_COOKIE = "TSE_REPLICA"  # set by the proxy (serve/haproxy.cfg.template): the replica a browser stays on


class ScenarioError(RuntimeError):
    """The page did not do what the scenario waits for."""


def page_url(url: str, page: str, query: str) -> str:
    return f"{url}/{page}?{query}" if query else f"{url}/{page}"


def cookies_set_by(url: str) -> dict[str, str]:
    """The cookies a GET of the page sets, as a browser's first request gets them (the proxy's sticky cookie)."""
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        jar = SimpleCookie()
        for header in response.headers.get_all("Set-Cookie") or []:
            jar.load(header)
    return {name: morsel.value for name, morsel in jar.items()}


async def open_session(url: str, page: str, query: str, cookies: dict[str, str]) -> StreamlitSession:
    """StreamlitSession.open, sending the visitor's cookies with the websocket as a browser does."""
    if not cookies:
        return await StreamlitSession.open(url, page, query, timeout=TIMEOUT_S)
    from websockets.asyncio.client import connect

    address = url.replace("http://", "ws://", 1) + "/_stcore/stream"
    websocket = await connect(address, subprotocols=["streamlit", "PLACEHOLDER_AUTH_TOKEN"], ping_interval=None,
                              max_size=None, open_timeout=TIMEOUT_S,
                              additional_headers={"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})
    session = StreamlitSession(websocket, page, query, TIMEOUT_S)
    await session.rerun()
    return session


class WsDriver:
    """Students as websocket clients in this process: the server's time, not a browser's (see streamlit_ws)."""

    name = "ws"

    def __init__(self, url: str):
        self.url = url

    async def __aenter__(self) -> WsDriver:
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    async def visitor(self) -> WsVisitor:
        return WsVisitor(self.url)


class WsVisitor:
    def __init__(self, url: str):
        self.url = url
        self.session: StreamlitSession | None = None
        self.cookies: dict[str, str] | None = None  # the visitor's cookie jar, filled by its first page load

    async def goto(self, page: str, query: str, shown: str) -> None:
        """A page load: a new session, as the browser's (its websocket starts afresh, with the visitor's cookies)."""
        await self.close()
        if self.cookies is None:
            self.cookies = await asyncio.to_thread(cookies_set_by, page_url(self.url, page, query))
        self.session = await open_session(self.url, page, query, self.cookies)
        self._expect(shown)

    async def replica(self) -> str | None:
        return (self.cookies or {}).get(REPLICA_COOKIE)

    async def set_key(self, name: str, value: int | str, shown: str) -> None:
        await self.session.set_value(str(value), label=f"{name} key")
        if self.session.page.errors():  # the page said what is wrong (a bad key is not published): snapshot()
            return
        if f"k_{name}={value}" not in unquote(self.session.query_string):  # publish() wrote the new key
            raise ScenarioError(f"the URL did not take k_{name}={value}: {self.session.query_string}")
        self._expect(shown)

    async def click(self, label: str, shown: str) -> None:
        await self.session.click(label=label)
        self._expect(shown)

    async def snapshot(self) -> dict:
        page = self.session.page
        return {"alerts": page.alerts(), "metrics": page.metrics(), "errors": page.errors()}

    @property
    def query(self) -> str:
        return self.session.query_string

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    def _expect(self, shown: str) -> None:
        page = self.session.page
        if not page.shows(shown) and not page.errors():
            raise ScenarioError(f"{shown!r} is not on the page after the run")


SNAPSHOT_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const texts = sel => [...main.querySelectorAll(sel)].map(e => e.innerText.trim());
  const errors = [...document.querySelectorAll('[data-testid="stException"], [data-testid="stAlertContentError"]')]
    .map(e => e.innerText.trim());
  if (document.body.innerText.includes('Traceback')) errors.push('a traceback is shown');
  return {alerts: texts('[data-testid="stAlert"]'), metrics: texts('[data-testid="stMetric"]'), errors};
}"""
IDLE_JS = "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
SHOWN_JS = """text => { const main = document.querySelector('[data-testid="stMain"]') || document.body;
  return main.innerText.includes(text) || !!document.querySelector('[data-testid="stException"]')
    || !!document.querySelector('[data-testid="stAlertContentError"]'); }"""


class BrowserDriver:
    """One headless Chromium (Debian's), a context per student: separate cookies, websockets and sessions."""

    name = "browser"

    def __init__(self, url: str):
        self.url = url

    async def __aenter__(self) -> BrowserDriver:
        from playwright.async_api import async_playwright

        from serve.local_server import CHROMIUM_FLAGS, chromium_executable

        executable = chromium_executable()
        if executable is None:
            raise SystemExit("Debian's chromium is not installed (make chromium)")
        self._playwright = await async_playwright().start()
        self.browser = await self._playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.browser.close()
        await self._playwright.stop()

    async def visitor(self) -> BrowserVisitor:
        context = await self.browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(TIMEOUT_S * 1000)  # typing waits as long as a run
        return BrowserVisitor(self.url, context, await context.new_page())


class BrowserVisitor:
    def __init__(self, url: str, context, page):
        self.url, self.context, self.page = url, context, page

    async def goto(self, page: str, query: str, shown: str) -> None:
        await self.page.goto(page_url(self.url, page, query), timeout=TIMEOUT_S * 1000)
        await self._settled(shown)

    async def set_key(self, name: str, value: int, shown: str) -> None:
        box = self.page.get_by_label(f"{name} key", exact=True)
        await box.fill(str(value))
        await box.press("Enter")
        await self._settled(shown, url_has=f"k_{name}={value}")

    async def click(self, label: str, shown: str) -> None:
        await self.page.get_by_role("button", name=label).click(timeout=TIMEOUT_S * 1000)
        await self._settled(shown)

    async def snapshot(self) -> dict:
        """What the page shows once it stays the same for half a second: a page that still draws (the status
        widget can vanish before the last elements arrive) once gave a different text than the same run alone."""
        shown = await self.page.evaluate(SNAPSHOT_JS)
        for _ in range(20):
            await self.page.wait_for_timeout(500)
            await self.page.wait_for_function(IDLE_JS, timeout=TIMEOUT_S * 1000, polling=100)
            again = await self.page.evaluate(SNAPSHOT_JS)
            if again == shown:
                return shown
            shown = again
        return shown

    @property
    def query(self) -> str:
        return self.page.url.split("?", 1)[1]

    async def replica(self) -> str | None:
        return next((c["value"] for c in await self.context.cookies() if c["name"] == REPLICA_COOKIE), None)

    async def close(self) -> None:
        await self.context.close()

    async def _settled(self, shown: str, url_has: str | None = None) -> None:
        """The async twin of tests/e2e/conftest.wait_for_app, plus what the run must have produced."""
        timeout = TIMEOUT_S * 1000
        await self.page.wait_for_selector('[data-testid="stApp"]', timeout=timeout)
        if url_has:  # publish() writes the URL at the end of the run that took the new value
            await self.page.wait_for_function("part => decodeURIComponent(location.search).includes(part)",
                                              arg=url_has, timeout=timeout)
        else:
            await self.page.wait_for_timeout(800)
        await self.page.wait_for_function(SHOWN_JS, arg=shown, timeout=timeout)
        await self.page.wait_for_function(IDLE_JS, timeout=timeout, polling=100)
        # As wait_for_app: the status widget can be gone for a moment while the run still draws (a snapshot
        # once missed the metrics under the verdict), so it must stay gone.
        await self.page.wait_for_timeout(500)
        await self.page.wait_for_function(IDLE_JS, timeout=timeout, polling=100)


DRIVERS = {"ws": WsDriver, "browser": BrowserDriver}
