"""A classroom at once: N real browser sessions on one server, each changing keys, then Check and Rotation.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/classroom.py [--sessions 30] [--seconds 120] [--json FILE]

Starts the app on a free loopback port and opens N browser contexts in Debian's headless Chromium (one
browser, N isolated contexts: separate cookies, websockets and Streamlit sessions, as N students). Real
browsers rather than a hand-written websocket client: Streamlit's protocol is internal and versioned, and the
browser also renders every chart, which is what the students' machines do (here it competes with the server
for the same two cores, so the latencies are pessimistic). All sessions first open the lecturer's link (Explore
on dinov2-s, each with its own key) at the same moment. Then sessions take digits-vit, dinov2-s and minilm in
turn; each opens Explore, changes its channels or tokens key every few seconds until the time is up (each
change waits for the previous result: a student reads it), then runs Check (forward; --check-backward too)
and opens Rotation. A latency is from the action to the end of the script run it started (URL updated,
status widget gone).

Afterwards: errors (exception boxes, error alerts, "Traceback" anywhere on the page, errors in the server
log), the server's peak resident memory (VmHWM, and the sampled sum over its process tree) against the speed
issue's bound (2x the loaded models' float32 weights + 1 GiB), and the weights of every shared model hashed
at load and at exit inside the server (ui.weights_audit, opt-in by TSE_WEIGHTS_HASH_FILE) and in this fresh
process: all three must be equal. Then a second, fresh server replays sampled sessions' final settings one at
a time: their verdicts, metrics and Check/Rotation results must be the same text, numbers included.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.classroom_report import (  # noqa: E402
    ServerProcess,
    fresh_hashes,
    log_errors,
    print_report,
    summarize,
)

MODELS = ("digits-vit", "dinov2-s", "minilm")
SHARED_LINK_MODEL = "dinov2-s"  # the app's opening model, and slow enough that sessions overlap on it
ROTATION_MODELS = ("digits-vit", "minilm")  # Rotation's own list has no dinov2-s: its sessions rotate digits-vit
KEYS = ("channels", "tokens")
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
TIMEOUT_MS = 900_000


async def settled(page, shown: str | None = None, url_has: str | None = None) -> None:
    """The async twin of tests/e2e/conftest.wait_for_app, plus what the run must have produced."""
    await page.wait_for_selector('[data-testid="stApp"]', timeout=TIMEOUT_MS)
    if url_has:  # publish() writes the URL at the end of the run that took the new value
        await page.wait_for_function("part => decodeURIComponent(location.search).includes(part)", arg=url_has,
                                     timeout=TIMEOUT_MS)
    else:
        await page.wait_for_timeout(800)
    if shown:
        await page.wait_for_function(SHOWN_JS, arg=shown, timeout=TIMEOUT_MS)
    await page.wait_for_function(IDLE_JS, timeout=TIMEOUT_MS, polling=100)


async def timed(records: list, model: str, what: str, action) -> None:
    started = time.perf_counter()
    await action()
    records.append({"model": model, "interaction": what, "seconds": time.perf_counter() - started})


async def snapshot(page) -> dict:
    return await page.evaluate(SNAPSHOT_JS)


def page_url(url: str, page: str, query: str) -> str:
    return f"{url}/{page}?{query}" if query else f"{url}/{page}"


async def run_check_and_rotation(page, url: str, model: str, query: str, key: int, backward: bool,
                                 records: list, out: dict) -> None:
    check_query = f"{query}&check_backward={int(backward)}"
    await timed(records, model, "open Check", lambda: _goto(page, page_url(url, "check", check_query),
                                                            "Run check"))
    await timed(records, model, "run Check", lambda: _click_check(page))
    out["check"] = await snapshot(page)
    rotation_model = model if model in ROTATION_MODELS else "digits-vit"
    rotation_query = f"rotation_model={rotation_model}&rotation_key={key}"
    await timed(records, rotation_model, "Rotation", lambda: _goto(page, page_url(url, "rotation", rotation_query),
                                                                   "Rotary embeddings"))
    out["rotation"] = await snapshot(page)
    out["rotation_query"] = rotation_query


async def _goto(page, address: str, shown: str) -> None:
    await page.goto(address, timeout=TIMEOUT_MS)
    await settled(page, shown)


async def _click_check(page) -> None:
    await page.get_by_role("button", name="Run check").click(timeout=TIMEOUT_MS)
    await settled(page, "checks pass")


async def student(browser, url: str, index: int, deadline: float, args, records: list) -> dict:
    model = MODELS[index % len(MODELS)]
    rng = random.Random(index)
    keys = {"channels": 100 + index, "tokens": 7}
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)  # a loaded server is slow, not broken: typing waits as long as a run
    out = {"session": index, "model": model, "errors": []}
    try:
        page = await context.new_page()
        # The lecturer's link, opened by everyone at once: many sessions on one model at the same moment.
        shared = f"model={SHARED_LINK_MODEL}&k_channels={keys['channels']}"
        await timed(records, SHARED_LINK_MODEL, "shared link", lambda: _goto(page, page_url(url, "explore", shared),
                                                                             "un-scrambled"))
        out["errors"] += (await snapshot(page))["errors"]
        query = f"model={model}&k_channels={keys['channels']}"
        await timed(records, model, "open Explore", lambda: _goto(page, page_url(url, "explore", query),
                                                                  "un-scrambled"))
        out["errors"] += (await snapshot(page))["errors"]
        for change_number in itertools.count():
            if change_number and time.time() >= deadline:  # every session changes a key at least once
                break
            await asyncio.sleep(rng.uniform(2.0, 4.0))
            name = KEYS[rng.randrange(len(KEYS))]
            keys[name] = rng.randrange(10**6)
            box = page.get_by_label(f"{name} key", exact=True)

            async def change(box=box, name=name):
                await box.fill(str(keys[name]))
                await box.press("Enter")
                await settled(page, "un-scrambled", url_has=f"k_{name}={keys[name]}")

            await timed(records, model, "key change", change)
            out["errors"] += (await snapshot(page))["errors"]
        out["explore_query"] = page.url.split("?", 1)[1]
        out["explore"] = await snapshot(page)
        await run_check_and_rotation(page, url, model, out["explore_query"], keys["channels"], args.check_backward,
                                     records, out)
        out["errors"] += out["check"]["errors"] + out["rotation"]["errors"]
    except Exception as error:  # noqa: BLE001 - a session that fails is a finding, not a crash of the benchmark
        out["errors"].append(f"session {index} failed: {type(error).__name__}: {str(error).splitlines()[0]}")
    finally:
        await context.close()
    return out


async def classroom(url: str, server: ServerProcess, args) -> tuple[list, list]:
    from playwright.async_api import async_playwright

    from tests.e2e.conftest import CHROMIUM_FLAGS

    records: list = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        sampler = asyncio.create_task(server.sample_memory())
        deadline = time.time() + args.seconds
        sessions = await asyncio.gather(*(student(browser, url, i, deadline, args, records)
                                          for i in range(args.sessions)))
        sampler.cancel()
        await browser.close()
    return list(sessions), records


async def replay(url: str, samples: list, args) -> list:
    """Each sampled session's final settings alone on a fresh server: the same text and numbers?"""
    from playwright.async_api import async_playwright

    from tests.e2e.conftest import CHROMIUM_FLAGS

    verdicts = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        for session in samples:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            await _goto(page, page_url(url, "explore", session["explore_query"]), "un-scrambled")
            alone = {"explore": await snapshot(page)}
            await run_check_and_rotation(page, url, session["model"], session["explore_query"],
                                         _key_of(session["rotation_query"]), args.check_backward, [], alone)
            await context.close()
            differences = [part for part in ("explore", "check", "rotation")
                           if {k: alone[part][k] for k in ("alerts", "metrics", "errors")}
                           != {k: session[part][k] for k in ("alerts", "metrics", "errors")}]
            verdicts.append({"session": session["session"], "model": session["model"], "same": not differences,
                             "differs_in": differences, "under_load": {p: session[p] for p in differences},
                             "alone": {p: alone[p] for p in differences}})
        await browser.close()
    return verdicts


def _key_of(query: str) -> int:
    return int(dict(part.split("=", 1) for part in query.split("&"))["rotation_key"])


def _chromium() -> str:
    executable = shutil.which("chromium")
    if executable is None:
        raise SystemExit("Debian's chromium is not installed (make chromium)")
    return executable


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=120, help="how long sessions keep changing keys")
    parser.add_argument("--samples", type=int, default=6, help="sessions replayed alone for the same numbers")
    parser.add_argument("--check-backward", action="store_true", help="Check also compares gradients")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="classroom-") as scratch:
        hash_file = Path(scratch) / "weights.json"
        with ServerProcess(Path(scratch) / "server.log", {"TSE_WEIGHTS_HASH_FILE": str(hash_file)}) as server:
            sessions, records = asyncio.run(classroom(server.url, server, args))
            server.stop()  # SIGTERM: the audit hashes every shared model at exit
            memory = server.memory()
            cpu_seconds = server.cpu()
            server_errors = log_errors(server.log.read_text())
            if args.json:  # the tracebacks behind the errors, kept beside the figures
                shutil.copy(server.log, args.json.with_suffix(".server.log"))
        in_server = json.loads(hash_file.read_text()) if hash_file.exists() else {}
        fresh, weight_bytes = fresh_hashes(in_server)
        finished = [s for s in sessions if "rotation" in s]
        samples = _spread(finished, args.samples)
        with ServerProcess(Path(scratch) / "replay.log", {}) as reference:
            same = asyncio.run(replay(reference.url, samples, args))
    figures = summarize(args, sessions, records, server_errors, memory, in_server, fresh, weight_bytes, same)
    figures["cpu_seconds"] = cpu_seconds
    figures["wall_seconds"] = round(time.time() - started, 1)
    print_report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


def _spread(finished: list, count: int) -> list:
    """Up to `count` sessions, taking the models in turn."""
    by_model = {m: [s for s in finished if s["model"] == m] for m in MODELS}
    picked = []
    while len(picked) < count and any(by_model.values()):
        for m in MODELS:
            if by_model[m] and len(picked) < count:
                picked.append(by_model[m].pop(0))
    return picked


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    figures = main()
    sys.exit(0 if figures["ok"] else 1)
