"""The symmetry matrix: which symmetries each supported architecture has, measured on a random model of it.

Each cell comes from one float64 check (forward and backward, with negative controls) of a random model far
from init: "holds" (worst error), "restricted" (the restricted form that holds and why the full one cannot),
"does not hold" (why, and the measured break as evidence) or "FAILED" (a bug: the check itself failed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from perm_core.engine.symmetries import SYMMETRIES
from perm_core.schemas import SCHEMA_VERSION
from perm_core.verify.tolerances import json_safe, worst

HOLDS, RESTRICTED, NOT_HOLDING, FAILED = "holds", "restricted", "does not hold", "FAILED"
NOT_APPLICABLE = "not applicable"  # nothing in the architecture for it to act on (experts on a dense model)
MATRIX_KEY = 12345
MATRIX_DTYPE = "float64"  # every cell is measured in float64 (build_random_model below)


@dataclass
class Cell:
    status: str
    max_rel_error: float  # the worst check error (holds, restricted) or the measured break (does not hold)
    reason: str = ""
    controls_broken: int = 0
    controls: int = 0


@dataclass
class Row:
    family: str
    model: str
    model_class: str
    passed: bool
    cells: dict[str, Cell] = field(default_factory=dict)


def families() -> list[str]:
    from perm_core.families import family_names

    return family_names()


def family_row(family: str, key: int = MATRIX_KEY) -> Row:
    from perm_core.models.random_models import build_random_model, random_inputs
    from perm_core.run.threads import one_thread
    from perm_core.verify.check import check

    # one thread: the round-off shown is then the same whatever the process's thread count (2.2e-15 vs 2.3e-15 on gpt2)
    with one_thread():
        model, _ = build_random_model(family, dtype=torch.float64, seed=3)
        report = check(model, random_inputs(family, model, seed=3), SYMMETRIES, key=key,
                       model_name=f"random:{family}", include_combined=False)
    row = Row(family, f"random:{family}", type(model).__name__, report.passed)
    for symmetry in SYMMETRIES:
        checks = [c for c in report.checks if c.symmetry == symmetry]
        controls = [c for c in report.controls if c.symmetry == symmetry]
        missing = [n for n in report.not_symmetries if n.symmetry == symmetry]
        if symmetry in report.not_applicable:
            row.cells[symmetry] = Cell(NOT_APPLICABLE, 0.0, report.not_applicable[symmetry])
            continue
        if missing:
            status = NOT_HOLDING if missing[0].broken else FAILED
            row.cells[symmetry] = Cell(status, missing[0].max_rel_error, missing[0].reason)
            continue
        if not checks:  # every asked symmetry is either checked or reported as missing: anything else is a bug
            raise RuntimeError(f"{family}: {symmetry} is in neither the checks nor not_symmetries")
        passed = all(c.passed for c in checks) and all(c.broken for c in controls)
        status = (RESTRICTED if symmetry in report.restricted else HOLDS) if passed else FAILED
        note = next((c.note for c in checks if c.note), "")
        row.cells[symmetry] = Cell(status, worst(c.max_rel_error for c in checks),
                                   report.restricted.get(symmetry, note),
                                   sum(c.broken for c in controls), len(controls))
    return row


def symmetry_matrix(names: list[str] | None = None, key: int = MATRIX_KEY,
                    progress: Callable[[float, str], None] | None = None) -> list[Row]:
    names = names or families()
    rows = []
    for i, family in enumerate(names):
        if progress:
            progress(i / len(names), f"checking random:{family}")
        rows.append(family_row(family, key))
    if progress:
        progress(1.0, "done")
    return rows


def to_json(rows: list[Row], key: int = MATRIX_KEY) -> dict:
    return json_safe({"schema_version": SCHEMA_VERSION, "symmetries": list(SYMMETRIES), "dtype": MATRIX_DTYPE,
                      "key": key, "families": [asdict(r) for r in rows], "passed": all(r.passed for r in rows)})
