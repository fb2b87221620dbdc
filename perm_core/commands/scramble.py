"""python -m perm_core scramble MODEL --symmetry NAME ... --key N --out DIR

Writes a function-identical model with different weights (save_pretrained, safetensors) and a
key.json recording the transforms, loadable by plain transformers.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from perm_core.commands import DTYPES, UsageError, key_or_usage_error, load_or_usage_error
from perm_core.symmetries import DESCRIPTIONS, WEIGHT_SYMMETRIES


def register(sub) -> None:
    parser = sub.add_parser("scramble", help="write a function-identical model with transformed weights")
    parser.add_argument("model")
    parser.add_argument("--symmetry", action="append", required=True,
                        help=f"repeatable; one of {', '.join(WEIGHT_SYMMETRIES)} (tokens act on inputs, not weights)")
    parser.add_argument("--key", type=str, required=True)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--out", required=True)
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.verify import Subject

    bad = [name for name in args.symmetry if name not in WEIGHT_SYMMETRIES]
    if bad:
        raise UsageError(f"cannot scramble weights with {', '.join(bad)}: only {', '.join(WEIGHT_SYMMETRIES)} "
                         "change weights alone (tokens permute the input)")
    key = key_or_usage_error(args.key)
    loaded = load_or_usage_error(args.model, DTYPES[args.dtype])
    subject = Subject(loaded.model)
    scramble = subject.build({name: key for name in args.symmetry})
    write_scrambled(loaded, subject.transformed_params(scramble), Path(args.out))
    record = {"model": args.model, "family": subject.family.name, "key": key, "dtype": args.dtype,
              "symmetries": {name: DESCRIPTIONS[name] for name in args.symmetry},
              "reproduce": f"python -m perm_core scramble {args.model} "
                           + " ".join(f"--symmetry {s}" for s in args.symmetry) + f" --key {key}"}
    (Path(args.out) / "key.json").write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}: {args.model} scrambled by {', '.join(args.symmetry)} with key {key}")
    return 0


def write_scrambled(loaded, params: dict[str, torch.Tensor], out: Path) -> None:
    """A fresh copy of the architecture holds the new weights; the shared model is never touched."""
    config = copy.deepcopy(loaded.model.config)
    config._attn_implementation = "eager"  # perm_core's own attention is not registered for other readers
    model = type(loaded.model)(config)
    missing, unexpected = model.load_state_dict({n: p.detach() for n, p in params.items()}, strict=False)
    model.tie_weights()
    if unexpected:
        raise UsageError(f"unexpected parameters when writing: {unexpected[:3]}")
    model.save_pretrained(out, safe_serialization=True)
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(out)
