"""python -m perm_core authorize MODEL --key K [--wrong N] [--json]

Lock MODEL with key K and measure the right key, no key and N wrong keys
(see perm_core.applications.authorization for the scheme).
"""

from __future__ import annotations

from perm_core.cli import UsageError, load_or_usage_error, print_json

SUPPORTED = ("digits-vit", "digits-vit-b", "minilm", "smollm2-135m")


def register(sub) -> None:
    parser = sub.add_parser("authorize", help="lock a model with a key; measure right key, no key, wrong keys")
    parser.add_argument("model", help=f"one of {', '.join(SUPPORTED)}")
    parser.add_argument("--key", type=str, default="0",
                        help="a whole number or a 0x hex string, up to 256 bits (default 0)")
    parser.add_argument("--wrong", type=int, default=20, help="how many wrong keys to try (default 20)")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.set_defaults(run=run)


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
    loaded = load_or_usage_error(args.model)
    result = authorize(loaded, key, n_wrong=args.wrong, model_name=args.model)
    if args.json:
        print_json(result.to_json())
        return 0
    wrong = result.wrong_keys
    print(f"{result.model}: {result.metric}, locked with key {result.key} "
          f"(key space 2^{result.key_space_bits:.0f})")
    print(f"  unlocked model   {result.original:.4f}")
    print(f"  right key        {result.right_key:.4f}")
    print(f"  no key           {result.no_key:.4f}")
    mean = sum(wrong) / len(wrong)
    print(f"  {len(wrong)} wrong keys    min {min(wrong):.4f}  mean {mean:.4f}  max {max(wrong):.4f}")
    print(f"  chance           {result.chance:.4f}")
    return 0
