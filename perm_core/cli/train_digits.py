"""python -m perm_core train-digits --seed S --out DIR"""

from __future__ import annotations

from perm_core.cli import print_json


def register(sub) -> None:
    parser = sub.add_parser("train-digits", help="train a digits-vit on scikit-learn's digits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=None)
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.models.digits import train_digits

    extra = {"epochs": args.epochs} if args.epochs else {}
    metrics = train_digits(args.seed, args.out, **extra)
    print_json(metrics)
    return 0
