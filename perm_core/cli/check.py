"""python -m perm_core check MODEL [--symmetry NAME ...] [--key N | --key NAME=N ...] [--input SPEC]
[--dtype float32|float64] [--forward-only] [--stream] [--revision REV] [--device cpu|cuda|mps] [--json]"""

from __future__ import annotations

from perm_core.cli import (
    DTYPES,
    UsageError,
    add_model_options,
    device_or_usage_error,
    host_only_when_streaming,
    key_or_usage_error,
    load_or_usage_error,
    print_json,
    stored_dtype,
)
from perm_core.cli._streamed import loaded_stand_in, streamed_model, streams_by_itself
from perm_core.engine.symmetries import SYMMETRIES
from perm_core.verify.expert_blocks import block_notes
from perm_core.verify.tolerances import worst


def register(sub) -> None:
    parser = sub.add_parser("check", help="verify every symmetry forward and backward, with negative controls")
    parser.add_argument("model", help="zoo name (see `models`), random:FAMILY, a Hugging Face checkpoint (org/name), "
                                      "or a save_pretrained directory")
    parser.add_argument("--symmetry", action="append", choices=SYMMETRIES,
                        help="repeatable; default: all of them")
    parser.add_argument("--key", action="append", metavar="N | NAME=N",
                        help="integer key 0 .. 2**64-1 for every symmetry (default 0), or NAME=N for one "
                             "symmetry (repeatable; the others keep the plain key or 0)")
    parser.add_argument("--input", metavar="SPEC", help="digit:N, sample:NAME, image:PATH, ids:N:SEED, "
                                                        "text-sample:NAME or text:TEXT (default: the model's "
                                                        "default input)")
    parser.add_argument("--forward-only", action="store_true", help="skip the backward (gradient) checks")
    parser.add_argument("--dtype", choices=DTYPES, default="float64")
    parser.add_argument("--stream", action="store_true",
                        help="read the checkpoint block by block from its safetensors shards, in memory bounded by "
                             "its largest block (chosen by itself when the whole model would not fit)")
    add_model_options(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.models.defaults import default_inputs
    from perm_core.run.progress import terminal_bar
    from perm_core.verify.check import check
    from perm_core.verify.results import VacuousCheckError

    names = args.symmetry or list(SYMMETRIES)
    keys = keys_or_usage_error(args.key or ["0"], names)
    device_or_usage_error(args.device)
    if args.stream or streams_by_itself(args.model, DTYPES[args.dtype], args.revision):
        host_only_when_streaming(args.device, "the streamed check", "check the whole model")
        report = streamed_report(args, names, keys)
    else:
        loaded = load_or_usage_error(args.model, DTYPES[args.dtype], args.revision, args.device)
        inputs = default_inputs(loaded) if args.input is None else input_or_usage_error(loaded, args.input)
        try:
            with terminal_bar(f"check {args.model}") as progress:
                report = check(loaded.model, inputs, names, keys, model_name=args.model, progress=progress,
                               backward=not args.forward_only, device=args.device)
        except VacuousCheckError as error:  # e.g. only experts named, on a dense model
            raise UsageError(str(error).splitlines()[0]) from None
    stored = stored_dtype(args.model, args.revision)  # a checkpoint's own dtype: upcast (or rounded) to --dtype
    stored_name = None if stored is None else str(stored).removeprefix("torch.")
    if args.json:
        print_json({**report.to_json(), **({"stored_dtype": stored_name} if stored is not None else {})})
    else:
        lines = format_report(report).split("\n")
        if stored is not None:
            size, checked = stored.itemsize, DTYPES[args.dtype].itemsize
            how = "upcast" if size < checked else "rounded" if size > checked else "as stored"
            lines.insert(1, f"weights stored as {stored_name}, checked in {args.dtype} ({how})")
        print("\n".join(lines))
    return 0 if report.passed else 1


def streamed_report(args, names: list[str], keys: dict[str, int]):
    from perm_core.models.defaults import default_inputs
    from perm_core.run.progress import terminal_bar
    from perm_core.stream.check import stream_check
    from perm_core.stream.shards import CheckpointError

    model = streamed_model(args.model, DTYPES[args.dtype], args.revision)
    loaded = loaded_stand_in(model, args.model)
    inputs = default_inputs(loaded) if args.input is None else input_or_usage_error(loaded, args.input)
    del loaded  # its tokenizer (gemma3-270m's: about 0.5 GiB) is not needed by the check
    try:
        with terminal_bar(f"check {args.model} (streamed)") as progress:
            return stream_check(model.reader.directory, inputs, names, keys, model_name=args.model,
                                backward=not args.forward_only, dtype=DTYPES[args.dtype], progress=progress)
    except CheckpointError as error:
        raise UsageError(str(error).splitlines()[0]) from None


def keys_or_usage_error(texts: list[str], names: list[str]) -> dict[str, int]:
    """`--key N` for every symmetry, `--key NAME=N` for one; a later one wins."""
    keys = {name: 0 for name in names}
    for text in texts:
        name, sep, value = text.rpartition("=")
        if not sep:
            keys = {n: key_or_usage_error(value) for n in names}
        elif name not in SYMMETRIES:
            raise UsageError(f"--key {text}: unknown symmetry {name!r}; choose from {', '.join(SYMMETRIES)}")
        elif name not in names:
            raise UsageError(f"--key {text}: {name} is not checked (add --symmetry {name})")
        else:
            keys[name] = key_or_usage_error(value)
    return keys


def input_or_usage_error(loaded, spec: str) -> dict:
    from perm_core.models.input_spec import InputSpecError, inputs_from_spec

    try:
        return inputs_from_spec(loaded, spec)
    except InputSpecError as error:
        raise UsageError(str(error)) from None


def format_report(report) -> str:
    lines = [f"{report.model}  ({report.family}, {report.dtype})", "",
             f"{'symmetry':<14} {'direction':<9} {'moved':>9} {'max abs err':>12} {'max rel err':>12} "
             f"{'in eps':>8} {'tolerance':>10} {'err/tol':>8}  result"]
    for c in report.checks:
        margin = worst(t.max_rel_error / t.tolerance for t in c.tensors)
        lines.append(f"{c.symmetry:<14} {c.direction:<9} {c.moved:>9.2g} {c.max_abs_error:>12.2e} "
                     f"{c.max_rel_error:>12.2e} {c.max_rel_error_eps:>8.3g} {c.tolerance:>10.0e} {margin:>8.2f}  "
                     f"{'pass' if c.passed else 'FAIL'}")
        if c.note:
            lines.append(f"    {c.note}")
        if c.first_break:
            lines.append(f"    first breaks at {c.first_break}; worst error over tolerance, in the order the run "
                         "computed them:")
            lines += [f"      {s.where:<20} {s.error_over_tolerance:>10.3g}  {s.worst_tensor}" for s in c.stages]
        lines += [f"    {note}" for note in block_notes(c.experts)]
        raised = [t for t in c.tensors if t.finite and t.tolerance > c.tolerance]
        if raised:
            top = max(raised, key=lambda t: t.tolerance)
            lines.append(f"    {len(raised)} float32 tensor(s) held to their measured round-off x8 "
                         f"(largest tolerance {top.tolerance:.1e}, {top.name})")
    floored = {name: reason for c in report.checks for name, reason in c.floored.items()}
    if floored:
        reasons = sorted(set(floored.values()))
        largest = worst(c.floored_max_abs_error for c in report.checks)
        lines += ["", f"judged against the floor (zero in exact arithmetic, left out of the errors above): "
                      f"{len(floored)} tensor(s), |x| <= {largest:.1e}"]
        lines += [f"    {reason}" for reason in reasons]
    for symmetry, reason in report.restricted.items():
        lines += ["", f"{symmetry} is checked in a restricted form: {reason}"]
    for symmetry, reason in report.not_applicable.items():
        lines += ["", f"{symmetry} is not applicable: {reason}"]
    if report.not_symmetries:
        lines += ["", f"{'does not hold':<14} {'measured break':>14}  evidence  reason"]
        for n in report.not_symmetries:
            lines.append(f"{n.symmetry:<14} {n.max_rel_error:>14.2e}  {'broken' if n.broken else 'NOT BROKEN':<8}  "
                         f"{n.reason}")
    lines += ["", f"{'negative control':<40} {'max rel err':>12}  result"]
    for c in report.controls:
        verdict = "broken (as it must be)" if c.broken else "not informative" if not c.informative else "NOT BROKEN"
        lines.append(f"{c.symmetry + ': ' + c.name:<40} {c.max_rel_error:>12.2e}  {verdict}"
                     + ("" if c.measured_on == "every traced tensor" else f", on {c.measured_on}"))
        if c.note:
            lines.append(f"    {c.note}")
        lines += [f"    {note}" for note in block_notes(c.experts, most=1)]  # where it began in the experts
    if report.oracle is not None:
        o = report.oracle
        lines += ["", f"oracle: the original run's {o.output} against transformers' own forward ({o.attention} "
                      f"attention): {o.max_rel_error:.2e} relative, tolerance {o.tolerance:.0e}  "
                      f"{'agrees' if o.passed else 'DISAGREES: the traced run is not the stock model'}"]
    lines += ["", "moved: how far the element moves what it acts on: the share of movable tokens, or a weight's "
              "relative change on its own scale (a check needs >= 0.1)",
              "max rel err: over tensors judged by relative error; in eps: the same in units of machine epsilon",
              "err/tol: the worst tensor's error over its own tolerance (a pass needs <= 1)",
              "a control is first run up to block 1's MLP; it runs in full where that shows no break",
              "PASSED" if report.passed else "FAILED"]
    memory = getattr(report, "memory", None)
    if memory is not None:  # a streamed check (perm_core.stream): what its proof rests on, and its memory
        held = "unknown" if memory.held is None else f"{memory.held / 2**20:.1f} MiB"
        peak = "unknown" if memory.peak is None else f"{memory.peak / 2**20:.1f} MiB"
        lines[-2] = "a control runs stage by stage until one shows its break"
        lines[-1:-1] = ["", f"streamed: {report.proof}",
                        f"memory: held at most {held} above the {(memory.baseline or 0) / 2**20:.1f} MiB it started "
                        f"at (peak resident {peak}); bound {memory.bound / 2**20:.1f} MiB = 3 x the largest block "
                        f"{memory.largest_block / 2**20:.1f} MiB + 2 x its largest tensor "
                        f"{memory.largest_tensor / 2**20:.1f} MiB + activations {memory.activations / 2**20:.1f} MiB "
                        f"+ embedding rows {memory.embedding_rows / 2**20:.2f} MiB + the keys' drawn transforms "
                        f"{memory.transforms / 2**20:.1f} MiB + the head's whole parameters "
                        f"{memory.head_whole / 2**20:.2f} MiB + {memory.first_use / 2**20:.0f} "
                        f"MiB torch loads on first use; head in {report.head_chunks} chunk(s)"
                        + (f"; the most held in one stage: {memory.largest_stage}, "
                           f"{memory.stages[memory.largest_stage] / 2**20:.1f} MiB" if memory.stages else ""),
                        *report.notes]
    return "\n".join(lines)
