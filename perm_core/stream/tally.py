"""Differences gathered stage by stage and chunk by chunk, judged at the end by the whole-model check's rules.

A streamed check sees each traced tensor once (a block's output) or in pieces (the logits, the head's gradient,
chunk by chunk); max |a - b| over the whole tensor is the largest over its pieces, and so is its scale, the
original's largest |value|. Only at the end are all scales known, the floors of exact zeros among them, so the
verdicts (tolerances.judged) are taken then, on the same (difference, relative, finite) triples a whole-model
check judges.
"""

from __future__ import annotations

import math

import torch

from perm_core.verify.tolerances import FLOOR, kind_of, largest_magnitude, relative_differences


def _larger(a: float, b: float) -> float:
    """max with NaN counted as +inf (a NaN anywhere makes the whole tensor non-finite)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return max(a, b)


class Scales:
    """The original run's scale of each traced tensor: its largest |value| over every piece seen."""

    def __init__(self):
        self.own: dict[str, float] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        found = largest_magnitude(tensor.detach())
        self.own[name] = _larger(self.own.get(name, 0.0), found if not math.isnan(found) else math.inf)

    def final(self, floor_reasons: dict[str, str], dtype: torch.dtype) -> dict[str, float]:
        """As tolerances.scales: a tensor's own scale, or for an exact zero FLOOR x the largest of its kind."""
        largest: dict[str, float] = {}
        for name, value in self.own.items():
            if math.isfinite(value):
                largest[kind_of(name)] = max(largest.get(kind_of(name), 0.0), value)
        floor = FLOOR.get(dtype, FLOOR[torch.float32])
        return {n: floor * largest.get(kind_of(n), 0.0) if n in floor_reasons else v for n, v in self.own.items()}


class Tally:
    """One element's max |a - b| of each traced tensor, over every piece compared."""

    def __init__(self):
        self.diffs: dict[str, float] = {}

    def add(self, name: str, reference: torch.Tensor, restored: torch.Tensor) -> float:
        """Compare one piece; returns its max |a - b| (inf if non-finite or of another shape)."""
        found = relative_differences({name: reference.detach()}, {name: restored.detach()}, {name: 1.0}).get(name)
        diff = found[0] if found is not None and found[2] else math.inf
        self.diffs[name] = _larger(self.diffs.get(name, 0.0), diff)
        return diff

    def differences(self, scale: dict[str, float]) -> dict[str, tuple[float, float, bool]]:
        """name -> (max abs difference, relative difference, finite), as tolerances.relative_differences gives."""
        found = {}
        for name, diff in self.diffs.items():
            s = scale.get(name, math.nan)
            if not (math.isfinite(diff) and math.isfinite(s)):
                found[name] = (math.inf, math.inf, False)
            else:
                found[name] = (diff, diff / s if s > 0 else (0.0 if diff == 0 else math.inf), True)
        return found

    def worst_relative(self, scale: dict[str, float], floor_reasons: dict[str, str]) -> float:
        """The largest relative difference over tensors judged by their relative error (a NaN counts as inf)."""
        worst = 0.0
        for name, (_, rel, finite) in self.differences(scale).items():
            if name in floor_reasons and finite:
                continue
            worst = _larger(worst, rel)
        return worst
