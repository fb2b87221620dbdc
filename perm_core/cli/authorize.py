"""python -m perm_core authorize MODEL --key K [--wrong N] [--attack [--lr R] [--steps S,...]] [--json]

Lock MODEL with key K and measure the right key, no key and N wrong keys
(see perm_core.applications.authorization for the scheme). --attack also recovers the key from the base and
the locked checkpoints, unlocks with it, and on digits models sweeps the owner's fine-tuning after locking
(perm_core.applications.attack).
"""

from __future__ import annotations

from perm_core.cli import UsageError, load_or_usage_error, print_json, versioned
from perm_core.models.zoo import AUTHORIZATION, serving

SUPPORTED = serving(AUTHORIZATION)


def register(sub) -> None:
    from perm_core.applications.attack import FINE_TUNE_RATES, FINE_TUNE_STEPS

    parser = sub.add_parser("authorize", help="lock a model with a key; measure right key, no key, wrong keys")
    parser.add_argument("model", help=f"one of {', '.join(SUPPORTED)}")
    parser.add_argument("--key", type=str, default="0",
                        help="a whole number or a 0x hex string, up to 256 bits (default 0)")
    parser.add_argument("--wrong", type=int, default=20, help="how many wrong keys to try (default 20)")
    parser.add_argument("--attack", action="store_true",
                        help="recover the key from the base and locked checkpoints and unlock with it")
    parser.add_argument("--lr", type=float, default=FINE_TUNE_RATES[0],
                        help=f"--attack: the owner's fine-tuning learning rate (default {FINE_TUNE_RATES[0]:g})")
    parser.add_argument("--steps", type=str, default=",".join(map(str, FINE_TUNE_STEPS)),
                        help="--attack: fine-tuning steps after locking, comma-separated (default "
                             f"{','.join(map(str, FINE_TUNE_STEPS))}; 'none' skips the sweep)")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.set_defaults(run=run)


def fine_tune_steps(text: str) -> tuple[int, ...]:
    if text.strip().lower() == "none":
        return ()
    try:
        steps = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise UsageError(f"--steps must be whole numbers separated by commas, got {text!r}") from None
    if not steps or steps[0] < 0 or steps[-1] > 10_000:
        raise UsageError(f"--steps must be between 0 and 10000, got {text!r}")
    return steps


def run(args) -> int:
    from perm_core.applications.authorization import authorize
    from perm_core.engine.keys import InvalidKeyError, parse_long_key

    try:
        key = parse_long_key(args.key)
    except InvalidKeyError as error:
        raise UsageError(str(error)) from None
    if args.model not in SUPPORTED:
        raise UsageError(f"authorize supports {', '.join(SUPPORTED)}; got {args.model!r}")
    if not 1 <= args.wrong <= 1000:
        raise UsageError(f"--wrong must be between 1 and 1000, got {args.wrong}")
    if not 0 < args.lr <= 1:
        raise UsageError(f"--lr must be in (0, 1], got {args.lr:g}")
    steps = fine_tune_steps(args.steps)
    loaded = load_or_usage_error(args.model)
    result = authorize(loaded, key, n_wrong=args.wrong, model_name=args.model)
    attacked = None
    if args.attack:
        from perm_core.applications.attack import attack

        attacked = attack(loaded, key, args.model, learning_rate=args.lr, steps=steps)
    if args.json:
        print_json(versioned({**result.to_json(), **({"attack": attacked.to_json()} if attacked else {})}))
        return 0
    print(format_result(result))
    if attacked:
        print("", format_attack(attacked), sep="\n")
    return 0


def format_result(result) -> str:
    wrong = result.wrong_keys
    return "\n".join([
        f"{result.model}: {result.metric}, locked with key {result.key} (key space 2^{result.key_space_bits:.0f})",
        f"  unlocked model   {result.original:.4f}",
        f"  right key        {result.right_key:.4f}",
        f"  no key           {result.no_key:.4f}",
        f"  {len(wrong)} wrong keys    min {min(wrong):.4f}  mean {sum(wrong) / len(wrong):.4f}  max {max(wrong):.4f}",
        f"  chance           {result.chance:.4f}"])


def format_attack(a) -> str:
    lines = [f"attack: the key recovered from the base and the locked checkpoints in {a.seconds:.3f} s",
             f"  key recovered exactly   {'yes' if a.recovered_exactly else 'no'} "
             f"({a.share_recovered:.1%} of the {a.channels} channel positions)",
             f"  attacker's check        base moved by the recovery vs locked: {a.weights_residual:.1e} -> "
             + ("verified" if a.verified else "NOT verified"),
             f"  unlocked by attacker    {a.unlocked:.4f}   (right key {a.right_key:.4f}, no key {a.no_key:.4f})"]
    sweep = a.fine_tune
    if sweep:
        lines += ["", f"the owner fine-tunes after locking (AdamW, learning rate {sweep.learning_rate:g}, "
                      f"batch {sweep.batch_size}), then publishes:",
                  f"  {'steps':>6} {'key recovered':>14} {'attacker':>9} {'owner':>7}  attacker's check"]
        for k, share, attacker, owner, residual in zip(sweep.steps, sweep.share_recovered, sweep.attacker,
                                                       sweep.owner, sweep.weights_residual, strict=True):
            lines.append(f"  {k:>6} {share:>14.1%} {attacker:>9.4f} {owner:>7.4f}  residual {residual:.1e}")
    return "\n".join(lines)
