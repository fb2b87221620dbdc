"""Progress for long work: the time left, estimated from the fraction done, and a terminal bar.

Every long computation in perm_core takes `progress(fraction, message)`; pages draw it as a bar
with `TimeLeft.describe`, the CLI as a tqdm bar on stderr when stderr is a terminal.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

Progress = Callable[[float, str], None]
# Below this fraction or this many seconds an extrapolation is mostly noise.
MIN_FRACTION, MIN_SECONDS = 0.02, 1.0


def seconds_text(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


class TimeLeft:
    """Extrapolates the time left linearly from the fraction done since construction."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.started = clock()

    def describe(self, fraction: float, message: str) -> str:
        fraction = min(max(fraction, 0.0), 1.0)
        elapsed = self.clock() - self.started
        if fraction >= 1.0:
            return f"{message} · took {seconds_text(elapsed)}"
        if fraction < MIN_FRACTION or elapsed < MIN_SECONDS:
            return f"{message} · {seconds_text(elapsed)} so far, estimating the time left"
        left = elapsed * (1.0 - fraction) / fraction
        return f"{message} · {seconds_text(elapsed)} so far, about {seconds_text(left)} left"


@contextmanager
def terminal_bar(description: str, stream=None):
    """Yields a progress callback that draws a tqdm bar on stderr, or does nothing when it is not a terminal."""
    from tqdm.auto import tqdm

    stream = stream or sys.stderr
    steps = 1000
    with tqdm(total=steps, desc=description, file=stream, disable=not stream.isatty(), leave=False,
              bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}") as bar:
        def update(fraction: float, message: str) -> None:
            bar.n = round(min(max(fraction, 0.0), 1.0) * steps)
            bar.set_description_str(f"{description}: {message}")  # refreshes: one call per run of seconds

        yield update
