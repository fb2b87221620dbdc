"""What a person waits for on Explore, in real headless Chromium at 1440x900, and where that time goes.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/explore_latency.py [--models a,b] [--repeats 3] [--json PATH]

Starts the app on a loopback port (serve.local_server.start_streamlit, offline, as the e2e tests do) and measures,
medians of --repeats:
- Home on a just-started server: from the server's start (the process spawned) until Home is idle, and from the
  navigation until Home is idle (a fresh server per repeat; the last one serves the rest);
- per model (default: every zoo model on Explore's menu), after one warm-up visit that loads it (and converts
  gemma3-270m, smollm2-135m or dinov2-s into the conversion cache the first time, which can take minutes):
  the first visit to Explore in a fresh browser session (navigation until idle), a new channels key typed into the
  sidebar and Enter (with the page's own "Scrambled side took N s"), one step of the layer slider (focus its
  thumb, one arrow key), and the block's Attention view chosen instead of its hidden states (focus the button,
  Enter).

Idle: Streamlit's script state is over (tests/e2e/conftest.py's RUN_OVER, after giving a run RUN_BEGINS_WITHIN_MS to
begin, as wait_for_app does), every plotly chart is drawn (its DRAWN), and a MutationObserver on the whole document
has seen no change for 300 ms. The wait ends at the last change it saw.

Each wait is split with the websocket's frames, timed in the page (the page's WebSocket is wrapped by an init script)
and identified by parsing the same frames as Playwright reports them (BackMsg / ForwardMsg): `request` = the input
(keydown, or the navigation's start) until the browser sends its rerun_script; `script` = that until the server's
script_finished frame arrives (the server ran the page; its deltas arrive and are drawn meanwhile); `after` = that
until the page stops changing (the browser finishing its drawing). `busy` is the browser main thread's long tasks
(>= 50 ms, PerformanceObserver) inside the wait; `after busy` those after script_finished. Bytes: the websocket
frames the server sent during the wait, summed from Playwright's frame events. `script` is timed where the page
handles the frames, so it also holds the time the page's main thread was busy drawing the run's deltas as they came;
`server alone` is the same three actions from a websocket client with no browser (benchmarks/streamlit_ws.py), the
server's own time for each.

Waits swing by 2-3x on a busy machine; CPU-seconds do not. So each action also reports the CPU its two sides spent,
read from /proc before and after it: `browser CPU` is every Chromium process this script started (the renderer
drawing the charts, the GPU and network processes), `server CPU` the app server's process. Compare two versions of
the page by these when the machine is not quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perm_core.models import zoo  # noqa: E402
from serve.local_server import (  # noqa: E402
    CHROMIUM_FLAGS,
    DRAWN,
    RUN_BEGINS_WITHIN_MS,
    RUN_OVER,
    SCRIPT_STATE,
    chromium_executable,
    start_streamlit,
)

VIEWPORT = {"width": 1440, "height": 900}
QUIET_MS = 300
ACTION_TIMEOUT_MS = 300_000
WARM_TIMEOUT_MS = 1_800_000  # a first load that converts gemma3-270m on a busy 2-core machine
TICKS = os.sysconf("SC_CLK_TCK")
TOOK = re.compile(r"Scrambled side took ([0-9.]+) s")
CHART = '[data-testid="stMain"] [data-testid="stPlotlyChart"]'

# Before any of the page's own scripts: the last DOM change, the script state's transitions, the main thread's long
# tasks, every keydown, and every websocket frame (time and size) in the page's own clock (performance.now()).
RECORDER = """(() => {
  const log = window.__tse = {mutation: 0, states: [], long: [], keys: [], wsIn: [], wsOut: []};
  new MutationObserver(records => {
    const now = performance.now();
    log.mutation = now;
    for (const r of records)
      if (r.type === 'attributes' && r.attributeName === 'data-test-script-state')
        log.states.push([now, r.target.getAttribute('data-test-script-state')]);
  }).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
  try {
    new PerformanceObserver(list => { for (const e of list.getEntries()) log.long.push([e.startTime, e.duration]); })
      .observe({type: 'longtask', buffered: true});
  } catch (e) {}
  document.addEventListener('keydown', e => log.keys.push([performance.now(), e.key]), true);
  const size = d => typeof d === 'string' ? new Blob([d]).size : (d.byteLength ?? d.size ?? 0);
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', e => log.wsIn.push([performance.now(), size(e.data)]));
    }
    send(data) { log.wsOut.push([performance.now(), size(data)]); return super.send(data); }
  };
})();"""
IDLE = (f"() => ({RUN_OVER})() && ({DRAWN})() && window.__tse "
        f"&& performance.now() - window.__tse.mutation >= {QUIET_MS}")
LOG = "() => ({...window.__tse, origin: performance.timeOrigin, now: performance.now()})"


def frame_kind(payload, received: bool) -> str:
    """The message's type: a ForwardMsg's (script_finished with its status) or a BackMsg's."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    if isinstance(payload, str):
        payload = payload.encode()
    try:
        if received:
            message = ForwardMsg.FromString(payload)
            kind = message.WhichOneof("type") or "?"
            if kind == "script_finished":
                kind += ":" + ForwardMsg.ScriptFinishedStatus.Name(message.script_finished)
            return kind
        return BackMsg.FromString(payload).WhichOneof("type") or "?"
    except Exception:  # noqa: BLE001 - a frame that is not a message: counted, not classified
        return "?"


def process_cpu_s() -> dict[str, float]:
    """CPU seconds so far of this script's descendants, by side: Chromium's processes ("browser") and the app
    server's ("server", a python running streamlit). A process that ended meanwhile drops out of the sum, so only
    differences across one action (no browser or server started or stopped inside it) are meaningful."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            table[int(pid)] = (int(fields[1]), command, (int(fields[11]) + int(fields[12])) / TICKS)
    me, sides = os.getpid(), {"browser": 0.0, "server": 0.0}

    def descends(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in table or pid <= 1:
                return False
            pid = table[pid][0]
        return False

    for pid, (_, command, seconds) in table.items():
        if pid == me or not descends(pid):
            continue
        if b"chrom" in command:
            sides["browser"] += seconds
        elif b"streamlit" in command:
            sides["server"] += seconds
    return sides


def cpu_spent(before: dict[str, float]) -> dict[str, float]:
    after = process_cpu_s()
    return {f"{side}_cpu_s": after[side] - before[side] for side in before}


class Tab:
    """One browser session (its own context) with the recorder installed and the websocket frames as Playwright
    reports them: (kind, bytes), in the order the page's own log has them."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport=VIEWPORT)
        self.context.set_default_timeout(ACTION_TIMEOUT_MS)
        self.context.add_init_script(RECORDER)
        self.page = self.context.new_page()
        self.frames_in: list[tuple[str, int]] = []
        self.frames_out: list[tuple[str, int]] = []
        self.console_errors: list[str] = []
        self.page.on("websocket", self._watch)
        self.page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text[:300]))

    def _watch(self, ws) -> None:
        if "_stcore/stream" not in ws.url:
            return
        ws.on("framereceived", lambda p: self.frames_in.append((frame_kind(p, True), _size(p))))
        ws.on("framesent", lambda p: self.frames_out.append((frame_kind(p, False), _size(p))))

    def goto(self, url: str, timeout_ms: int = ACTION_TIMEOUT_MS) -> dict:
        """Navigate, then wait for idle; the wait starts at the navigation's start (performance.now() == 0)."""
        self.frames_in.clear()
        self.frames_out.clear()
        cpu = process_cpu_s()
        self.page.goto(url, timeout=timeout_ms)
        self.idle(timeout_ms)
        return {**self.measure(0.0, 0, 0), **cpu_spent(cpu)}

    def act(self, do, key: str, timeout_ms: int = ACTION_TIMEOUT_MS) -> dict:
        """do() ends by pressing `key`; the wait starts at that keydown."""
        before = self.page.evaluate("() => [window.__tse.wsIn.length, window.__tse.wsOut.length, "
                                    "window.__tse.keys.length]")
        cpu = process_cpu_s()
        do()
        self.idle(timeout_ms)
        spent = cpu_spent(cpu)
        log = self.page.evaluate(LOG)
        pressed = [t for t, k in log["keys"][before[2]:] if k == key]
        if not pressed:
            raise RuntimeError(f"no {key} keydown seen")
        return {**self.measure(pressed[0], before[0], before[1], log), **spent}

    def idle(self, timeout_ms: int) -> None:
        """wait_for_app's logic (a run is given RUN_BEGINS_WITHIN_MS to begin, then must be over and drawn) and no
        DOM change for QUIET_MS."""
        self.page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
        with contextlib.suppress(Exception):
            self.page.wait_for_function(f"() => {SCRIPT_STATE} !== 'notRunning'", timeout=RUN_BEGINS_WITHIN_MS)
        self.page.wait_for_function(IDLE, timeout=timeout_ms, polling=50)

    def measure(self, start_ms: float, first_in: int, first_out: int, log: dict | None = None) -> dict:
        log = log or self.page.evaluate(LOG)
        end = max([log["mutation"], *(t for t, _ in log["states"][-1:])])
        record = {"wait_s": (end - start_ms) / 1000, "end_epoch_s": (log["origin"] + end) / 1000}
        ws_in, ws_out = log["wsIn"], log["wsOut"]
        matched = (len(ws_in) == len(self.frames_in) and len(ws_out) == len(self.frames_out)
                   and all(a[1] == b[1] for a, b in zip(ws_in, self.frames_in, strict=True)))
        record["frames_matched"] = matched
        window_in = [i for i in range(first_in, len(ws_in)) if start_ms <= ws_in[i][0] <= end]
        window_out = [i for i in range(first_out, len(ws_out)) if start_ms <= ws_out[i][0] <= end]
        record["bytes_received"] = sum(self.frames_in[i][1] for i in window_in if i < len(self.frames_in))
        record["bytes_sent"] = sum(self.frames_out[i][1] for i in window_out if i < len(self.frames_out))
        requested = finished = None
        runs = 0
        if matched:
            reruns = [ws_out[i][0] for i in window_out if self.frames_out[i][0] == "rerun_script"]
            ends = [ws_in[i][0] for i in window_in if self.frames_in[i][0].startswith("script_finished")]
            requested = reruns[0] if reruns else None
            finished = ends[-1] if ends else None
            runs = len(ends)
            record["split_from"] = "websocket"
        else:  # the script state's transitions as the page drew them
            states = [(t, s) for t, s in log["states"] if start_ms <= t <= end]
            begun = [t for t, s in states if s in ("running", "rerunRequested")]
            over = [t for t, s in states if s in ("notRunning", "compilationError")]
            requested = begun[0] if begun else None
            finished = over[-1] if over else None
            runs = len(over)
            record["split_from"] = "script state"
        record["runs"] = runs
        if requested is not None and finished is not None:
            record["request_s"] = (requested - start_ms) / 1000
            record["script_s"] = (finished - requested) / 1000
            record["after_s"] = (end - finished) / 1000
            record["after_busy_s"] = _busy(log["long"], finished, end) / 1000
        record["busy_s"] = _busy(log["long"], start_ms, end) / 1000
        main = self.page.locator('[data-testid="stMain"]').inner_text()
        took = TOOK.findall(main)
        record["took_s"] = float(took[-1]) if took else None
        record["charts"] = self.page.locator(CHART).count()
        record["exceptions"] = self.page.locator('[data-testid="stException"]').count()
        errors = self.page.locator('[data-testid="stMain"] [data-testid="stAlertContentError"]')
        record["error_alerts"] = [errors.nth(i).inner_text()[:300] for i in range(errors.count())]
        return record

    def close(self) -> None:
        self.context.close()


def _size(payload) -> int:
    return len(payload.encode()) if isinstance(payload, str) else len(payload)


def _busy(long_tasks, start: float, end: float) -> float:
    """Milliseconds of long tasks inside [start, end]."""
    return sum(max(0.0, min(end, t + d) - max(start, t)) for t, d in long_tasks)


def key_change(tab: Tab, key: int) -> dict:
    box = tab.page.get_by_label("channels key", exact=True)

    def type_and_enter():
        box.fill(str(key))
        box.press("Enter")

    record = tab.act(type_and_enter, "Enter")
    record["key"] = key
    if f"k_channels={key}" not in tab.page.url:
        record["problem"] = f"the URL does not carry k_channels={key}"
    return record


def slider_step(tab: Tab) -> dict:
    thumb = tab.page.get_by_role("slider", name="Layer (block)")  # the thumb's range input (react-aria)
    now, top = int(float(thumb.input_value())), int(float(thumb.get_attribute("max")))
    arrow = "ArrowRight" if now < top else "ArrowLeft"  # the page opens on the last block

    def step():
        thumb.focus()
        thumb.press(arrow)

    record = tab.act(step, arrow)
    record["layer"] = [now, int(float(thumb.input_value()))]
    if record["layer"][0] == record["layer"][1]:
        record["problem"] = f"the layer slider did not move on {arrow}"
    return record


def view_change(tab: Tab, label: str = "Attention") -> dict:
    """Another of the block's views (the segmented control under the layer slider), chosen from the keyboard so the
    wait starts at a keydown: focus its button, Enter."""
    button = tab.page.locator('[data-testid="stButtonGroup"] button', has_text=label).first

    def choose():
        button.focus()
        button.press("Enter")

    record = tab.act(choose, "Enter")
    if f"block_view={label.lower()}" not in tab.page.url:
        record["problem"] = f"the URL does not carry block_view={label.lower()}"
    return record


def server_only(url: str, name: str, repeats: int) -> dict:
    """The same three actions from a websocket client with no browser (benchmarks/streamlit_ws.py): the server's
    time for each, from the rerun request to the end of its run, nothing drawn."""
    from benchmarks.streamlit_ws import StreamlitSession, drawn_value

    async def measure() -> list[dict]:
        records = []
        for repeat in range(repeats):
            started = time.perf_counter()
            session = await StreamlitSession.open(url, "explore", f"model={name}", timeout=ACTION_TIMEOUT_MS / 1000)
            try:
                record = {"first_visit_s": time.perf_counter() - started}
                record["key_change_s"] = await session.set_value(str(2000 + 37 * repeat), label="channels key")
                took = TOOK.findall(" ".join(session.page.texts()))
                record["took_s"] = float(took[-1]) if took else None
                kind, proto = session.page.widget(key="layer")
                now = int(drawn_value(kind, proto)[0])
                record["slider_step_s"] = await session.set_value([now - 1 if now >= proto.max else now + 1],
                                                                  key="layer")
                record["errors"] = session.page.errors()
            finally:
                await session.close()
            records.append(record)
        return records

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop, beside sync Playwright's
        records = pool.submit(asyncio.run, measure()).result()
    return {"runs": records, "median": {field: median(records, field)
                                        for field in ("first_visit_s", "key_change_s", "took_s", "slider_step_s")}}


def check_shown(record: dict, what: str) -> None:
    if record["exceptions"] or record["error_alerts"] or record["took_s"] is None:
        raise RuntimeError(f"{what}: {record['exceptions']} exceptions, error alerts {record['error_alerts']}, "
                           f"{'no' if record['took_s'] is None else 'a'} verdict caption")


def median(records: list[dict], field: str):
    values = [r[field] for r in records if r.get(field) is not None]
    return statistics.median(values) if values else None


def summary(records: list[dict]) -> dict:
    fields = ("wait_s", "request_s", "script_s", "after_s", "busy_s", "after_busy_s", "browser_cpu_s", "server_cpu_s",
              "took_s", "bytes_received", "bytes_sent", "runs", "charts")
    return {field: median(records, field) for field in fields}


def fresh_home(browser, log: Path) -> tuple[dict, object, str]:
    """A new server, then Home in a new session as soon as it answers its health check."""
    started = time.time()
    server, url = start_streamlit(log, {}, healthy_within_s=180)
    healthy = time.time()
    tab = Tab(browser)
    try:
        record = tab.goto(url + "/")
        record["from_start_s"] = record["end_epoch_s"] - started
        record["healthy_after_s"] = healthy - started
        record["console_errors"] = tab.console_errors
    finally:
        tab.close()
    return record, server, url


def stop(server) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except Exception:  # noqa: BLE001
        server.kill()
        server.wait(timeout=30)


def measure_model(browser, url: str, name: str, repeats: int) -> dict:
    found: dict = {"model": name}
    tab = Tab(browser)
    started = time.perf_counter()
    try:
        warm = tab.goto(f"{url}/explore?model={name}", timeout_ms=WARM_TIMEOUT_MS)
        check_shown(warm, "warm-up visit")
    except Exception as error:  # noqa: BLE001 - a model that does not load is reported, the others go on
        found["error"] = f"{type(error).__name__}: {str(error)[:500]}"
        found["warm_s"] = time.perf_counter() - started
        tab.close()
        return found
    found["warm_s"] = time.perf_counter() - started
    tab.close()
    visits, keys, steps, views, problems, console = [], [], [], [], [], []
    for repeat in range(repeats):
        tab = Tab(browser)
        try:
            visits.append(tab.goto(f"{url}/explore?model={name}"))
            check_shown(visits[-1], "first visit")
            keys.append(key_change(tab, 1000 + 37 * repeat))
            check_shown(keys[-1], "key change")
            steps.append(slider_step(tab))
            check_shown(steps[-1], "slider step")
            views.append(view_change(tab))
            check_shown(views[-1], "view change")
            problems += [f"repeat {repeat + 1}: {r['problem']}" for r in (keys[-1], steps[-1], views[-1])
                         if "problem" in r]
        except Exception as error:  # noqa: BLE001
            problems.append(f"repeat {repeat + 1}: {type(error).__name__}: {str(error)[:500]}")
        finally:
            console += tab.console_errors
            tab.close()
        print(f"  {name} repeat {repeat + 1}: visit {_s(visits[-1:])} key {_s(keys[-1:])} "
              f"step {_s(steps[-1:])} view {_s(views[-1:])}", flush=True)
    found.update(first_visit=visits, key_change=keys, slider_step=steps, view_change=views, problems=problems,
                 console_errors=sorted(set(console)))
    found["median"] = {"first_visit": summary(visits), "key_change": summary(keys), "slider_step": summary(steps),
                       "view_change": summary(views)}
    try:
        found["server_only"] = server_only(url, name, repeats)
    except Exception as error:  # noqa: BLE001
        found["problems"].append(f"server only: {type(error).__name__}: {str(error)[:500]}")
    return found


def _s(records: list[dict]) -> str:
    return f"{records[0]['wait_s']:.2f} s" if records else "-"


def fmt(value, unit: str = " s", digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{unit}"


def kib(value) -> str:
    return "-" if value is None else f"{value / 1024:.0f} KiB"


def table(results: dict) -> str:
    lines = [f"Explore in Chromium ({results['machine']}; {results['date']}), medians of {results['repeats']}", "",
             "| model | charts on Explore | key change | of it, the scrambled side (\"took N s\") | layer-slider step "
             "| block view change | first visit to Explore |",
             "|---|---|---|---|---|---|---|"]
    for model in results["models"]:
        if "error" in model:
            lines.append(f"| {model['model']} | failed to load: {model['error'][:120]} | | | | | |")
            continue
        m = model["median"]
        lines.append(f"| {model['model']} | {fmt(m['first_visit']['charts'], '', 0)} | "
                     f"{fmt(m['key_change']['wait_s'])} | {fmt(m['key_change']['took_s'])} | "
                     f"{fmt(m['slider_step']['wait_s'])} | {fmt(m['view_change']['wait_s'])} | "
                     f"{fmt(m['first_visit']['wait_s'])} |")
    home = results["home"]["median"]
    lines += ["", f"Home on a just-started server: {fmt(home['from_start_s'])} from the server's start "
              f"({fmt(home['healthy_after_s'])} until it answered its health check), {fmt(home['wait_s'])} from "
              f"the navigation; Home on the warm server: {fmt(results['home']['warm_median']['wait_s'])}.", "",
              "Where the time goes (medians): request = input until the rerun request is sent; script = rerun "
              "request until the server's script_finished arrives; after = until the page stops changing; busy = "
              "the browser's long tasks inside the wait (after: those after script_finished); KiB = websocket bytes "
              "the server sent; server alone = the same action from a websocket client with no browser "
              "(benchmarks/streamlit_ws.py: rerun request until the run ended); browser / server CPU = CPU-seconds "
              "Chromium's processes and the app server spent on the action (robust to a busy machine)", "",
              "| model | action | wait | server alone | request | script | after | busy | after busy | browser CPU "
              "| server CPU | KiB | runs |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in results["models"]:
        if "error" in model:
            continue
        for action in ("first_visit", "key_change", "slider_step", "view_change"):
            m = model["median"][action]
            alone = model.get("server_only", {}).get("median", {}).get(f"{action}_s")
            lines.append(f"| {model['model']} | {action.replace('_', ' ')} | {fmt(m['wait_s'])} | {fmt(alone)} | "
                         f"{fmt(m['request_s'])} | {fmt(m['script_s'])} | {fmt(m['after_s'])} | {fmt(m['busy_s'])} | "
                         f"{fmt(m['after_busy_s'])} | {fmt(m['browser_cpu_s'])} | {fmt(m['server_cpu_s'])} | "
                         f"{kib(m['bytes_received'])} | {fmt(m['runs'], '', 0)} |")
    took = [f"{model['model']} {fmt(model['server_only']['median']['took_s'])}" for model in results["models"]
            if model.get("server_only")]
    lines += ["", "the scrambled side as the page states it, key change from the websocket client: " + ", ".join(took)]
    for model in results["models"]:
        for problem in model.get("problems", []):
            lines.append(f"problem, {model['model']}: {problem}")
        if model.get("console_errors"):
            lines.append(f"browser console errors, {model['model']}: {model['console_errors'][:5]}")
    if results["server_log_problems"]:
        lines += ["", "server log lines that look like errors:", *results["server_log_problems"][:20]]
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()}-core {cpu}"


def load_average() -> list[float]:
    return list(os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(zoo.explore_menu()),
                        help="comma-separated zoo models (default: Explore's whole menu)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args()
    executable = chromium_executable()
    if executable is None:
        raise SystemExit("Debian's chromium is not installed (make chromium)")
    from playwright.sync_api import sync_playwright

    logs = Path(tempfile.mkdtemp(prefix="explore-latency-"))
    results: dict = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "repeats": args.repeats, "load_average_before": load_average(), "logs": str(logs),
                     "command": " ".join(sys.argv), "models": []}
    print(f"server logs in {logs}", flush=True)
    server = None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        results["chromium"] = browser.version
        try:
            homes = []
            for repeat in range(args.repeats):
                if server is not None:
                    stop(server)
                record, server, url = fresh_home(browser, logs / f"server-{repeat + 1}.log")
                homes.append(record)
                print(f"Home on a fresh server: {record['from_start_s']:.2f} s from start, "
                      f"{record['wait_s']:.2f} s from navigation", flush=True)
            tab = Tab(browser)
            warm_home = [tab.goto(url + "/") for _ in range(args.repeats)]
            tab.close()
            results["home"] = {"fresh": homes, "warm": warm_home,
                               "median": {**summary(homes), "from_start_s": median(homes, "from_start_s"),
                                          "healthy_after_s": median(homes, "healthy_after_s")},
                               "warm_median": summary(warm_home)}
            for name in args.models.split(","):
                print(f"{name}: warming up (a first load may convert the model)", flush=True)
                found = measure_model(browser, url, name, args.repeats)
                if "error" in found:
                    print(f"  {name} failed to load: {found['error']}", flush=True)
                results["models"].append(found)
        finally:
            browser.close()
            if server is not None:
                stop(server)
    results["load_average_after"] = load_average()
    log_text = (logs / f"server-{args.repeats}.log").read_text(errors="replace") if args.repeats else ""
    results["server_log_problems"] = [line for line in log_text.splitlines()
                                      if re.search(r"Traceback|Error|Exception|WARNING", line)]
    text = table(results)
    print("\n" + text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
