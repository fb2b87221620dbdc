"""The app served on a loopback port for a script to drive: the e2e tests' shared server, the classroom benchmark
and the memory tour start it here, and Chromium is launched with the same flags by each of them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from perm_core.run.malloc import SERVER_ENVIRONMENT
from serve.replicas import bound_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# Streamlit's own record of the session, on its root element: "initial" before the first run, "running" or
# "rerunRequested" during one, "notRunning" after it (or "compilationError"); and the websocket's state.
SCRIPT_STATE = "document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state')"
RUN_OVER = f"""() => ['notRunning', 'compilationError'].includes({SCRIPT_STATE})
  && document.querySelector('[data-testid="stApp"]').getAttribute('data-test-connection-state') === 'CONNECTED'"""
# Every chart in the main area drawn by plotly (it draws after the run's last message), no element still a skeleton
DRAWN = """() => document.querySelectorAll('[data-testid="stMain"] [data-testid*="Skeleton"]').length === 0
  && Array.from(document.querySelectorAll('[data-testid="stMain"] [data-testid="stPlotlyChart"]'))
    .every(chart => chart.querySelector('.js-plotly-plot .main-svg'))"""
RUN_BEGINS_WITHIN_MS = 1000  # after a click or a key, the run has this long to begin (then it is waited for)


def chromium_executable() -> str | None:
    """Debian's chromium (make chromium installs it), or None."""
    return shutil.which("chromium")


def start_streamlit(log: Path, env: dict, script: Path = ROOT / "app.py", cwd: Path = ROOT,
                    healthy_within_s: float = 120, own_session: bool = False) -> tuple[subprocess.Popen, str]:
    """`streamlit run script` on 127.0.0.1 as the app is served (offline, make run's malloc environment, then `env`),
    logging to `log`; returns (the process, its URL) once it answers its health check. The port is 0: the kernel
    gives a free one as the server binds, and the server prints it (serve.replicas.bound_port), so no port chosen
    beforehand can be taken in between. own_session: in a process group of its own (it outlives the process that
    starts it). RuntimeError, with the log's tail, if it exits or is not healthy in time (then it is killed)."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.address", "127.0.0.1",
           "--server.port", "0", "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    with open(log, "w") as out:  # the child keeps its own handle: it writes on after this returns
        process = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1", **SERVER_ENVIRONMENT, **env},
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=own_session)
    deadline = time.time() + healthy_within_s
    url = ""
    while not (url and answers_health_check(url)):
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited: {log.read_text()[-2000:]}")
        if time.time() > deadline:
            process.kill()
            raise RuntimeError(f"streamlit did not become healthy in {healthy_within_s:.0f} s: "
                               f"{log.read_text()[-2000:]}")
        time.sleep(0.5)
        if not url:  # the log is read until the server has said its port, then only the health check is asked
            port = bound_port(log.read_text())
            url = f"http://127.0.0.1:{port}" if port else ""
    return process, url


def answers_health_check(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/_stcore/health", timeout=2)
    except OSError:
        return False
    return True
