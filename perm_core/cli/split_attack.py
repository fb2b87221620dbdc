"""python -m perm_core split-attack [--seed S] [--key K] [--epochs E] [--victims N] [--train] [--json]

Black-box model inversion against privacy-enhancing split learning on digits (see
perm_core/applications/inversion.py for the threat model). --json prints
  {"seed", "key", "epochs", "n_victims", "seconds",
   "rows": [{"protection": "none"|"tokens"|"channels"|"both", "attacker": "decoder"|"adaptive",
             "ssim", "psnr", "channels_recovered": int|null, "token_orders_recovered": float|null}, ...],
   "baselines": [{"name": "blank"|"mean training image", "ssim", "psnr"}, ...],
   "training": {...}  (only with --train: plain vs scrambled split training, see split_learning.py)}
SSIM is in -1..1, PSNR in dB, both averaged over the victims (held-out digits), images in 0..1.
"""

from __future__ import annotations

from perm_core.cli import UsageError, key_or_usage_error, print_json, versioned

HELP_EPILOG = __doc__.split("\n", 2)[2]


def register(sub) -> None:
    import argparse

    from perm_core.applications.inversion import DEFAULT_EPOCHS
    from perm_core.applications.split_learning import DEFAULT_KEY, DEFAULT_SEED

    parser = sub.add_parser("split-attack", help="model-inversion attack on split learning, per protection",
                            description="Model-inversion attack on split learning (digits-vit), per protection.",
                            epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="attacker's seed (decoder init, batches)")
    parser.add_argument("--key", type=str, default=str(DEFAULT_KEY), help="client's secret key, 0 .. 2**64-1")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help="decoder training epochs")
    parser.add_argument("--victims", type=int, default=360, help="held-out digits attacked, 1..360")
    parser.add_argument("--no-adaptive", action="store_true", help="only the plain black-box decoder attacker")
    parser.add_argument("--train", action="store_true", help="also train through the split, plain vs scrambled")
    parser.add_argument("--train-epochs", type=int, default=None, help="epochs of split training (with --train)")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.applications.inversion import PROTECTION_LABELS, run_attack
    from perm_core.applications.split_learning import train_split

    key = key_or_usage_error(args.key)
    if args.epochs < 1 or not 1 <= args.victims <= 360:
        raise UsageError("--epochs must be at least 1 and --victims between 1 and 360")
    if args.train_epochs is not None and args.train_epochs < 1:
        raise UsageError("--train-epochs must be at least 1")
    result = run_attack(args.seed, key, args.epochs, args.victims, n_show=0, adaptive=not args.no_adaptive,
                        show_bar=not args.json)
    report = result.to_json()
    if args.train:
        extra = {"epochs": args.train_epochs} if args.train_epochs else {}
        report["training"] = train_split(args.seed, key, show_bar=not args.json, **extra).to_json()
    if args.json:
        print_json(versioned(report))
        return 0
    print(f"{'protection':<42} {'attacker':<9} {'SSIM':>7} {'PSNR dB':>8}  recovered")
    for row in result.rows:
        recovered = ", ".join(part for part in (
            f"{row.channels_recovered}/64 channels" if row.channels_recovered is not None else "",
            f"{row.token_orders_recovered:.0%} token orders" if row.token_orders_recovered is not None else "")
            if part)
        label = PROTECTION_LABELS[row.protection]
        print(f"{label:<42} {row.attacker:<9} {row.ssim:>7.3f} {row.psnr:>8.2f}  {recovered}")
    for baseline in result.baselines:
        print(f"{'baseline: ' + baseline['name']:<52} {baseline['ssim']:>7.3f} {baseline['psnr']:>8.2f}")
    if args.train:
        t = report["training"]
        print(f"\nsplit training, {t['epochs']} epochs: plain {t['final_plain_accuracy']:.1%}, "
              f"scrambled {t['final_scrambled_accuracy']:.1%}")
    return 0
