"""benchmarks/classroom.py's server process, its memory, CPU and weight hashes, and the printed report
(the figures themselves: classroom_figures.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

from benchmarks.classroom_figures import model_label
from serve.local_server import ROOT, start_streamlit


class ServerProcess:
    """`streamlit run app.py` on a free loopback port (start_streamlit, as the e2e tests' shared server), logging to a
    file (another script from another folder, for tests: without this repository's .streamlit/config.toml)."""

    def __init__(self, log: Path, env: dict, script: Path = ROOT / "app.py", cwd: Path = ROOT):
        self.log, self.env, self.script, self.cwd = log, env, script, cwd
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.peak_rss = 0  # VmHWM of the server process, read while it runs
        self.peak_tree_rss = 0  # the largest sampled sum of RSS over the server and its children
        # Last seen, per process. "clients": this process (the ws driver runs here) and its children that are not
        # the server (Playwright, Chromium), since this process started the server.
        self.cpu_seconds: dict[str, dict[int, float]] = {"server": {}, "clients": {}}
        self.cpu_timeline: list[tuple[float, float]] = []  # (time, the server's CPU seconds so far)
        self.proxy_sessions: dict[str, int] = {}  # no proxy in front of one server
        self._own_cpu_before = _cpu_seconds_of_this_process()

    def __enter__(self) -> ServerProcess:
        try:
            self.process, self.url = start_streamlit(self.log, self.env, self.script, self.cwd)
        except RuntimeError as error:
            raise SystemExit(str(error)) from None
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _measure(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
            self.peak_tree_rss = max(self.peak_tree_rss, sum(p.memory_info().rss for p in tree))
            server_pids = {p.pid for p in tree}
            for process in [*tree, *psutil.Process().children(recursive=True)]:
                side = "server" if process.pid in server_pids else "clients"
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    self.cpu_seconds[side][process.pid] = times.user + times.system
            self.cpu_seconds["clients"][os.getpid()] = _cpu_seconds_of_this_process() - self._own_cpu_before
            self.cpu_timeline.append((time.time(), sum(self.cpu_seconds["server"].values())))
            for line in Path(f"/proc/{root.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)
        except (psutil.Error, OSError):
            pass  # the server is stopping

    async def sample_memory(self) -> None:
        while True:
            self._measure()
            await asyncio.sleep(1.0)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self._measure()
        self.process.terminate()
        try:
            self.process.wait(timeout=120)  # the weights audit hashes every model before the process ends
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def memory(self) -> dict:
        """server_peak_rss_bytes: the server's VmHWM, sampled while it ran and read by its own audit at exit (the
        weights audit runs after the last sample, and the audit's peak split may be taken then)."""
        peak = max(self.peak_rss, self.memory_split().get("peak_rss_bytes", 0))
        return {"server_peak_rss_bytes": peak, "tree_peak_rss_sampled_bytes": self.peak_tree_rss,
                "replicas": {"server": peak}}

    def log_text(self) -> str:
        return self.log.read_text()

    def _audit(self, variable: str) -> dict:
        path = Path(self.env.get(variable, ""))
        return json.loads(path.read_text()) if self.env.get(variable) and path.exists() else {}

    def weights_hashes(self) -> dict:
        return self._audit("TSE_WEIGHTS_HASH_FILE")

    def memory_split(self) -> dict:
        return self._audit("TSE_MEMORY_AUDIT_FILE")

    def cpu(self) -> dict:
        """CPU seconds used while sampled: the server's, and the clients' (they share this machine's cores)."""
        return {side: round(sum(seen.values()), 1) for side, seen in self.cpu_seconds.items()}


def _cpu_seconds_of_this_process() -> float:
    times = os.times()
    return times.user + times.system


def log_errors(text: str) -> list[str]:
    """The server log's error lines (ours and Streamlit's) and tracebacks."""
    lines = text.splitlines()
    found = [line.strip() for line in lines if " ERROR " in line or "Uncaught app" in line]
    tracebacks = sum("Traceback (most recent call last)" in line for line in lines)
    return found + ([f"{tracebacks} traceback(s) in the server log"] if tracebacks else [])


def fresh_hashes(in_server: dict) -> tuple[dict, dict]:
    """Each model the servers hashed, loaded again in this process from the same zoo cache: "name/dtype" -> sha256;
    and the float32 bytes of each one's weights (the memory bound)."""
    import torch

    from perm_core.models.registry import DTYPES, load_model
    from ui.runtime.weights_audit import weights_hash

    hashes, weight_bytes = {}, {}
    for label in sorted({model_label(label) for label in in_server}):
        if " " in label:  # "(reloaded)": already a finding
            continue
        name, dtype_name = label.rsplit("/", 1)
        model = load_model(name, dtype=DTYPES[dtype_name]).model
        hashes[label] = weights_hash(model)
        weight_bytes[label] = sum(p.numel() * 4 for p in model.parameters())
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return hashes, weight_bytes


def split_line(peak: dict) -> str:
    """One line of what held the server's memory at its peak (ui.runtime.memory_audit.split)."""
    mib = {name: round(value / 2**20) for name, value in peak.items() if isinstance(value, int)}
    caches = peak.get("caches", {})
    line = (f"at {peak.get('seconds', '?')} s: resident {mib['resident']} MiB = file-backed {mib['file_backed']}")
    if "heap_in_use" in peak:
        rest = peak["resident"] - peak["file_backed"] - peak["heap_in_use"] - peak["own_mappings"]
        line += (f" + heap in use {mib['heap_in_use']} + large blocks {mib['own_mappings']} (of these two, "
                 "caches: " + ", ".join(f"{name} {round(value / 2**20)}" for name, value in caches.items()) +
                 f") + the rest {round(rest / 2**20)} (Python's objects, stacks, free heap kept resident); "
                 f"heap free {mib['heap_free']} MiB, {peak['python_blocks']} Python blocks, {peak['threads']} threads")
    if peak.get("in_flight"):
        line += "; in flight: " + ", ".join(f"{name.replace('_', ' ')} {value}"
                                            for name, value in peak["in_flight"].items())
    return line


def print_report(figures: dict) -> None:
    where = f"{figures['replicas']} replicas behind HAProxy" if figures["replicas"] else "one server"
    print(f"\n{figures['sessions']} sessions on {where}, {figures['seconds']:g} s of key changes at the "
          f"{figures['pace']} pace, {figures['finished_sessions']} finished Explore, Check and Rotation")
    print(f"{'model':<12} {'interaction':<13} {'n':>4} {'p50':>7} {'p95':>7} {'max':>7}")
    for row in figures["latency"]:
        print(f"{row['model']:<12} {row['interaction']:<13} {row['n']:>4} {row['p50_s']:>6.2f}s "
              f"{row['p95_s']:>6.2f}s {row['max_s']:>6.2f}s")
    for model, goal in figures["key_change_goals"].items():
        print(f"key change p95 {model:<12} {goal['p95_s']:6.2f} s  goal <= {goal['goal_s']:g} s  "
              f"{'met' if goal['met'] else 'NOT met'}")
    if "cpu_seconds" in figures:
        clients = "this process" if figures.get("driver") == "ws" else "Chromium, Playwright and this process"
        cpu, wall = figures["cpu_seconds"], figures.get("sessions_wall_seconds") or float("nan")
        print(f"CPU seconds: server {cpu['server']:.0f} ({cpu['server'] / wall:.2f} cores busy over the "
              f"sessions' {wall:.0f} s), clients {cpu['clients']:.0f} ({figures.get('driver')} driver: {clients})"
              + (f", proxy {cpu['proxy']:.1f}" if "proxy" in cpu else ""))
    rate = figures["throughput"]
    if rate:
        print(f"throughput: {rate['key_changes']} key changes in {rate['window_s']:.0f} s = "
              f"{rate['per_second']:.2f}/s ("
              + ", ".join(f"{m} {v:.2f}/s" for m, v in rate["per_model_per_second"].items())
              + f"); {rate['per_server_cpu_second']} per server CPU-second ({rate['server_cpu_seconds']:.0f} CPU s)")
    memory = figures["memory"]
    print(f"server peak RSS {memory['server_peak_rss_bytes'] / 2**30:.2f} GiB (sampled sum "
          f"{memory['tree_peak_rss_sampled_bytes'] / 2**30:.2f} GiB"
          + (f", PSS {memory['peak_pss_sampled_bytes'] / 2**30:.2f} GiB" if "peak_pss_sampled_bytes" in memory else "")
          + f"); bound 2x weights + 1 GiB + 24 MiB per session = {memory['bound_bytes'] / 2**30:.2f} GiB: "
          f"{'within' if memory['within_bound'] else 'NOT within'}")
    for name, server in memory["replicas"].items():
        print(f"  {name}: peak {server['peak_rss_bytes'] / 2**30:.2f} GiB, {server['students']} students "
              f"(proxy: {figures['proxy_sessions'].get(name, '-')} connections), weights "
              f"{server['weights_bytes'] / 2**20:.0f} MiB, bound {server['bound_bytes'] / 2**30:.2f} GiB: "
              f"{'within' if server['within'] else 'NOT within'}")
    for name, split in memory.get("splits", {}).items():
        if split.get("peak"):
            print(f"  {name} {split_line(split['peak'])}")
    if memory.get("split", {}).get("peak"):
        print(f"  {split_line(memory['split']['peak'])}")
    live = memory.get("split", {}).get("at_exit_trimmed")
    if live:
        print(f"  at exit, after glibc gave its free pages back: resident {live['resident'] / 2**20:.0f} MiB, of "
              f"which file-backed {live['file_backed'] / 2**20:.0f} and caches "
              f"{sum(live['caches'].values()) / 2**20:.0f} MiB")
    for label, h in figures["weights"].items():
        state = "unchanged" if len({*h.values()}) == 1 and None not in h.values() else f"CHANGED {h}"
        print(f"weights {label:<22} {(h['loaded'] or '?')[:16]}  {state}")
    same = figures["same_as_alone"]
    print(f"sampled sessions equal to a single-session run: {sum(v['same'] for v in same)}/{len(same)}")
    for verdict in same:
        if not verdict["same"]:
            print(f"  session {verdict['session']} differs in {verdict['differs_in']}: {verdict}")
    print(f"errors: {len(figures['errors'])}")
    for error in figures["errors"][:20]:
        print(f"  {error}")
    print(f"{'OK' if figures['ok'] else 'NOT OK'} ({figures.get('wall_seconds', 0):.0f} s)")
