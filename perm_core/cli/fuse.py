"""python -m perm_core fuse MODEL_A MODEL_B [--method M ...] [--points N] [--json]

Aligns B to A (average | permutation | rotation | permutation+rotation), proves the aligned B is the
same function as B, and reports the fused model's test accuracy and loss, the loss barrier along
(1 - alpha) A + alpha aligned-B, and the parameter distance before and after matching.
"""

from __future__ import annotations

from perm_core.applications.matching import METHODS
from perm_core.cli import UsageError, load_or_usage_error, print_json


def register(sub) -> None:
    parser = sub.add_parser("fuse", help="fuse two digits ViTs after aligning them with exact symmetries")
    parser.add_argument("model_a", help="zoo name, e.g. digits-vit")
    parser.add_argument("model_b", help="zoo name, e.g. digits-vit-b")
    parser.add_argument("--method", action="append", choices=METHODS, help="repeatable; default: all four")
    parser.add_argument("--points", type=int, default=11, help="points on the linear path (>= 2, default 11)")
    parser.add_argument("--no-proof", action="store_true", help="skip the functional-identity proof")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.applications.fusion import fuse

    if args.points < 2 or args.points > 201:
        raise UsageError(f"--points must be between 2 and 201, got {args.points}")
    loaded_a = load_or_usage_error(args.model_a)
    loaded_b = load_or_usage_error(args.model_b)
    try:
        result = fuse(loaded_a, loaded_b, tuple(args.method or METHODS), n_points=args.points,
                      prove=not args.no_proof)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print_json(result.to_json()) if args.json else print(format_result(result))
    proofs_ok = all(m.proof is None or (m.proof.passed and m.proof.control_broken) for m in result.methods)
    return 0 if proofs_ok else 1


def format_result(result) -> str:
    lines = [f"A = {result.model_a}: accuracy {result.accuracy_a:.4f}, loss {result.loss_a:.4f}",
             f"B = {result.model_b}: accuracy {result.accuracy_b:.4f}, loss {result.loss_b:.4f}", "",
             f"{'method':<22} {'fused acc':>9} {'fused loss':>10} {'barrier':>8} {'||A-B||':>8} {'aligned':>8}  proof"]
    for m in result.methods:
        proof = ("nothing aligned" if m.method == "average" else "skipped") if m.proof is None else (
            f"{'same function' if m.proof.passed else 'FAILED'} (max rel err {m.proof.max_rel_error:.1e}, "
            f"control {'broken' if m.proof.control_broken else 'NOT BROKEN'})")
        lines.append(f"{m.method:<22} {m.accuracy:>9.4f} {m.loss:>10.4f} {m.barrier:>8.4f} "
                     f"{m.distance_before:>8.3f} {m.distance_after:>8.3f}  {proof}")
    return "\n".join(lines)
