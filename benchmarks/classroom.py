"""A classroom at once: N student sessions on one server, each changing keys, then Check and Rotation.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/classroom.py [--driver ws|browser] [--sessions 30]
        [--pace saturation|classroom] [--seconds 120|180] [--replicas N] [--json FILE]

Starts the app on a free loopback port (--replicas N: N replicas behind HAProxy, as `make serve` starts them; the
students go through the proxy, each kept on one replica by its cookie), then N students at once. --driver ws (the
default): each student is a websocket client speaking the protocol the browser speaks (benchmarks/streamlit_ws.py:
the same BackMsgs, the widget states re-sent as the frontend does, the elements of each run read from the
ForwardMsgs). It measures the server. --driver browser: N contexts of one headless Chromium (separate cookies,
websockets and sessions), which also render every chart as the students' machines do; but on this 2-core machine
30 browsers used 902 CPU-seconds against the server's 310, so their latencies measured the browsers, not the server.

All sessions first open the lecturer's link (Explore on dinov2-s with the lecturer's key: the same URL for
all) at the same moment.
Then sessions take digits-vit, dinov2-s and minilm in turn; each opens Explore, changes its channels or tokens
key until the time is up (each change waits for the previous result: a student reads it), then runs Check
(forward; --check-backward too) and opens Rotation. --pace saturation (the default): a student changes a key 2-4 s
after the previous result; --pace classroom (issue 32): one key change per student every 20 s on average, start to
start (10-30 s at random), each for --seconds from its own opening of Explore (saturation: all stop --seconds
after they started). A latency is from the action to the end of the script run it started (ws: from sending
the rerun, or opening the websocket, to script_finished; browser: URL updated, status widget gone).

Throughput: key changes per second, per model, and per CPU-second of the server(s) in the key changes' window.
Afterwards: errors (exception elements, error alerts, "Traceback" anywhere on the page, errors in the server
log), the server's peak resident memory (VmHWM, and the sampled sum over its process tree) against issue 32's
bound (2x the loaded models' float32 weights + 1 GiB + 24 MiB per session; each replica against its own models
and students, and the sums), with what held it at its peak (ui.runtime.memory_audit, opt-in by
TSE_MEMORY_AUDIT_FILE), and the weights of every shared model hashed at load and at exit inside the server
(ui.runtime.weights_audit, opt-in by TSE_WEIGHTS_HASH_FILE; each replica's own) and in this fresh process: all
three must be equal. Then a second server (a fresh one, or --reference-url's) replays sampled sessions' final
settings one at a time with the same driver: their verdicts, metrics and Check/Rotation results must be the same
text, numbers included.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.classroom_drivers import DRIVERS  # noqa: E402
from benchmarks.classroom_figures import summarize  # noqa: E402
from benchmarks.classroom_replicas import ReplicaSet  # noqa: E402
from benchmarks.classroom_report import ServerProcess, fresh_hashes, log_errors, print_report  # noqa: E402
from perm_core.models import zoo  # noqa: E402

MODELS = (zoo.DEFAULT_IMAGE_MODEL, zoo.DEFAULT_PHOTO_MODEL, zoo.DEFAULT_TEXT_MODEL)
SHARED_LINK_MODEL = zoo.DEFAULT_PHOTO_MODEL  # the app's opening model, and slow enough that sessions overlap on it
LECTURER_CHANNELS_KEY = 99  # the shared link's key; every student's own keys (100 + index) come after it
# Rotation's own list has no dinov2-s: its sessions rotate digits-vit
ROTATION_MODELS = tuple(name for name in MODELS if name in zoo.serving(zoo.ROTATION))
KEYS = ("channels", "tokens")
COMPARED = ("alerts", "metrics", "errors")
DEFAULT_SECONDS = {"saturation": 120.0, "classroom": 180.0}


def pause(pace: str, rng: random.Random, last_change: float) -> float:
    """Seconds until a student's next key change: saturation reads for 2-4 s after each result; a classroom
    student starts one every 20 s on average (10-30 s after the previous one started, at once if that is past)."""
    if pace == "saturation":
        return rng.uniform(2.0, 4.0)
    return max(0.0, last_change + rng.uniform(10.0, 30.0) - time.perf_counter())


async def timed(records: list, model: str, what: str, action) -> None:
    started = time.perf_counter()
    await action()
    records.append({"model": model, "interaction": what, "seconds": time.perf_counter() - started,
                    "ended": time.time()})


async def run_check_and_rotation(visitor, model: str, query: str, key: int, backward: bool, records: list,
                                 out: dict) -> None:
    check_query = f"{query}&check_backward={int(backward)}"
    await timed(records, model, "open Check", lambda: visitor.goto("check", check_query, "Run check"))
    await timed(records, model, "run Check", lambda: visitor.click("Run check", "checks pass"))
    out["check"] = await visitor.snapshot()
    rotation_model = model if model in ROTATION_MODELS else zoo.DEFAULT_IMAGE_MODEL
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
        shared = f"model={SHARED_LINK_MODEL}&k_channels={LECTURER_CHANNELS_KEY}"  # one URL for the whole class
        await timed(records, SHARED_LINK_MODEL, "shared link", lambda: visitor.goto("explore", shared,
                                                                                    "un-scrambled"))
        out["errors"] += (await visitor.snapshot())["errors"]
        out["replica"] = await visitor.replica()  # the one its cookie keeps it on behind the proxy; else None
        query = f"model={model}&k_channels={keys['channels']}"
        await timed(records, model, "open Explore", lambda: visitor.goto("explore", query, "un-scrambled"))
        out["errors"] += (await visitor.snapshot())["errors"]
        last_change = time.perf_counter()
        if args.pace == "classroom":  # each student's own minutes of reading and changing, however long it waited
            deadline = time.time() + args.seconds
        for change_number in itertools.count():
            if change_number and time.time() >= deadline:  # every session changes a key at least once
                break
            await asyncio.sleep(pause(args.pace, rng, last_change))
            last_change = time.perf_counter()
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
    parser.add_argument("--pace", choices=tuple(DEFAULT_SECONDS), default="saturation",
                        help="saturation: a key change 2-4 s after each result; classroom: one every 20 s on average")
    parser.add_argument("--seconds", type=float, help="how long sessions keep changing keys (saturation 120, "
                                                      "classroom 180)")
    parser.add_argument("--replicas", type=int, default=0,
                        help="N replicas behind HAProxy (serve/replicas.py); 0: one server, no proxy")
    parser.add_argument("--samples", type=int, default=6, help="sessions replayed alone for the same numbers")
    parser.add_argument("--check-backward", action="store_true", help="Check also compares gradients")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here too")
    parser.add_argument("--reference-url", help="replay the sampled sessions on this running server (another "
                                                "process than the classroom's) instead of starting a fresh one")
    args = parser.parse_args(argv)
    args.seconds = args.seconds if args.seconds is not None else DEFAULT_SECONDS[args.pace]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="classroom-") as scratch:
        audits = {"TSE_WEIGHTS_HASH_FILE": f"{scratch}/weights.json", "TSE_MEMORY_AUDIT_FILE": f"{scratch}/memory.json"}
        servers = (ReplicaSet(args.replicas, Path(scratch)) if args.replicas
                   else ServerProcess(Path(scratch) / "server.log", audits))
        with servers as server:
            sessions_started = time.time()
            sessions, records = asyncio.run(classroom(server.url, server, args))
            sessions_wall = time.time() - sessions_started
            server.stop()  # SIGTERM: the audit hashes every shared model at exit
            memory = server.memory()
            memory["splits" if args.replicas else "split"] = server.memory_split()
            cpu_seconds = server.cpu()
            log = server.log_text()
            if args.json:  # the tracebacks behind the errors, kept beside the figures
                args.json.with_suffix(".server.log").write_text(log)
            measured = {"memory": memory, "server_errors": log_errors(log), "cpu_timeline": server.cpu_timeline,
                        "in_server": server.weights_hashes(), "proxy_sessions": server.proxy_sessions}
        fresh, weight_bytes = fresh_hashes(measured["in_server"])
        finished = [s for s in sessions if "rotation" in s]
        samples = _spread(finished, args.samples)
        same = []
        if samples and args.reference_url:
            same = asyncio.run(replay(args.reference_url, samples, args))
        elif samples:
            with ServerProcess(Path(scratch) / "replay.log", {}) as reference:
                same = asyncio.run(replay(reference.url, samples, args))
    figures = summarize(args, sessions, records, measured, fresh, weight_bytes, same)
    figures["driver"] = args.driver
    figures["cpu_seconds"] = cpu_seconds
    figures["sessions_wall_seconds"] = round(sessions_wall, 1)
    figures["wall_seconds"] = round(time.time() - started, 1)
    figures["records"] = records  # every timed action with its end (time.time()): when the slow ones happened
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
