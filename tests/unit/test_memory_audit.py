"""ui.runtime.memory_audit: the split of a process's memory by owner, and the opt-in watch that writes it at each
peak."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from ui.runtime import memory_audit

ROOT = Path(__file__).resolve().parents[2]


def test_the_split_counts_registered_caches_and_reads_the_resident_size(monkeypatch):
    monkeypatch.setattr(memory_audit, "_caches", {})
    monkeypatch.setattr(memory_audit, "_gauges", {})
    memory_audit.register("results", SimpleNamespace(bytes=3 << 20))
    memory_audit.register("params", SimpleNamespace(bytes=5))
    runs = [2]
    memory_audit.register_gauge("page_runs", lambda: runs[0])
    figures = memory_audit.split()
    assert figures["caches"] == {"params": 5, "results": 3 << 20}
    assert figures["in_flight"] == {"page_runs": 2}
    runs[0] = 0
    assert memory_audit.split()["in_flight"] == {"page_runs": 0}  # read at each split
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    assert abs(figures["resident"] - pages * os.sysconf("SC_PAGE_SIZE")) < 64 << 20
    assert 0 < figures["file_backed"] < figures["resident"]
    assert figures["heap_in_use"] > 0 and figures["python_blocks"] > 0 and figures["threads"] >= 1


WATCHED = """
import sys, threading, time, torch
from ui.runtime import memory_audit
assert memory_audit.start() == (sys.argv[1] == "on")
assert ("memory-audit" in {t.name for t in threading.enumerate()}) == (sys.argv[1] == "on")
time.sleep(0.6)
held = torch.ones(2**25)  # 128 MiB, touched
time.sleep(0.6)
freed, kept = [], []
for _ in range(2000):
    freed.append(torch.ones(2**14))  # 64 KiB each, from glibc's heap: 125 MiB
    kept.append(torch.ones(2**12))  # 16 KiB blocks between them, alive at exit: from the top, as no freed one fits
time.sleep(0.6)
del freed  # free, but resident among the kept blocks until malloc_trim
"""


def watch(mode: str, target: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(memory_audit.VARIABLE, None)
    if mode == "on":
        env[memory_audit.VARIABLE] = str(target)
    subprocess.run([sys.executable, "-c", WATCHED, mode], cwd=ROOT, check=True, timeout=120, env=env)


def test_off_unless_the_variable_is_set(tmp_path):
    watch("off", tmp_path / "memory.json")
    assert list(tmp_path.iterdir()) == []


def test_the_watch_writes_the_split_at_a_new_peak_and_at_exit(tmp_path):
    target = tmp_path / "memory.json"
    watch("on", target)
    figures = json.loads(target.read_text())
    assert figures["peak"]["resident"] >= figures["at_exit"]["resident"] - memory_audit.STEP_BYTES
    assert figures["peak"]["own_mappings"] >= 2**27  # the tensor, in its own mapping, counted at the peak
    assert figures["peak"]["seconds"] > 0.5
    trimmed = figures["at_exit_trimmed"]  # the 125 MiB freed among live blocks went back only then
    assert trimmed["resident"] < figures["at_exit"]["resident"] - (64 << 20)
    # The lifetime peak (VmHWM) held at once what the script touched before it freed anything: the 128 MiB tensor
    # and the 2000 pairs of blocks. Not compared with the sampled sizes: two readings of a moving quantity.
    assert figures["peak_rss_bytes"] >= 2**27 + 2000 * 4 * (2**14 + 2**12)
