"""Progress: the time left is extrapolated from the fraction done; the CLI bar draws only on a terminal;
`check` reports every scrambled run as one step, in order, ending at 1."""

from __future__ import annotations

import io

import torch

from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.run.progress import TimeLeft, seconds_text, terminal_bar
from perm_core.verify.check import check


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_time_left_extrapolates_from_the_fraction_done():
    clock = FakeClock()
    eta = TimeLeft(clock)
    assert "estimating" in eta.describe(0.5, "x")  # under a second: no guess yet
    clock.now += 30
    assert eta.describe(0.25, "checking heads") == "checking heads · 30 s so far, about 1 min 30 s left"
    assert eta.describe(0.01, "x").endswith("estimating the time left")
    assert eta.describe(1.0, "done") == "done · took 30 s"
    assert seconds_text(59.4) == "59 s" and seconds_text(125) == "2 min 05 s"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_terminal_bar_draws_on_a_terminal_and_stays_silent_on_a_pipe():
    pipe, terminal = io.StringIO(), Terminal()
    for stream in (pipe, terminal):
        with terminal_bar("check m", stream=stream) as progress:
            progress(0.5, "checking heads")
    assert pipe.getvalue() == ""
    assert "check m: checking heads" in terminal.getvalue() and "50%" in terminal.getvalue()


def test_check_reports_each_scrambled_run_in_order():
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=1)
    calls = []
    report = check(model, random_inputs("gpt2", model, seed=1), ["heads", "mlp"], key=3,
                   progress=lambda f, m: calls.append((f, m)))
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    messages = [m for _, m in calls]
    assert messages[0].startswith("original run") and messages[-1] == "done"
    runs = len(report.controls) + 3  # heads, mlp, all
    assert len(calls) == runs + 2
    assert sum(m.startswith("heads: negative control, ") for m in messages) == sum(c.symmetry == "heads"
                                                                        for c in report.controls) > 0
