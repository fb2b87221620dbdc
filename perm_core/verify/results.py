"""What a check reports: each symmetry's verdict in each direction, each negative control's, each symmetry an
architecture lacks with its measured break, and the report that holds them (its JSON included). The rules that
produce them are in verify.check (the checks), verify.controls (the negative controls) and verify.tolerances.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from perm_core.schemas import SCHEMA_VERSION
from perm_core.verify.expert_blocks import ExpertBlock
from perm_core.verify.first_break import Stage
from perm_core.verify.oracle import OracleResult
from perm_core.verify.tolerances import BROKEN_AT, TensorError, json_safe, tensor_entry


class VacuousCheckError(ValueError):
    """A check that could not prove anything: no symmetries, no tensors, or no negative control."""


@dataclass
class CheckResult:
    symmetry: str
    direction: str  # "forward" | "backward"
    passed: bool
    max_abs_error: float
    max_rel_error: float
    tolerance: float  # the base tolerance of the dtype; a tensor may have its own, raised by its round-off (tensors)
    tensors: list[TensorError]
    moved: float = math.nan  # how far the element moves what it acts on (Subject.element_movement): the share of
    # movable tokens it moves, or a weight's relative change; proof the check is not vacuous
    moved_what: str = ""
    note: str = ""  # why it failed, when not an error above tolerance
    # The headline errors above are over tensors judged by relative error; tensors that are zero in exact
    # arithmetic (judged against the floor) are reported apart by the absolute value left in them.
    floored_max_abs_error: float = 0.0
    max_rel_error_eps: float = 0.0  # max_rel_error in units of the dtype's machine epsilon
    first_break: str = ""  # the first traced tensor, in the order the run computed them, over its tolerance
    stages: list[Stage] = field(default_factory=list)  # the worst error over tolerance of each place, in that order
    # A failing check of a mixture of experts: each MoE block's experts and routing, original against un-scrambled
    experts: list[ExpertBlock] = field(default_factory=list)  # (verify.expert_blocks.diagnose)

    @property
    def non_finite(self) -> list[str]:
        return [t.name for t in self.tensors if not t.finite]

    @property
    def floored(self) -> dict[str, str]:
        return {t.name: t.floor_reason for t in self.tensors if t.floor_reason}


@dataclass
class ControlResult:
    symmetry: str
    name: str
    description: str
    broken: bool
    max_rel_error: float
    measured_on: str = "every traced tensor"  # or the one early activation that already showed the break
    # False when this checkpoint cannot tell the control from the symmetry: what it gets wrong acts on tensors that
    # are uniform here (a norm at init), so its element is itself a symmetry of this checkpoint (see explain_unbroken)
    informative: bool = True
    note: str = ""
    experts: list[ExpertBlock] = field(default_factory=list)  # a mixture of experts' own control: where it broke

    @property
    def holds(self) -> bool:
        """What a report requires of a control: it breaks, or this checkpoint cannot tell it apart (and says why)."""
        return self.broken or not self.informative


@dataclass
class NotSymmetry:
    """A symmetry the architecture does not have, with the measured break of its standard element."""

    symmetry: str
    reason: str
    max_rel_error: float

    @property
    def broken(self) -> bool:  # the evidence: without a break the claim "does not hold" is unproven
        return self.max_rel_error > BROKEN_AT


@dataclass
class Report:
    model: str
    family: str
    dtype: str
    keys: dict[str, int] = field(default_factory=dict)  # the key of each symmetry checked
    checks: list[CheckResult] = field(default_factory=list)
    controls: list[ControlResult] = field(default_factory=list)
    not_symmetries: list[NotSymmetry] = field(default_factory=list)
    restricted: dict[str, str] = field(default_factory=dict)  # symmetry -> the restricted form checked, and why
    # symmetry -> why the architecture has nothing it acts on (experts on a dense model): named, left out of the verdict
    not_applicable: dict[str, str] = field(default_factory=dict)
    oracle: OracleResult | None = None  # the original run against transformers' own forward (oracle.py)
    # Wall seconds of each part (original, oracle, checks, controls, not_symmetries); not part of the verdict
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return ((bool(self.checks) or bool(self.not_symmetries)) and all(c.passed for c in self.checks)
                and (self.oracle is None or self.oracle.passed)
                and all(c.holds for c in self.controls) and all(n.broken for n in self.not_symmetries))

    def to_json(self) -> dict:
        """Strict JSON: non-finite numbers are written as the strings "nan", "inf", "-inf"."""
        checks = []
        for c in self.checks:
            entry = {k: v for k, v in asdict(c).items() if k not in ("tensors", "experts") or (k == "experts" and v)}
            entry["non_finite"] = c.non_finite
            entry["floored"] = c.floored
            entry["tensors"] = [tensor_entry(t) for t in c.tensors]
            checks.append(entry)
        controls = [{k: v for k, v in asdict(c).items() if k != "description" and (k not in ("note", "experts") or v)}
                    for c in self.controls]
        not_symmetries = [{**asdict(n), "broken": n.broken} for n in self.not_symmetries]
        return json_safe({"schema_version": SCHEMA_VERSION, "model": self.model, "family": self.family,
                          "dtype": self.dtype, "keys": self.keys,
                          "passed": self.passed, "checks": checks, "controls": controls,
                          "not_symmetries": not_symmetries, "restricted": self.restricted,
                          **({"not_applicable": self.not_applicable} if self.not_applicable else {}),
                          "oracle": None if self.oracle is None else {**asdict(self.oracle),
                                                                      "passed": self.oracle.passed}})
