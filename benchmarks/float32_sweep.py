"""float32 over many keys: exact symmetries must pass and every negative control must still break.

    python benchmarks/float32_sweep.py [--keys 20] [--models digits-vit,minilm,smollm2-135m,...] [--json]

For each model and key 1..N: `check` in float32, every symmetry forward and backward with their
composition, every control. Reports per model the checks passed, the largest error as a fraction of
its tensor's tolerance (how close a true symmetry came to failing), the float32 tensors whose
tolerance was raised to their measured round-off, and the smallest control break (how far the
weakest near miss stayed above BROKEN_AT).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from perm_core.models.defaults import default_inputs  # noqa: E402
from perm_core.models.registry import load_model, offline_model_names  # noqa: E402
from perm_core.verify.check import check  # noqa: E402
from perm_core.verify.tolerances import BROKEN_AT, json_safe, worst  # noqa: E402


def sweep(name: str, keys: range) -> dict:
    loaded = load_model(name, dtype=torch.float32)
    inputs = default_inputs(loaded)
    rows, started = [], time.perf_counter()
    for key in keys:
        report = check(loaded.model, inputs, key=key, model_name=name)
        margin = worst(t.max_rel_error / t.tolerance for c in report.checks for t in c.tensors)
        raised = sum(t.tolerance > c.tolerance for c in report.checks for t in c.tensors)
        weakest = min((c.max_rel_error for c in report.controls), default=float("nan"))
        rows.append({"key": key, "passed": report.passed,
                     "checks_failed": [f"{c.symmetry}/{c.direction}" for c in report.checks if not c.passed],
                     "controls_not_broken": [f"{c.symmetry}/{c.name}" for c in report.controls if not c.broken],
                     "worst_error_over_tolerance": margin, "raised_tolerances": raised,
                     "weakest_control_break": weakest})
    return {"model": name, "keys": len(rows), "all_passed": all(r["passed"] for r in rows),
            "worst_error_over_tolerance": worst(r["worst_error_over_tolerance"] for r in rows),
            "weakest_control_break": min(r["weakest_control_break"] for r in rows),
            "seconds": time.perf_counter() - started, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--models", default=",".join(offline_model_names()))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for name in args.models.split(","):
        result = sweep(name, range(1, args.keys + 1))
        results.append(result)
        if not args.json:
            print(f"{name:<16} keys {result['keys']:>3}  all passed {str(result['all_passed']):<5}  "
                  f"worst error / tolerance {result['worst_error_over_tolerance']:.2f}  "
                  f"weakest control break {result['weakest_control_break']:.2e} (needs > {BROKEN_AT:g})  "
                  f"{result['seconds']:.0f} s", flush=True)
            for row in result["rows"]:
                if not row["passed"]:
                    print(f"    key {row['key']}: failed {row['checks_failed']} "
                          f"unbroken {row['controls_not_broken']}")
    if args.json:
        print(json.dumps(json_safe(results), indent=2, allow_nan=False))


if __name__ == "__main__":
    main()
