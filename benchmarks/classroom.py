"""A classroom at once: N student sessions on one server, each changing keys, then Check and Rotation.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/classroom.py [--driver ws|browser] [--sessions 30]
        [--seconds 120] [--json FILE]

Starts the app on a free loopback port, then N students at once. --driver ws (the default): each student is a
websocket client speaking the protocol the browser speaks (benchmarks/streamlit_ws.py: the same BackMsgs, the
widget states re-sent as the frontend does, the elements of each run read from the ForwardMsgs). It measures
the server. --driver browser: N contexts of one headless Chromium (separate cookies, websockets and sessions),
which also render every chart as the students' machines do; but on this 2-core machine 30 browsers used 902
CPU-seconds against the server's 310, so their latencies measured the browsers, not the server.

All sessions first open the lecturer's link (Explore on dinov2-s, each with its own key) at the same moment.
Then sessions take digits-vit, dinov2-s and minilm in turn; each opens Explore, changes its channels or tokens
key every few seconds until the time is up (each change waits for the previous result: a student reads it),
then runs Check (forward; --check-backward too) and opens Rotation. A latency is from the action to the end of
the script run it started (ws: from sending the rerun, or opening the websocket, to script_finished; browser:
URL updated, status widget gone).

Afterwards: errors (exception elements, error alerts, "Traceback" anywhere on the page, errors in the server
log), the server's peak resident memory (VmHWM, and the sampled sum over its process tree) against the speed
issue's bound (2x the loaded models' float32 weights + 1 GiB) with what held it at its peak
(ui.runtime.memory_audit, opt-in by TSE_MEMORY_AUDIT_FILE), and the weights of every shared model hashed
at load and at exit inside the server (ui.runtime.weights_audit, opt-in by TSE_WEIGHTS_HASH_FILE) and in this fresh
process: all three must be equal. Then a second, fresh server replays sampled sessions' final settings one at
a time with the same driver: their verdicts, metrics and Check/Rotation results must be the same text,
numbers included.
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

from benchmarks.classroom_drivers import DRIVERS  # noqa: E402
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
COMPARED = ("alerts", "metrics", "errors")


async def timed(records: list, model: str, what: str, action) -> None:
    started = time.perf_counter()
    await action()
    records.append({"model": model, "interaction": what, "seconds": time.perf_counter() - started})


async def run_check_and_rotation(visitor, model: str, query: str, key: int, backward: bool, records: list,
                                 out: dict) -> None:
    check_query = f"{query}&check_backward={int(backward)}"
    await timed(records, model, "open Check", lambda: visitor.goto("check", check_query, "Run check"))
    await timed(records, model, "run Check", lambda: visitor.click("Run check", "checks pass"))
    out["check"] = await visitor.snapshot()
    rotation_model = model if model in ROTATION_MODELS else "digits-vit"
    rotation_query = f"rotation_model={rotation_model}&rotation_key={key}"
    await timed(records, rotation_model, "Rotation", lambda: visitor.goto("rotation", rotation_query,
                                                                          "Rotary embeddings"))
    out["rotation"] = await visitor.snapshot()
    out["rotation_query"] = rotation_query


async def student(driver, index: int, deadline: float, args, records: list) -> dict:
    model = MODELS[index % len(MODELS)]
    rng = random.Random(index)
    keys = {"channels": 100 + index, "tokens": 7}
    out = {"session": index, "model": model, "errors": []}
    visitor = None
    try:
        visitor = await driver.visitor()
        # The lecturer's link, opened by everyone at once: many sessions on one model at the same moment.
        shared = f"model={SHARED_LINK_MODEL}&k_channels={keys['channels']}"
        await timed(records, SHARED_LINK_MODEL, "shared link", lambda: visitor.goto("explore", shared,
                                                                                    "un-scrambled"))
        out["errors"] += (await visitor.snapshot())["errors"]
        query = f"model={model}&k_channels={keys['channels']}"
        await timed(records, model, "open Explore", lambda: visitor.goto("explore", query, "un-scrambled"))
        out["errors"] += (await visitor.snapshot())["errors"]
        for change_number in itertools.count():
            if change_number and time.time() >= deadline:  # every session changes a key at least once
                break
            await asyncio.sleep(rng.uniform(2.0, 4.0))
            name = KEYS[rng.randrange(len(KEYS))]
            keys[name] = rng.randrange(10**6)
            await timed(records, model, "key change",
                        lambda name=name: visitor.set_key(name, keys[name], "un-scrambled"))
            out["errors"] += (await visitor.snapshot())["errors"]
        out["explore_query"] = visitor.query
        out["explore"] = await visitor.snapshot()
        await run_check_and_rotation(visitor, model, out["explore_query"], keys["channels"], args.check_backward,
                                     records, out)
        out["errors"] += out["check"]["errors"] + out["rotation"]["errors"]
    except Exception as error:  # noqa: BLE001 - a session that fails is a finding, not a crash of the benchmark
        lines = str(error).splitlines() or [""]
        out["errors"].append(f"session {index} failed: {type(error).__name__}: {lines[0]}")
    finally:
        if visitor is not None:
            await visitor.close()
    return out


async def classroom(url: str, server: ServerProcess, args) -> tuple[list, list]:
    records: list = []
    async with DRIVERS[args.driver](url) as driver:
        sampler = asyncio.create_task(server.sample_memory())
        deadline = time.time() + args.seconds
        sessions = await asyncio.gather(*(student(driver, i, deadline, args, records)
                                          for i in range(args.sessions)))
        sampler.cancel()
    return list(sessions), records


async def replay(url: str, samples: list, args) -> list:
    """Each sampled session's final settings alone on a fresh server: the same text and numbers?"""
    verdicts = []
    async with DRIVERS[args.driver](url) as driver:
        for session in samples:
            visitor = await driver.visitor()
            failed = {"alerts": [], "metrics": [], "errors": ["the replay failed"]}
            alone = {part: failed for part in ("explore", "check", "rotation")}
            try:
                await visitor.goto("explore", session["explore_query"], "un-scrambled")
                alone["explore"] = await visitor.snapshot()
                await run_check_and_rotation(visitor, session["model"], session["explore_query"],
                                             _key_of(session["rotation_query"]), args.check_backward, [], alone)
            except Exception as error:  # noqa: BLE001 - reported as a difference, with what went wrong
                failed["errors"].append(f"{type(error).__name__}: {error}")
            finally:
                await visitor.close()
            differences = [part for part in ("explore", "check", "rotation")
                           if {k: alone[part][k] for k in COMPARED} != {k: session[part][k] for k in COMPARED}]
            verdicts.append({"session": session["session"], "model": session["model"], "same": not differences,
                             "differs_in": differences, "under_load": {p: session[p] for p in differences},
                             "alone": {p: alone[p] for p in differences}})
    return verdicts


def _key_of(query: str) -> int:
    return int(dict(part.split("=", 1) for part in query.split("&"))["rotation_key"])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--driver", choices=tuple(DRIVERS), default="ws",
                        help="ws: Streamlit's websocket protocol (measures the server); browser: headless Chromium")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=120, help="how long sessions keep changing keys")
    parser.add_argument("--samples", type=int, default=6, help="sessions replayed alone for the same numbers")
    parser.add_argument("--check-backward", action="store_true", help="Check also compares gradients")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="classroom-") as scratch:
        hash_file, memory_file = Path(scratch) / "weights.json", Path(scratch) / "memory.json"
        audits = {"TSE_WEIGHTS_HASH_FILE": str(hash_file), "TSE_MEMORY_AUDIT_FILE": str(memory_file)}
        with ServerProcess(Path(scratch) / "server.log", audits) as server:
            sessions_started = time.time()
            sessions, records = asyncio.run(classroom(server.url, server, args))
            sessions_wall = time.time() - sessions_started
            server.stop()  # SIGTERM: the audit hashes every shared model at exit
            memory = server.memory()
            memory["split"] = json.loads(memory_file.read_text()) if memory_file.exists() else {}
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
    figures["driver"] = args.driver
    figures["cpu_seconds"] = cpu_seconds
    figures["sessions_wall_seconds"] = round(sessions_wall, 1)
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
