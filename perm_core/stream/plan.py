"""The parts of the streamed check's one driver (stream.check.stream_check) that every layout shares: the model opened
with the memory baseline taken (opened), what the check judges settled before any stage runs (plan_check), the
original run with its controls and the oracle (Plan.original_run), and the verdicts from the elements' tallies
(Plan.verdicts), the same for every layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble
from perm_core.engine.symmetries import Control
from perm_core.engine.tokens import model_inputs, n_tokens
from perm_core.run import trace_names
from perm_core.run.malloc import give_freed_memory_back
from perm_core.stream.allowance import Allowances
from perm_core.stream.forward import ControlRun, forward_pass
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import StagePeaks, reset_peak, resident_bytes
from perm_core.stream.report import StreamedReport, control_result, movement, oracle
from perm_core.verify import experts
from perm_core.verify.check import SymmetryPlan, plan_symmetries, summarize
from perm_core.verify.results import NotSymmetry
from perm_core.verify.tolerances import TOLERANCE, judged, worst_rel


def opened(open_model, directory, inputs: dict, dtype: torch.dtype) -> tuple[StreamedModel, StagePeaks]:
    """The checkpoint's model, and the stages' peaks counted from here: the interpreter, torch, transformers and
    the meta-device model are the baseline."""
    # Blocks of 1 MiB and more get their own mappings, returned to the system when freed: resident memory is then
    # what is alive, not what glibc kept of earlier stages (process-wide, as the app server sets it).
    give_freed_memory_back()
    model = open_model(directory, dtype)
    model.layer_kwargs(model_inputs(inputs, model.geometry, Scramble(), dtype))  # transformers' lazy imports
    peak_reset = reset_peak()  # before the baseline is read: the peak is never below it
    return model, StagePeaks(resident_bytes(), peak_reset)


@dataclass
class Plan(SymmetryPlan):
    """What a streamed check judges, settled before any stage runs (plan_check): the whole-model check's plan of the
    symmetries (verify.check.plan_symmetries), with its report, judge, keys and the input's tokens."""

    report: StreamedReport
    judge: SimpleNamespace  # verify.check.summarize's subject: tolerance, dtype, movable tokens, places
    key_of: dict[str, int]
    count: int  # the input's tokens

    def scrambles(self, geometry) -> dict[str, Scramble]:
        """Each step's element: its symmetries' keys, built on the input's tokens."""
        return {step: symmetries.build_many({n: self.key_of[n] for n in self.names} if step == "all"
                                            else {step: self.key_of[step]}, geometry, self.count)
                for step in self.steps}

    def original_run(self, model: StreamedModel, inputs: dict, chunks: list[tuple[int, int]], stages: StagePeaks,
                     progress=None):
        """stream.forward.forward_pass (the original run, every control and every lacking symmetry's element riding
        along, the stock forward beside it), the lacking symmetries' measured breaks and the oracle into the report,
        each ending its stage. Returns the run and the ControlRuns (the lacking symmetries' among them)."""
        g = model.geometry
        lacking = [Control(name, "lacking", reason, lambda name=name: symmetries.build_many(
            {name: self.key_of[name]}, g, self.count)) for name, reason in self.missing.items()]
        run, runs = forward_pass(model, inputs, [c for found in self.controls.values() for c in found],
                                 head_chunks=chunks, progress=progress, lacking=lacking)
        stages.end("original run and controls")
        scales = run.scales.final({}, model.dtype)  # forward tensors only: none is judged against a floor
        for r in (r for r in runs if r.own):  # verify.controls.measure_break's figure, on the streamed records
            amount = worst_rel(judged(r.tally.differences(scales), model.dtype, {}))
            self.report.not_symmetries.append(NotSymmetry(r.control.symmetry, r.control.description, amount))
        self.report.oracle = oracle(model, inputs, run, chunks)
        stages.end("oracle")
        return run, runs

    def verdicts(self, model: StreamedModel, elements: dict, allowance: Allowances, control_runs: list[ControlRun],
                 scales: dict, floor_reasons: dict[str, str], backward: bool, explain) -> None:
        """Each step's verdicts into the report, forward and (with `backward`) backward apart, from its element's
        tally judged with the stages' allowances, then its symmetry's controls, an unbroken one explained where it
        can be (explain(run, result): stream.report.explained); the allowances used with them."""
        report = self.report
        by_symmetry = {name: [r for r in control_runs if r.control.symmetry == name and not r.own]
                       for name in self.names}
        for name in self.steps:
            tally = elements[name].tally
            errors = experts.with_expert_errors(allowance.judged(name, tally.differences(scales)),
                                                tally.expert_errors(scales))
            moved, what = movement(model, elements[name].scramble, self.judge.movable_tokens)
            for direction in ("forward", "backward") if backward else ("forward",):
                mine = [e for e in errors if trace_names.is_grad(e.name) == (direction == "backward")]
                report.checks.append(summarize(self.judge, name, direction, mine, moved, what))
            report.controls.extend(explain(r, control_result(r, scales, floor_reasons, model.dtype))
                                   for r in by_symmetry.get(name, []))
        report.allowances = allowance.used


def plan_check(model: StreamedModel, directory, inputs: dict, names: list[str], key_of: dict[str, int],
               model_name: str, backward: bool, include_combined: bool) -> Plan:
    """The report (its keys: every symmetry named, lacked ones too: the driver measures their break), the judge and
    the whole-model check's plan of the symmetries (verify.check.plan_symmetries)."""
    g, dtype = model.geometry, model.dtype
    count = n_tokens(inputs, g)
    judge = SimpleNamespace(tolerance=TOLERANCE.get(dtype, TOLERANCE[torch.float32]), dtype=dtype,
                            movable_tokens=g.movable_tokens(count), places=model.places())
    report = StreamedReport(model_name or str(directory), model.family.name, str(dtype).split(".")[-1],
                            {name: key_of[name] for name in names})
    plan = plan_symmetries(report, judge, g, count, names, key_of, backward, include_combined)
    return Plan(**vars(plan), report=report, judge=judge, key_of=key_of, count=count)
