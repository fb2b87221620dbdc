"""The verdict table, family x head class: `check` on every symmetry, forward and backward, at Hugging Face's own
init and with norms, biases and positions far from it, on tiny random models.

    HF_HUB_OFFLINE=1 python benchmarks/head_classes.py [--dtype float64] [--family NAME ...] [--json FILE]

Prints one markdown row per class: the verdict at each init, the worst headline error (tensors judged by relative
error, forward and backward) and that error in units of machine epsilon, the controls that could not bite, and the
oracle's error against transformers' own forward.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers as hf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perm_core.families import _registry  # noqa: E402
from perm_core.models.random_models import build_random_model, random_config, random_inputs  # noqa: E402
from perm_core.run.numerics import use_exact_numerics  # noqa: E402
from perm_core.verify.check import check  # noqa: E402
from perm_core.verify.tolerances import in_eps, worst  # noqa: E402


def hf_init(family: str, cls: str, dtype: torch.dtype):
    torch.manual_seed(0)
    model = getattr(hf, cls)(random_config(family)).to(dtype).eval()
    use_exact_numerics(model)
    return model


def row(family: str, cls: str, dtype: torch.dtype) -> dict:
    found = {"family": family, "class": cls}
    for label, model in (("hf_init", hf_init(family, cls, dtype)),
                         ("far", build_random_model(family, model_class=cls, dtype=dtype, seed=1)[0])):
        started = time.perf_counter()
        report = check(model, random_inputs(family, model, seed=1), key=5, model_name=f"{family}/{cls}")
        error = worst(c.max_rel_error for c in report.checks)
        found[label] = {"passed": report.passed, "max_rel_error": error, "eps": in_eps(error, dtype),
                        "uninformative": [f"{c.symmetry}:{c.name}" for c in report.controls if not c.informative],
                        "failed": [f"{c.symmetry}/{c.direction}: {c.note or c.first_break}"
                                   for c in report.checks if not c.passed],
                        "oracle": report.oracle.max_rel_error if report.oracle else None,
                        "seconds": time.perf_counter() - started}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--family", action="append")
    parser.add_argument("--json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    print("| family | class | HF init | far from init | worst error (eps) | controls that cannot bite (HF init) |"
          " oracle |\n|---|---|---|---|---|---|---|")
    for family in _registry().values():
        if args.family and family.name not in args.family:
            continue
        for cls in family.classes:
            r = row(family.name, cls, dtype)
            rows.append(r)
            a, b = r["hf_init"], r["far"]
            error = max(a["max_rel_error"], b["max_rel_error"])
            print(f"| {family.name} | {cls} | {'pass' if a['passed'] else 'FAIL'} | {'pass' if b['passed'] else 'FAIL'}"
                  f" | {error:.1e} ({error / torch.finfo(dtype).eps:.0f}) | {', '.join(a['uninformative']) or '-'} |"
                  f" {max(a['oracle'] or 0, b['oracle'] or 0):.1e} |", flush=True)
            for failure in a["failed"] + b["failed"]:
                print(f"|   | {failure} | | | | | |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(r["hf_init"]["passed"] and r["far"]["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
