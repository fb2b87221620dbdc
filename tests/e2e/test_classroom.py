"""The classroom load test, small. With the websocket driver (the default): 3 sessions open the same dinov2-s
link at once (two sessions on one model corrupted it before perm_core.run.stateless), then Explore (digits-vit,
dinov2-s, minilm) for 10 s of key changes (each session changes a key at least once), then Check and Rotation (the
benchmark's --driver browser walks the same steps in Chromium; it is not run here). No errors anywhere, every shared
model's weights hash as before, and each session's verdicts and numbers equal a run of the same settings alone on a
server of its own (the e2e tests' shared one, which no classroom session touched). Timings are not asserted."""

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

from benchmarks.classroom_drivers import WsVisitor
from benchmarks.classroom_report import ServerProcess
from benchmarks.streamlit_ws import SIDEBAR, StreamlitSession
from tests.e2e.conftest import ROOT


def run_apart(coroutine):
    """asyncio.run in a thread of its own: in the full suite Playwright's sync API keeps an event loop running in
    this thread, and asyncio.run refuses to start inside it."""
    outcome = {}

    def target():
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# A guard against a hung benchmark, not a time limit: the small classroom takes 120-150 s of a quiet machine and
# took more than 600 s beside another make test (its own server, three sessions, Check and Rotation, a replay server
# and a fresh process hashing the weights all share the two cores with the other run)
HANG_GUARD_S = 1800


def run_classroom(tmp_path, *options: str) -> dict:
    out = tmp_path / "classroom.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "classroom.py"), *options, "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                         timeout=HANG_GUARD_S)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["errors"] == [], figures["errors"]
    for label, hashes in figures["weights"].items():
        assert len(hashes["loaded"]) == 64 and hashes["loaded"] == hashes["at_exit"] == hashes["fresh_process"], label
    assert figures["weights_unchanged"]
    assert all(v["same"] for v in figures["same_as_alone"]), figures["same_as_alone"]
    assert figures["memory"]["server_peak_rss_bytes"] > figures["memory"]["loaded_float32_weights_bytes"] > 0
    assert figures["ok"] and run.returncode == 0, run.stdout[-3000:]
    return figures


def test_three_students_at_once(tmp_path, app_url):
    figures = run_classroom(tmp_path, "--sessions", "3", "--seconds", "10", "--samples", "3",
                            "--reference-url", app_url)
    assert figures["driver"] == "ws" and figures["finished_sessions"] == 3
    done = {(row["model"], row["interaction"]) for row in figures["latency"]}
    for model in ("digits-vit", "dinov2-s", "minilm"):
        assert {(model, "open Explore"), (model, "key change"), (model, "run Check")} <= done
    assert {("digits-vit", "Rotation"), ("minilm", "Rotation")} <= done
    shared_link = next(row for row in figures["latency"] if row["interaction"] == "shared link")
    assert shared_link["model"] == "dinov2-s" and shared_link["n"] == 3  # three sessions on one model at once
    assert {"digits-vit/float32", "dinov2-s/float32", "minilm/float32"} <= set(figures["weights"])
    assert [v["model"] for v in figures["same_as_alone"]] == ["digits-vit", "dinov2-s", "minilm"]
    peak = figures["memory"]["split"]["peak"]  # what held the server's memory at its peak (ui.runtime.memory_audit)
    assert set(peak["caches"]) == {"params", "explorations", "results", "pages"}
    assert set(peak["in_flight"]) == {"run_budget_bytes_held", "runs_waiting_for_memory",
                                      "explore_runs_computing", "page_runs"}
    assert peak["caches"]["results"] > 0 and peak["caches"]["params"] > 0  # Explore's runs were kept
    # The server's peak is the larger of two readings of its VmHWM (sampled while it ran, read by its audit at
    # exit): never below the audit's. Readings taken at different moments (the split's resident size, the heap)
    # are not compared with it: memory moves between them.
    assert figures["memory"]["server_peak_rss_bytes"] >= figures["memory"]["split"]["peak_rss_bytes"] > 0
    assert peak["file_backed"] < peak["resident"]  # one reading of /proc/self/statm: shared pages are resident


TINY_APP = """
import streamlit as st

name = st.text_input("Name", "Ada")
count = st.number_input("Count", 0, 10, 1)
kind = st.selectbox("Kind", ["a", "b", "c"], index=1)
if st.button("Go"):
    st.success(f"went with {name} {count} {kind}")
st.markdown(f"now {name} {count} {kind}")
if count == 7:
    raise ValueError("seven is not allowed")
"""


def test_ws_session_keeps_widget_states_and_reads_exceptions(tmp_path):
    (tmp_path / "tiny.py").write_text(textwrap.dedent(TINY_APP))

    async def visit(url: str) -> None:
        session = await StreamlitSession.open(url)
        assert session.page.shows("now Ada 1 b") and session.page.errors() == []
        await session.set_value("Grace", label="Name")
        await session.set_value(3, label="Count")
        await session.set_value("c", label="Kind")
        assert session.page.shows("now Grace 3 c")
        # What the next rerun re-sends, as the browser's WidgetStateManager does: every widget's current value.
        sent = [getattr(state, state.WhichOneof("value")) for state in session.widgets.values()]
        assert sent == ["Grace", 3, "c"]
        await session.click(label="Go")
        assert session.page.alerts() == ["went with Grace 3 c"]
        await session.set_value("Lin", label="Name")
        assert session.page.alerts() == [] and session.page.shows("now Lin 3 c")  # a button fires once
        await session.set_value(7, label="Count")
        assert session.page.errors() == ["exception ValueError: seven is not allowed"]
        await session.set_value(2, label="Count")  # the session goes on after the page's exception
        assert session.page.shows("now Lin 2 c") and session.page.errors() == []
        await session.close()

    with ServerProcess(tmp_path / "tiny.log", {}, script=tmp_path / "tiny.py", cwd=tmp_path) as server:
        run_apart(visit(server.url))


def test_ws_driver_reads_the_apps_error_messages(app_url):
    async def visit() -> tuple[dict, dict]:
        check = WsVisitor(app_url)
        await check.goto("check", "model=no-such-model&k_channels=abc", "Run check")  # no crash: the page's errors
        on_check = {**await check.snapshot(), "sidebar": check.session.page.alerts(SIDEBAR)}
        await check.close()
        explore = WsVisitor(app_url)
        await explore.goto("explore", "model=digits-vit", "un-scrambled")
        assert (await explore.snapshot())["errors"] == []
        await explore.set_key("tokens", "abc", "un-scrambled")
        on_explore = await explore.snapshot()
        await explore.close()
        return on_check, on_explore

    on_check, on_explore = run_apart(visit())
    bad_key = "Channels key: A key must be a whole number from 0 to 2**64-1, got 'abc'."
    assert bad_key in on_check["errors"]
    assert any("model=no-such-model" in alert and "not a valid value" in alert for alert in on_check["sidebar"])
    assert "Tokens key: A key must be a whole number from 0 to 2**64-1, got 'abc'." in on_explore["errors"]
    assert on_explore["metrics"] == []  # the page stopped at the bad key
