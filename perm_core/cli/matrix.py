"""python -m perm_core matrix [--family NAME ...] [--key N] [--json]"""

from __future__ import annotations

from perm_core.cli import UsageError, key_or_usage_error, print_json


def register(sub) -> None:
    parser = sub.add_parser("matrix", help="which symmetries every supported architecture has (random models, "
                                           "float64)")
    parser.add_argument("--family", action="append", help="repeatable; default: every supported family")
    parser.add_argument("--key", type=str, default="12345", help="integer key, 0 .. 2**64-1 (default 12345)")
    parser.add_argument("--json", action="store_true", help="machine-readable matrix on stdout")
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.run.progress import terminal_bar
    from perm_core.verify.matrix import families, symmetry_matrix, to_json

    key = key_or_usage_error(args.key)
    unknown = sorted(set(args.family or ()) - set(families()))
    if unknown:
        raise UsageError(f"unknown family {', '.join(unknown)}; supported: {', '.join(families())}")
    with terminal_bar("symmetry matrix") as progress:
        rows = symmetry_matrix(args.family, key, progress)
    if args.json:
        print_json(to_json(rows, key))
    else:
        print(format_matrix(rows))
    return 0 if all(r.passed for r in rows) else 1


def format_matrix(rows) -> str:
    from perm_core.engine.symmetries import SYMMETRIES
    from perm_core.verify.matrix import HOLDS, NOT_APPLICABLE, NOT_HOLDING, RESTRICTED

    marks = {HOLDS: "holds", RESTRICTED: "restricted", NOT_HOLDING: "NO", NOT_APPLICABLE: "n/a"}
    lines = [f"{'family':<10}" + "".join(f"{s:>17}" for s in SYMMETRIES) + "  check"]
    reasons = []
    for row in rows:
        cells = []
        for symmetry in SYMMETRIES:
            cell = row.cells[symmetry]
            cells.append(f"{marks.get(cell.status, cell.status) + ' ' + f'{cell.max_rel_error:.0e}':>17}")
            if cell.status in (RESTRICTED, NOT_HOLDING):
                reasons.append(f"  {row.family} / {symmetry} ({cell.status}): {cell.reason}")
        lines.append(f"{row.family:<10}" + "".join(cells) + f"  {'passed' if row.passed else 'FAILED'}")
    lines += ["", "holds / restricted: worst float64 relative error of the check (forward and backward); NO: the "
              "symmetry does not hold, with the measured break of its standard element; n/a: nothing in the "
              "architecture for it to act on (experts on a dense model)", "", *reasons]
    return "\n".join(lines)
