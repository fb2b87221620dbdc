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

from perm_core.verify import experts
from perm_core.verify.tolerances import floored, largest_magnitude, relative, relative_differences, worst


class Scales:
    """The original run's scale of each traced tensor: its largest |value| over every piece seen."""

    def __init__(self):
        self.own: dict[str, float] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        found = largest_magnitude(tensor.detach())
        self.own[name] = worst((self.own.get(name, 0.0), found))  # a NaN anywhere: the whole is non-finite

    def final(self, floor_reasons: dict[str, str], dtype: torch.dtype) -> dict[str, float]:
        """tolerances.scales' rule (tolerances.floored) on the scales over every piece."""
        return floored(self.own, floor_reasons, dtype)


class Tally:
    """One element's max |a - b| of each traced tensor, over every piece compared; of each tensor named in
    `per_expert` (whose axis 0 is a layer's experts: verify.experts), also each expert's."""

    def __init__(self, per_expert: frozenset[str] = frozenset()):
        self.diffs: dict[str, float] = {}
        self.per_expert, self.expert_diffs = per_expert, {}

    def add(self, name: str, reference: torch.Tensor, restored: torch.Tensor) -> float:
        """Compare one piece; returns its max |a - b| (inf if non-finite or of another shape)."""
        found = relative_differences({name: reference.detach()}, {name: restored.detach()}, {name: 1.0}).get(name)
        diff = found[0] if found is not None and found[2] else math.inf
        self.diffs[name] = worst((self.diffs.get(name, 0.0), diff))
        if name in self.per_expert and reference.shape == restored.shape:
            each = [worst((d,)) for d in experts.largest_per_expert(reference.detach(), restored.detach()).tolist()]
            kept = self.expert_diffs.get(name, [0.0] * len(each))
            self.expert_diffs[name] = [worst(pair) for pair in zip(kept, each, strict=True)]
        return diff

    def differences(self, scale: dict[str, float]) -> dict[str, tuple[float, float, bool]]:
        """name -> (max abs difference, relative difference, finite), as tolerances.relative_differences gives."""
        return {name: relative(diff, scale.get(name, math.nan)) for name, diff in self.diffs.items()}

    def expert_errors(self, scale: dict[str, float]) -> dict[str, tuple[float, ...]]:
        """Each per-expert tensor's error per expert, on the tensor's own scale (verify.experts.per_expert's)."""
        return {name: tuple(relative(d, scale.get(name, math.nan))[1] for d in diffs)
                for name, diffs in self.expert_diffs.items()}
