"""python -m perm_core models [--json]"""

from __future__ import annotations

import dataclasses

from perm_core.cli import print_json, versioned


def register(sub) -> None:
    parser = sub.add_parser("models", help="list the model zoo")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args) -> int:
    from perm_core.models.registry import list_models

    rows = list_models()
    if args.json:
        print_json(versioned({"models": [dataclasses.asdict(r) for r in rows]}))
        return 0
    print(f"{'name':<34} {'family':<6} {'source':<7} {'params':>12} {'offline':<7} license")
    for r in rows:
        params = f"{r.n_params:,}" if r.n_params else "?"
        print(f"{r.name:<34} {r.family:<6} {r.source:<7} {params:>12} {'yes' if r.offline else 'no':<7} {r.license}")
    return 0
