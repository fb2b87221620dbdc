"""An Explore key change alone and beside busy Python threads (a classroom's sessions drawing charts), per phase,
and the torch calls it makes.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gil_contention.py [--models dinov2-s,minilm] [--busy 4]
        [--repeats 3]

Every torch call that does work lets the GIL go and must win it back before Python goes on; beside threads that
run Python all the time, each return waits for them. So a key change slows with its number of such calls, not
its arithmetic. "calls" counts torch calls that do work (metadata reads such as .shape or .numel() hold the GIL);
each phase's seconds are medians of --repeats channel-key changes after two warm-up runs (the second traces the
forward's graph, perm_core/fast/graph_forward.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perm_core.explore.exploration import Exploration  # noqa: E402
from perm_core.models.defaults import default_inputs  # noqa: E402
from perm_core.models.registry import load_model  # noqa: E402
from perm_core.models.zoo import DEFAULT_IMAGE_MODEL, DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL  # noqa: E402
from perm_core.run.threads import TorchWorkCalls  # noqa: E402


def phases(explorer: Exploration, keys: list[int]) -> dict[str, float]:
    runs = [explorer.run({"tokens": 7, "channels": key}) for key in keys]
    return {phase: statistics.median(run.seconds[phase] for run in runs) for phase in runs[0].seconds}


def busy_threads(count: int):
    stop = threading.Event()

    def draw():  # dict and list building, as a chart's figure and its JSON
        while not stop.is_set():
            _ = [{"x": i, "y": [i] * 4} for i in range(200)]

    workers = [threading.Thread(target=draw, daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()
    return stop, workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join((DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL, DEFAULT_IMAGE_MODEL)))
    parser.add_argument("--busy", type=int, default=4, help="busy Python threads beside the key change")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'model':12} {'calls':>6}   alone (ms): params trace compare   beside {args.busy} busy threads (s): "
          "params trace compare")
    for name in args.models.split(","):
        loaded = load_model(name)
        explorer = Exploration(loaded.model, default_inputs(loaded), model_id=name)
        for key in (0, 1):  # warm: the forward's signature seen, then traced (perm_core.fast.graph_forward)
            explorer.run({"tokens": 7, "channels": key})
        with TorchWorkCalls() as calls:
            explorer.run({"tokens": 7, "channels": 2})
        alone = phases(explorer, [100 + i for i in range(args.repeats)])
        stop, workers = busy_threads(args.busy)
        try:
            started = time.perf_counter()
            beside = phases(explorer, [200 + i for i in range(args.repeats)])
        finally:
            stop.set()
            for worker in workers:
                worker.join()
        ms = {phase: 1000 * seconds for phase, seconds in alone.items()}
        print(f"{name:12} {calls.count:6d}   {'':11}{ms['params']:6.0f} {ms['trace']:5.0f} {ms['compare']:7.0f}"
              f"   {'':31}{beside['params']:6.2f} {beside['trace']:5.2f} {beside['compare']:7.2f}"
              f"   ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
