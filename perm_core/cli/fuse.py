"""python -m perm_core fuse MODEL_A MODEL_B [--method M ...] [--points N] [--json]
   python -m perm_core fuse --experiment [--pairs N] [--width W] [--epochs E] [--points N] [--json]

Aligns B to A (average | permutation | rotation | permutation+rotation), proves the aligned B is the
same function as B, and reports the fused model's test accuracy and loss, the loss barrier along
(1 - alpha) A + alpha aligned-B, and the parameter distance before and after matching.
--experiment trains N seed pairs of wider digits ViTs and fuses each with weight and activation matching, with
and without rotations, reporting 95 % intervals (perm_core.applications.fusion_experiment).
"""

from __future__ import annotations

from perm_core.applications.matching import METHODS
from perm_core.cli import UsageError, load_or_usage_error, print_json, versioned

WIDTHS = (32, 64, 128, 256)


def register(sub) -> None:
    parser = sub.add_parser("fuse", help="fuse two digits ViTs after aligning them with exact symmetries")
    parser.add_argument("model_a", nargs="?", help="zoo name, e.g. digits-vit")
    parser.add_argument("model_b", nargs="?", help="zoo name, e.g. digits-vit-b")
    parser.add_argument("--method", action="append", choices=METHODS, help="repeatable; default: all four")
    parser.add_argument("--points", type=int, default=11, help="points on the linear path (>= 2, default 11)")
    parser.add_argument("--no-proof", action="store_true", help="skip the functional-identity proof")
    parser.add_argument("--experiment", action="store_true",
                        help="train seed pairs and fuse each with weight and activation matching, with intervals")
    parser.add_argument("--pairs", type=int, default=5, help="--experiment: seed pairs (2 to 20, default 5)")
    parser.add_argument("--width", type=int, default=128, choices=WIDTHS, help="--experiment: residual width")
    parser.add_argument("--epochs", type=int, default=15, help="--experiment: training epochs (1 to 60)")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.set_defaults(run=run)


def run(args) -> int:
    if args.points < 2 or args.points > 201:
        raise UsageError(f"--points must be between 2 and 201, got {args.points}")
    if args.experiment:
        return run_experiment(args)
    if not (args.model_a and args.model_b):
        raise UsageError("fuse needs two models (MODEL_A MODEL_B), or --experiment")
    from perm_core.applications.fusion import fuse

    loaded_a = load_or_usage_error(args.model_a)
    loaded_b = load_or_usage_error(args.model_b)
    try:
        result = fuse(loaded_a, loaded_b, tuple(args.method or METHODS), n_points=args.points,
                      prove=not args.no_proof)
    except ValueError as error:
        raise UsageError(str(error)) from None
    print_json(versioned(result.to_json())) if args.json else print(format_result(result))
    proofs_ok = all(m.proof is None or (m.proof.passed and m.proof.control_broken) for m in result.methods)
    return 0 if proofs_ok else 1


def run_experiment(args) -> int:
    from perm_core.applications.fusion_experiment import ExperimentSettings, run_experiment
    from perm_core.applications.fusion_pairs import PairSettings

    if args.model_a or args.method:
        raise UsageError("--experiment trains its own pairs: give no models and no --method")
    if not 2 <= args.pairs <= 20:
        raise UsageError(f"--pairs must be between 2 and 20, got {args.pairs}")
    if not 1 <= args.epochs <= 60:
        raise UsageError(f"--epochs must be between 1 and 60, got {args.epochs}")
    if args.points < 3:
        raise UsageError(f"--experiment needs at least 3 path points, got {args.points}")
    settings = ExperimentSettings(args.pairs, PairSettings(width=args.width, epochs=args.epochs), args.points)
    result = run_experiment(settings)
    print_json(versioned(result.to_json())) if args.json else print(format_experiment(result))
    proved = all(m.proved is not False for p in result.pairs for m in p.methods)
    return 0 if proved else 1


def format_experiment(result) -> str:
    s, pair = result.settings, result.settings.pair
    e = result.endpoints
    lines = [f"{s.pairs} seed pairs of digits ViTs ({pair.width} wide, {pair.layers} layers, {pair.heads} heads, "
             f"{pair.epochs} epochs), {result.seconds:.0f} s",
             f"A and B: test accuracy {100 * e.mean:.1f}% (95 % interval {100 * e.low:.1f} to {100 * e.high:.1f})", "",
             f"{'method':<36} {'merged accuracy, %':>22} {'loss barrier':>20} {'||A - B|| before -> after':>27}"
             "  proofs"]
    for m in result.summaries:
        proofs = [run.proved for p in result.pairs for run in p.methods if run.method == m.method]
        proved = ("nothing aligned" if all(p is None for p in proofs) else
                  f"{sum(p is True for p in proofs)}/{len(proofs)} same function")
        lines.append(f"{m.method:<36} {_interval(m.accuracy, 100):>22} {_interval(m.barrier, 1, 3):>20} "
                     f"{m.distance_before.mean:>8.2f} -> {m.distance_after.mean:6.2f} ({m.distance_cut.mean:4.1f}%)"
                     f"  {proved}")
    return "\n".join([*lines, "", result.verdict])


def _interval(interval, scale: float, digits: int = 1) -> str:
    return (f"{scale * interval.mean:.{digits}f} [{scale * interval.low:.{digits}f}, "
            f"{scale * interval.high:.{digits}f}]")


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
