"""Where a command's CPU goes, by kind of process: the test suite's pytest-xdist workers, its e2e app servers, Chromium,
the CLI subprocesses it starts. Linux only (reads /proc).

    python benchmarks/suite_cpu.py [--interval 0.5] [--top 25] [--json FILE] -- make test

`/usr/bin/time` counts only the processes its command waits for: the e2e app server runs in a session of its own and
Chromium is reaped by Playwright's driver, so `time make test` leaves both out. This runs the command with a marker in
its environment (every process it starts inherits it, the detached server included), reads every marked process's CPU
time from /proc every --interval seconds, and at the end sums the last reading of each by kind. A process that lives
shorter than one interval is missed or counted in part; each reading is cumulative, so nothing is counted twice.
Processes of other commands running beside it (another test run, an editor) are not marked and not counted.
--top N also lists the N command lines (their first COMMAND_CHARS characters) that used the most CPU, summed over
the processes that ran each: which CLI subprocess or which probe costs what.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

MARKER = "TSE_SUITE_CPU_MARK"
TICKS = os.sysconf("SC_CLK_TCK")
COMMAND_CHARS = 110  # a command line's head: enough to tell `-m perm_core check MODEL --stream` runs apart
# kind -> what its command line contains, tried in this order (the first that matches names the process)
KINDS = (("chromium", ("chromium", "chrome_crashpad")), ("playwright driver", ("playwright/driver",)),
         ("e2e app server", ("streamlit run", "serve/replicas.py", "haproxy")),
         ("pytest-xdist worker", ("exec(eval(sys.stdin.readline()))",)), ("CLI subprocess", ("-m perm_core",)),
         ("pip and builds", ("pip ", "setuptools", "wheel", "build")), ("pytest", ("pytest",)))


def kind_of(command: str) -> str:
    return next((kind for kind, marks in KINDS if any(mark in command for mark in marks)), "other")


def marked() -> dict[tuple[int, str], tuple[str, str, float]]:
    """(pid, start time) -> (kind, command line's head, CPU seconds so far) of every process carrying the marker."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"{MARKER}=1".encode() not in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                continue
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found[(int(pid), fields[19])] = (kind_of(command), command[:COMMAND_CHARS].strip(),
                                         (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--top", type=int, default=0, help="also list this many costliest command lines")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    started = time.time()
    child = subprocess.Popen(command, env={**os.environ, MARKER: "1"})
    last: dict[tuple[int, str], tuple[str, str, float]] = {}
    while child.poll() is None:
        last.update(marked())
        time.sleep(args.interval)
    last.update(marked())
    wall = time.time() - started
    by_kind, by_command, runs = collections.Counter(), collections.Counter(), collections.Counter()
    for kind, command_head, seconds in last.values():
        by_kind[kind] += seconds
        by_command[command_head] += seconds
        runs[command_head] += 1
    total = sum(by_kind.values())
    print(f"\n{'kind':<22} {'CPU s':>9} {'share':>7}   (wall {wall:.0f} s, exit {child.returncode}, "
          f"{os.cpu_count()} cores: {os.cpu_count() * wall:.0f} CPU-s offered)")
    for kind, seconds in by_kind.most_common():
        print(f"{kind:<22} {seconds:>9.1f} {seconds / total:>7.1%}")
    print(f"{'all':<22} {total:>9.1f}")
    top = by_command.most_common(args.top)
    if top:
        print(f"\n{'CPU s':>9} {'runs':>5}  command line (its head)")
        for command_head, seconds in top:
            print(f"{seconds:>9.1f} {runs[command_head]:>5}  {command_head}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": command, "wall_s": wall, "exit": child.returncode, "cores": os.cpu_count(),
                       "cpu_s": dict(by_kind), "cpu_s_total": total,
                       "top_commands": [{"command": c, "cpu_s": s, "runs": runs[c]} for c, s in top]}, out, indent=1)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
