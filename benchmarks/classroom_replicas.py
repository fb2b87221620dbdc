"""benchmarks/classroom.py --replicas N: the app as N replicas behind HAProxy, started by serve/replicas.py as
`make serve` starts it, measured as classroom_report.ServerProcess measures one server (url, sample_memory(),
stop(), memory(), cpu(), cpu_timeline, log_text()), plus each replica's own audit files and the proxy's counters."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED_WITHIN_S = 400  # every replica imports torch and transformers at once on the same cores


def _cpu_seconds_of_this_process() -> float:
    times = os.times()
    return times.user + times.system


def _status_kib(pid: int, field: str, name: str = "status") -> int:
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def free_proxy_port() -> int:
    """A free loopback port for HAProxy, which cannot be started on port 0 and report its port. Under pytest-xdist
    each worker (gw0, gw1, ...) draws from a range of its own, so two workers starting proxies at the same moment
    never pick the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        start = 20_000 + 1_000 * int(worker[2:])
        offset = random.randrange(1_000)  # another run on this machine starts elsewhere in the range
        for port in (start + (offset + i) % 1_000 for i in range(1_000)):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReplicaSet:
    def __init__(self, count: int, scratch: Path):
        self.count, self.run_dir, self.audit_dir = count, scratch / "serve", scratch / "audit"
        self.log = scratch / "serve.log"
        self.process: subprocess.Popen | None = None
        self.state: dict = {}
        self.url = ""
        self.peak_rss: dict[str, int] = {}  # VmHWM of each replica, read while it runs
        self.peak_rss_sum = 0  # the largest sampled sum of the replicas' resident sizes
        self.peak_pss_sum = 0  # the same in proportional set size: pages two replicas share counted once
        self.cpu_seconds: dict[str, dict[int, float]] = {"server": {}, "proxy": {}, "clients": {}}
        self.cpu_timeline: list[tuple[float, float]] = []  # (time, the replicas' CPU seconds so far)
        self.proxy_sessions: dict[str, int] = {}
        self._own_cpu_before = _cpu_seconds_of_this_process()

    def __enter__(self) -> ReplicaSet:
        cmd = [sys.executable, str(ROOT / "serve" / "replicas.py"), "--replicas", str(self.count),
               "--port", str(free_proxy_port()), "--run-dir", str(self.run_dir), "--audit-dir", str(self.audit_dir)]
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        state_file, deadline = self.run_dir / "state.json", time.time() + STARTED_WITHIN_S
        while not state_file.exists():
            if self.process.poll() is not None or time.time() > deadline:
                self.stop()
                raise SystemExit(f"serve/replicas.py did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        self.state = json.loads(state_file.read_text())
        self.url = self.state["url"]
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _measure(self) -> None:
        import psutil

        rss = pss = 0
        for replica in self.state.get("replicas", []):
            with contextlib.suppress(psutil.Error, OSError):
                process = psutil.Process(replica["pid"])
                times = process.cpu_times()
                self.cpu_seconds["server"][process.pid] = times.user + times.system
                rss += process.memory_info().rss
                pss += _status_kib(process.pid, "Pss", "smaps_rollup") * 1024
                hwm = _status_kib(process.pid, "VmHWM") * 1024
                self.peak_rss[replica["name"]] = max(self.peak_rss.get(replica["name"], 0), hwm)
        self.peak_rss_sum, self.peak_pss_sum = max(self.peak_rss_sum, rss), max(self.peak_pss_sum, pss)
        with contextlib.suppress(psutil.Error, KeyError):
            times = psutil.Process(self.state["proxy"]["pid"]).cpu_times()
            self.cpu_seconds["proxy"][self.state["proxy"]["pid"]] = times.user + times.system
        self.cpu_seconds["clients"][os.getpid()] = _cpu_seconds_of_this_process() - self._own_cpu_before
        self.cpu_timeline.append((time.time(), sum(self.cpu_seconds["server"].values())))

    async def sample_memory(self) -> None:
        while True:
            self._measure()
            await asyncio.sleep(1.0)

    def read_proxy_sessions(self) -> dict[str, int]:
        """The proxy's own count of connections it sent to each replica (HAProxy's `show stat`, stot)."""
        with socket.socket(socket.AF_UNIX) as stats:
            stats.connect(self.state["proxy"]["stats_socket"])
            stats.sendall(b"show stat\n")
            text = b"".join(iter(lambda: stats.recv(65536), b"")).decode()
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {row["svname"]: int(row["stot"]) for row in rows if row["svname"] not in ("FRONTEND", "BACKEND")}

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.state:
            self._measure()
            with contextlib.suppress(OSError):
                self.proxy_sessions = self.read_proxy_sessions()
        self.process.send_signal(signal.SIGTERM)  # the replicas' weights audits hash every model before they exit
        try:
            self.process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def memory(self) -> dict:
        """server_peak_rss_bytes: the replicas' peaks added up (each may peak at another moment); each replica's peak
        is its VmHWM, sampled while it ran and read by its own memory audit at exit."""
        peaks = dict(self.peak_rss)
        for name, split in self.memory_split().items():
            peaks[name] = max(peaks.get(name, 0), split.get("peak_rss_bytes", 0))
        return {"server_peak_rss_bytes": sum(peaks.values()), "tree_peak_rss_sampled_bytes": self.peak_rss_sum,
                "peak_pss_sampled_bytes": self.peak_pss_sum, "replicas": peaks}

    def cpu(self) -> dict:
        return {side: round(sum(seen.values()), 1) for side, seen in self.cpu_seconds.items()}

    def log_text(self) -> str:
        return "\n".join(Path(r["log"]).read_text() for r in self.state.get("replicas", []) if Path(r["log"]).exists())

    def weights_hashes(self) -> dict:
        """Each replica's weights audit: "name/dtype@replica" -> {"loaded", "at_exit"}."""
        found = {}
        for path in sorted(self.audit_dir.glob("weights-*.json")):
            replica = path.stem.removeprefix("weights-")
            found.update({f"{label}@{replica}": h for label, h in json.loads(path.read_text()).items()})
        return found

    def memory_split(self) -> dict:
        """Each replica's memory audit (what held its memory at its peak)."""
        return {path.stem.removeprefix("memory-"): json.loads(path.read_text())
                for path in sorted(self.audit_dir.glob("memory-*.json"))}
