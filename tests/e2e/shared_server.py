"""One app server for every e2e test of a run, shared by the pytest-xdist workers.

Each worker's own server would load every model and compute every page's first run again; one server serves both
workers' browsers as it serves a class. The first worker to ask starts it under a file lock in the run's shared
folder (TSE_TEST_SHARED_DIR, made by tests/conftest.py in the process that starts the workers) and writes its
address and pid there; later askers reuse it while it answers its health check. That first process stops it at
exit (stop_shared_server), so it outlives every worker's tests.
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


def _start(folder: Path) -> dict:
    log = folder / "streamlit.log"
    process, url = start_streamlit(log, {}, healthy_within_s=HEALTHY_WITHIN_S, own_session=True)
    return {"url": url, "pid": process.pid, "log": str(log)}


def shared_app_url(folder: Path) -> str:
    """The run's server's address, starting it if no live one is recorded in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while the first one starts it
        record = folder / "server.json"
        if record.is_file():
            known = json.loads(record.read_text())
            if answers_health_check(known["url"]):
                return known["url"]
            stop(known["pid"])  # one that stopped answering is replaced, not left running
        started = _start(folder)
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
    record = folder / "server.json"
    if record.is_file():
        stop(json.loads(record.read_text())["pid"])
