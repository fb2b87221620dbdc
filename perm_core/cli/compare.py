"""python -m perm_core compare A B [--probes N] [--revision-a REV] [--revision-b REV] [--device cpu|cuda|mps] [--json]

Are A and B (two checkpoints of one family) the same function, and which group element maps A to B?
Computed in float64; a pair stored in float32, bfloat16 or float16 is held to that dtype's rounding.
Exit 0: same function and the recovered element reproduces B; 1: same function but the element was not
recovered, or different functions; 2: bad usage, different families or shapes, a model that cannot load.
"""

from __future__ import annotations

import torch

from perm_core.cli import (
    UsageError,
    add_model_options,
    device_or_usage_error,
    load_or_usage_error,
    print_json,
    stored_dtype,
)
from perm_core.verify.tolerances import worst_rel


def register(sub) -> None:
    parser = sub.add_parser("compare", help="same function? recover the symmetry element that maps A to B")
    parser.add_argument("model_a", help="zoo name, random:FAMILY, a Hugging Face checkpoint (org/name), or a "
                                        "save_pretrained directory")
    parser.add_argument("model_b", help="the same kinds of name; e.g. a directory written by `scramble`")
    parser.add_argument("--probes", type=int, default=2,
                        help="probe inputs (seeds 0 .. N-1 of the model's default input; default 2)")
    add_model_options(parser, ("--revision-a", "--revision-b"))
    parser.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.verify.same_function import IncomparableError, compare_models, probe_inputs

    if not 1 <= args.probes <= 16:
        raise UsageError(f"--probes must be between 1 and 16, got {args.probes}")
    device_or_usage_error(args.device)
    loaded_a = load_or_usage_error(args.model_a, torch.float64, args.revision_a)
    loaded_b = load_or_usage_error(args.model_b, torch.float64, args.revision_b)
    try:
        comparison = compare_models(loaded_a.model, loaded_b.model, probe_inputs(loaded_a, args.probes),
                                    args.model_a, args.model_b,
                                    stored=(stored_dtype(args.model_a, args.revision_a),
                                            stored_dtype(args.model_b, args.revision_b)), device=args.device)
    except IncomparableError as error:
        raise UsageError(str(error)) from None
    print_json(comparison.to_json()) if args.json else print(format_comparison(comparison))
    return comparison.exit_code


def format_comparison(c) -> str:
    from perm_core.verify.same_function import dtype_name

    s = c.recovered.summary()
    stored = [f"{who} = {name}" + (f"  (stored as {dtype_name(dtype)})" if dtype is not None else "")
              for who, name, dtype in (("A", c.a, c.stored[0]), ("B", c.b, c.stored[1]))]
    if c.precision:
        held = (f"held to {c.rounding}: weights within {c.weight_bound:.1e} of each tensor's largest entry, "
                f"traced tensors within their propagated bounds")
    else:
        held = f"tolerance {c.tolerance:.0e}"
    lines = [*stored, f"{c.family}, float64, {c.n_probes} probe input(s), {held}", "",
             f"outputs: worst relative error {c.output_error:.2e} ({_name(c.outputs)}"
             + (f", bound {c.output_bound:.1e}" if c.precision else "") + ")"
             f" -> {'same function' if c.same_function else 'different'}", "",
             "element recovered from the weights (B = A transformed by it):",
             f"  channels       {s['channels']['moved']} of {s['channels']['of']} residual channels moved",
             f"  heads          {s['heads']['moved']} of {s['heads']['of']} query heads moved "
             f"({s['heads']['groups_moved']} of {s['heads']['groups_of']} key/value groups)",
             f"  head_channels  {s['head_channels']['moved']} of {s['head_channels']['of']} in-head maps are "
             "channel permutations that move something",
             f"  mlp            {s['mlp']['moved']} of {s['mlp']['of']} MLP neurons moved",
             f"  rotation       {s['rotation']['rotated']} of {s['rotation']['of']} in-head maps are rotations "
             f"(largest entry of R - I: {s['rotation']['max_deviation']:.2f})",
             *(["                 (a channel permutation followed by a rotation is one orthogonal map, counted "
                "as a rotation)"] if s["rotation"]["rotated"] else []),
             "  tokens         not recovered: a token permutation acts on the inputs, not on the weights", "",
             f"parameter residual (A moved by it, against B): {c.residual:.2e} ({_name(c.parameters)})"
             + (f", bound {c.weight_bound:.1e}" if c.precision else ""),
             f"traced tensors of B un-scrambled by it, against A: worst {worst_rel(c.tensors):.2e} "
             f"({_name(c.tensors)}) over {len(c.tensors)} tensors", "",
             f"VERDICT: {c.verdict}: {c.explanation()}"]
    return "\n".join(lines)


def _name(errors) -> str:
    from perm_core.verify.same_function import worst_of

    return worst_of(errors).name or "none"
