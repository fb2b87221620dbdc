"""The e2e tests' app servers, shared by the pytest-xdist workers: SERVERS of them (TSE_TEST_APP_SERVERS, default
one), worker gwN on server N % SERVERS.

A server runs its sessions' scripts in threads of one interpreter, so one server keeps at most one core busy with
them however many browsers wait on it. The whole suite keeps both cores busy with one server already, so a second
one only loads the models and computes the pages' first runs twice (docs/performance.md). Each worker's
own server would load every model and compute every page's first run once more per worker. The first worker to
ask for a server starts it under a file lock in the run's shared folder (TSE_TEST_SHARED_DIR, made by
tests/conftest.py in the process that starts the workers) and writes its address and pid there; later askers reuse
it while it answers its health check. That first process stops them all at exit (stop_shared_server), so they
outlive every worker's tests.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

from serve.local_server import answers_health_check, start_streamlit

HEALTHY_WITHIN_S = 90
SERVERS = int(os.environ.get("TSE_TEST_APP_SERVERS", "1"))


def server_slot(worker: str | None = None) -> int:
    """Which of the SERVERS this process's tests use: gwN's is N % SERVERS; a run without workers uses the first."""
    worker = worker if worker is not None else os.environ.get("PYTEST_XDIST_WORKER", "")
    number = worker.removeprefix("gw")
    return int(number) % max(SERVERS, 1) if number.isdigit() else 0


def _start(folder: Path, slot: int) -> dict:
    log = folder / f"streamlit-{slot}.log"
    process, url = start_streamlit(log, {}, healthy_within_s=HEALTHY_WITHIN_S, own_session=True)
    return {"url": url, "pid": process.pid, "log": str(log)}


def shared_app_url(folder: Path, slot: int | None = None) -> str:
    """The address of this worker's server (server_slot), starting it if no live one is recorded in `folder`."""
    slot = server_slot() if slot is None else slot
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"server-{slot}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker of this slot waits here while the first one starts it
        record = folder / f"server-{slot}.json"
        if record.is_file():
            known = json.loads(record.read_text())
            if answers_health_check(known["url"]):
                return known["url"]
            stop(known["pid"])  # one that stopped answering is replaced, not left running
        started = _start(folder, slot)
        record.write_text(json.dumps(started))
        return started["url"]


def stop(pid: int, wait_s: float = 20) -> None:
    """SIGTERM to the server's process group, SIGKILL after `wait_s`; nothing if it is gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.time() + wait_s
    while time.time() < deadline and not _gone(pid):
        time.sleep(0.2)
    if not _gone(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet (our own child in a run without workers is reaped
    here; an orphan's zombie waits for init)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def stop_shared_server(folder: Path) -> None:
    """Stop every server the run started."""
    for record in sorted(folder.glob("server-*.json")):
        stop(json.loads(record.read_text())["pid"])
