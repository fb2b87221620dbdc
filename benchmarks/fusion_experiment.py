"""The Fusion page's experiment, reproduced: seed pairs of digits ViTs fused five ways, with 95 % intervals.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/fusion_experiment.py [--pairs 5] [--width 128] [--epochs 15]
        [--points 11] [--json out.json]

Prints the table `fuse --experiment` prints (merged accuracy and loss barrier with their t-intervals, the
distance to the anchor model before and after matching, the proofs), the sentence the page shows, and where the
time went: wall and CPU seconds, the process's torch threads (one: the experiment runs its tiny models on one).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perm_core.applications.fusion_experiment import ExperimentSettings, run_experiment  # noqa: E402
from perm_core.applications.fusion_pairs import PairSettings  # noqa: E402
from perm_core.cli.fuse import format_experiment  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--points", type=int, default=11)
    parser.add_argument("--json", type=Path, help="also write the whole result here")
    args = parser.parse_args()
    settings = ExperimentSettings(args.pairs, PairSettings(width=args.width, epochs=args.epochs), args.points)
    started, cpu = time.perf_counter(), time.process_time()
    phases: dict[str, float] = {}
    last = {"phase": None, "at": started}

    def progress(fraction: float, message: str) -> None:  # time per phase: training vs matching and fusing
        phase = "training" if "training" in message else "matching, proving, fusing" if "matching" in message else None
        now = time.perf_counter()
        if last["phase"]:
            phases[last["phase"]] = phases.get(last["phase"], 0.0) + now - last["at"]
        last.update(phase=phase, at=now)

    result = run_experiment(settings, progress)
    wall, used = time.perf_counter() - started, time.process_time() - cpu
    print(format_experiment(result))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {wall:.0f} s, CPU {used:.0f} s, peak RSS {peak:.0f}"
          " MiB; " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items()))
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
