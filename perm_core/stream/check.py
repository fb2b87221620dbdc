"""The streamed check: every symmetry and negative control of the whole-model check, on a checkpoint read from its
safetensors shards one block at a time.

What the proof rests on: the network is a chain of stages (the embedding, each block, the head). If each stage
maps the element's transform of the original's input at that stage to the transform of the original's output
there (and, backward, the transform of the original's output gradient to that of its input and parameter
gradients), then by induction along the chain the transformed network's run is the transformed original run, so
the whole network is equivariant. Each stage is therefore checked on the original's own activations and
gradients, with the same engine (engine.spec), the stock modules of transformers, and the same verdict rules
(verify.tolerances, verify.check), into the same Report. A stage with a tensor over its dtype's base tolerance gets
that stage's own measured round-off as its allowance, as the whole-model check gets the whole run's (stream.allowance).

Memory: at most three copies of the largest block's weights in the checked dtype (the output head is run in
vocabulary chunks no larger than a quarter block) and two of its largest tensor (a transformed weight's gradient and
its un-scrambled copy, compared and dropped), one block's activations and the embedding rows the input looks up;
a float32 check's float64 rerun for a round-off allowance adds one float64 block (memory.MemoryBound.allowance).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble
from perm_core.engine.tokens import model_inputs, n_tokens
from perm_core.fast.param_cache import tensor_bytes
from perm_core.run.malloc import give_freed_memory_back
from perm_core.stream import encoder_decoder_check
from perm_core.stream.allowance import Allowances
from perm_core.stream.encoder_decoder import is_encoder_decoder
from perm_core.stream.forward import OriginalRun, forward_pass
from perm_core.stream.layout import StreamedModel
from perm_core.stream.memory import MemoryBound, StagePeaks, reset_peak, resident_bytes
from perm_core.stream.report import PROOF, StreamedReport, control_result, movement
from perm_core.stream.reverse import Element, block_stage, block_stage_tensors, embedding_stage, head_stage
from perm_core.stream.stages import StreamingUnsupportedError
from perm_core.verify.check import KEY_BIAS_REASON, VacuousCheckError, cannot_move, summarize
from perm_core.verify.oracle import OracleResult
from perm_core.verify.tolerances import ROUNDOFF_CAP, ROUNDOFF_SAFETY, TOLERANCE, relative_error

__all__ = ["PROOF", "StreamedReport", "stream_check"]


def stream_check(directory, inputs: dict, symmetry_names=symmetries.SYMMETRIES, key: int | Mapping[str, int] = 0,
                 model_name: str = "", backward: bool = True, include_combined: bool = True,
                 dtype: torch.dtype = torch.float64, progress=None) -> StreamedReport:
    """check() of verify.check, stage by stage from the checkpoint's shards (the module docstring)."""
    names = list(symmetry_names)
    key_of = dict(key) if isinstance(key, Mapping) else {name: key for name in names}
    if not names:
        raise VacuousCheckError("no symmetry to check: name at least one")
    if is_encoder_decoder(directory):  # two stacks: stream.encoder_decoder_check runs their stages
        return encoder_decoder_check.stream_check(directory, inputs, names, key_of, model_name, backward,
                                                  include_combined, dtype, progress)
    # Blocks of 1 MiB and more get their own mappings, returned to the system when freed: resident memory is then
    # what is alive, not what glibc kept of earlier stages (process-wide, as the app server sets it).
    give_freed_memory_back()
    model = StreamedModel(directory, dtype)
    g = model.geometry
    model.layer_kwargs(model_inputs(inputs, g, Scramble(), dtype))  # transformers' lazy imports happen here
    # The peak counts from here: the interpreter, torch, transformers and the meta-device model are the baseline.
    peak_reset = reset_peak()
    baseline = resident_bytes()
    if any(name in g.not_holding() for name in names):
        raise StreamingUnsupportedError("streaming does not measure symmetries an architecture lacks")
    count = n_tokens(inputs, g)
    judge = SimpleNamespace(tolerance=TOLERANCE.get(dtype, TOLERANCE[torch.float32]), dtype=dtype,
                            movable_tokens=g.movable_tokens(count), places=_places(model))
    report = StreamedReport(model_name or str(directory), model.family.name, str(dtype).split(".")[-1],
                            {name: key_of[name] for name in names})
    if "tokens" in names and judge.movable_tokens < 2:
        report.checks.extend(cannot_move(judge, "tokens", backward))
        names.remove("tokens")
    restrictions = g.restrictions()
    report.restricted = {name: restrictions[name] for name in names if name in restrictions}
    steps = names + (["all"] if include_combined and len(names) > 1 else [])
    controls = {name: symmetries.controls(name, key_of[name], g, count) for name in names}
    for name, found in controls.items():
        if not found:
            raise VacuousCheckError(f"the {name} symmetry has no negative control on {model.family.name}")
    largest = max(model.bytes_of(model.block_names(layer)) for layer in range(model.n_layers))
    chunks = model.head_chunks(largest // 4)  # the head stage holds five chunk-sized tensors at once
    report.head_chunks = len(chunks)

    stages = StagePeaks(baseline, peak_reset)
    run, control_runs = forward_pass(model, inputs, [c for found in controls.values() for c in found],
                                     head_chunks=chunks, progress=progress)
    stages.end("original run and controls")
    report.oracle = _oracle(model, inputs, run, chunks)
    stages.end("oracle")
    elements = {}
    for name in steps:
        keys = {n: key_of[n] for n in names} if name == "all" else {name: key_of[name]}
        elements[name] = Element(model, inputs, symmetries.build_many(keys, g, count))
    transforms = tensor_bytes([[(e.scramble, e.inverse, e.layer_kwargs) for e in elements.values()], control_runs])
    floor_reasons = {f"grad.param.{n}": KEY_BIAS_REASON for n, c in model.claims.items()
                     if c.rule.tag == "attn.k" and len(model.reader.entries[n].shape) == 1 and not g.rope}
    allowance = Allowances(model, inputs, elements, floor_reasons, make_element=Element)
    grad, stash = head_stage(model, run, elements, backward, chunks)
    stages.end("head")
    original_inputs = model_inputs(inputs, g, Scramble(), dtype)
    original_kwargs = model.layer_kwargs(original_inputs)
    for layer in reversed(range(model.n_layers)):
        if progress:
            progress(1.0 - (layer + 1) / (model.n_layers + 1), f"checking block {layer}")
        grad = block_stage(model, layer, run, elements, backward, grad, original_kwargs[layer], allowance)
        stages.end(f"block {layer}")
    embedding_stage(model, run, elements, backward, grad, stash, original_inputs)
    stages.end("embedding")

    scales = run.scales.final(floor_reasons, dtype)
    by_symmetry = {name: [r for r in control_runs if r.control.symmetry == name] for name in names}
    for name in steps:
        errors = allowance.judged(name, elements[name].tally.differences(scales))
        moved, what = movement(model, elements[name].scramble, judge.movable_tokens)
        for direction in ("forward", "backward") if backward else ("forward",):
            mine = [e for e in errors if e.name.startswith("grad.") == (direction == "backward")]
            report.checks.append(summarize(judge, name, direction, mine, moved, what))
        report.controls.extend(control_result(r, scales, floor_reasons) for r in by_symmetry.get(name, []))
    report.allowances = allowance.used
    report.notes.extend(_allowance_notes(allowance, model, report))
    stages.end("comparisons")
    # the head's whole parameters: the original's and every element's copy with their gradients (the check), or
    # the original's and every control's (the original run)
    copies = max(2 * (1 + len(elements)), 1 + len(control_runs))
    report.memory = _memory(model, run, count, largest, baseline, peak_reset, stages, transforms,
                            model.bytes_of(model.head_whole) * copies)
    if progress:
        progress(1.0, "done")
    return report


def _allowance_notes(allowance: Allowances, model: StreamedModel, report: StreamedReport) -> list[str]:
    """Where a stage's measured round-off was used, and where a tensor over its base tolerance was at a stage whose
    round-off is not measured (the embedding's, the head's)."""
    other = str(allowance.other).split(".")[-1]
    notes = [f"{u['stage']}: {len(u['over_base_tolerance'])} tensor(s) over the base tolerance, judged with the "
             f"stage's round-off measured by a rerun in {other} ({', '.join(u['measured'])})" for u in allowance.used]
    if not allowance.enabled:
        return notes
    measured = {n for u in allowance.used for n in block_stage_tensors(model, int(u["stage"].split()[1]))}
    base = TOLERANCE.get(model.dtype, TOLERANCE[torch.float32])
    unmeasured = sorted({e.name for c in report.checks for e in c.tensors
                         if e.finite and not e.max_rel_error <= base and e.name not in measured})
    if unmeasured:
        notes.append("round-off allowances are measured at the blocks only: over its dtype's base tolerance at the "
                     f"embedding or the head, {', '.join(unmeasured)} fails here (the whole-model check would measure "
                     "its round-off, tolerances.py, before failing)")
    return notes


def _places(model: StreamedModel) -> dict:
    return {"n_layers": model.n_layers,
            "parameter_layers": {name: claim.layer for name, claim in model.claims.items()},
            "embedding_parameters": frozenset(n for n, c in model.claims.items() if c.rule.tag == "embedding"),
            "first_decoder_layer": None}


def _oracle(model: StreamedModel, inputs: dict, run: OriginalRun, chunks: list[tuple[int, int]]) -> OracleResult:
    """verify.oracle.consult, streamed: the stock forward's outputs (the logits; a headless model's last hidden state
    and pooled output) against the traced ones, the worst reported, and where the stock code's own arithmetic needs
    it, the allowance of that output's measured float32 round-off."""
    name, error = next(iter(model.output_axes)), 0.0
    for output in model.output_axes:
        found = relative_error(run.stock_outputs[output], run.records[output])
        if not found <= error:
            name, error = output, found
    base = TOLERANCE.get(model.dtype, TOLERANCE[torch.float32])
    tolerance = base
    if not error <= base and error != float("inf"):
        other = torch.float32 if model.dtype == torch.float64 else torch.float64
        rerun, _ = forward_pass(StreamedModel(model.reader.directory, other, model.reader), inputs, stock=False,
                                head_chunks=chunks)
        exact, rounded = run.records[name], rerun.records[name]
        if other == torch.float64:
            exact, rounded = rounded, exact
        roundoff = relative_error(exact.to(torch.float64), rounded.to(torch.float64))
        tolerance = min(max(base, ROUNDOFF_SAFETY * roundoff), ROUNDOFF_CAP)
    return OracleResult(name, error, tolerance, model.stock_attention)


def _memory(model: StreamedModel, run: OriginalRun, count: int, largest: int, baseline, peak_reset,
            stages: StagePeaks, transforms: int, head_whole: int) -> MemoryBound:
    g, itemsize = model.geometry, model.dtype.itemsize
    # the logits' width (a headless model's outputs: its last hidden state and pooled output)
    vocab = model.reader.entries[model.head_name].shape[0] if model.head_name is not None else 2 * g.d_model
    # one block's activations with their gradients (x4: original and transformed, forward and backward), every
    # block's input kept, and the logits with their gradient
    per_block = count * (12 * g.d_model + 4 * g.d_mlp + 4 * g.n_heads * count) * 4
    activations = itemsize * (per_block + count * g.d_model * 2 * model.n_layers + count * vocab * 4)
    # the token rows looked up and the other embedding tables whole (an image's: all of them), and an image's
    # pixels with their gradient, the original's and an element's
    rows = model.embedding_bytes(run.looked_up) * 3 + run.pixel_bytes * 4
    tensor = max(model.bytes_of([name]) for layer in range(model.n_layers) for name in model.block_names(layer))
    # a float32 check's float64 rerun (the only one wider than the check): a block, two tensors and activations
    allowance = 2 * (largest + 2 * tensor + per_block * itemsize) if model.dtype == torch.float32 else 0
    return MemoryBound(largest, tensor, activations, rows, transforms, head_whole, allowance, baseline=baseline,
                       peak=stages.peak, peak_since_start=peak_reset, stages=stages.stages, stages_after=stages.after)
