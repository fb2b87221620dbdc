"""Round-off allowances of a streamed check, stage by stage: the streamed Subject.roundoff and
Subject._scrambled_roundoff of verify.check, judged by the same rules (tolerances.judged).

A stage with a tensor over its dtype's base tolerance (only then: it costs a rerun) is run again in the other dtype
(float32 for a float64 check, float64 for a float32 one): the stock stage on the original's own input there and,
backward, on the original's gradient at its output, both cast, with the original weights cast. Each tensor's
distance between the two runs (relative, as tolerances.measure_roundoff takes it) is that stage's allowance. Where
some tensor still fails with it, the element's own transformed stage is measured too, rerun in the other dtype and
un-scrambled against the checked-dtype transformed run (a permutation reorders sums, so it can round more than the
original), and the larger of the two is taken.

Why this is sound: each stage is checked locally, on the original's exact input (and output gradient) there, so all
that a stage's comparison can hold besides a real break is that stage's own round-off on that same input, which is
what is measured; nothing upstream accumulates into it. The allowance is capped as the whole-model one is
(tolerances.FLOAT64_ROUNDOFF_CAP, ROUNDOFF_CAP): a spec bug's O(1) error is never allowed.

Scales: a distance is taken over the original run's scale of the tensor (float32's floor for exact zeros, as
measure_roundoff does), the float64 side's own for a float64 check, within float32's round-off of it for a float32 one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from perm_core.engine.spec import Scramble
from perm_core.engine.tokens import model_inputs
from perm_core.stream.tally import Scales, Tally
from perm_core.verify.tolerances import TensorError, judged, judged_with_roundoff


class Allowances:
    """The round-off measured at the stages that needed it: the original's (`roundoff`) and each element's own
    (`own`), and a record of where (`used`)."""

    def __init__(self, model, inputs: dict, elements: dict, floor_reasons: dict[str, str],
                 make_element: Callable):
        """make_element(model, inputs, scramble): an element's stages for a model (stream.reverse.Element, passed
        in: reverse runs the stages this module measures, so it cannot be imported from here)."""
        self.model, self.inputs, self.elements, self.floor_reasons = model, inputs, elements, floor_reasons
        self.make_element = make_element
        self.dtype = model.dtype
        self.other = torch.float32 if self.dtype == torch.float64 else torch.float64
        self.enabled = self.dtype in (torch.float32, torch.float64)
        self.roundoff: dict[str, float] = {}
        self.own: dict[str, dict[str, float]] = {label: {} for label in elements}
        self.used: list[dict] = []
        self.measured: set[str] = set()  # the tensors of every stage whose round-off was measured
        self._other_model = None
        self._other_elements: dict = {}
        self._original_kwargs: list[dict] | None = None

    # --- the other dtype's stages, built when first needed ---

    @property
    def other_model(self):
        if self._other_model is None:  # the same class (one stack's stages, or an encoder-decoder's)
            m = self.model
            self._other_model = type(m)(m.reader.directory, self.other, m.reader)
        return self._other_model

    @property
    def original_inputs(self) -> dict:
        """The original's model inputs in the other dtype."""
        return model_inputs(self.inputs, self.other_model.geometry, Scramble(), self.other)

    @property
    def original_kwargs(self) -> list[dict]:
        """What each original block is given besides its input, in the other dtype."""
        if self._original_kwargs is None:
            self._original_kwargs = self.other_model.layer_kwargs(self.original_inputs)
        return self._original_kwargs

    def other_element(self, label: str):
        """The element `label` for the other dtype's stages."""
        if label not in self._other_elements:
            self._other_elements[label] = self.make_element(self.other_model, self.inputs,
                                                            self.elements[label].scramble)
        return self._other_elements[label]

    # --- verdicts ---

    def over(self, scales: Scales, label: str, names, roundoff: dict[str, float] | None = None) -> list[str]:
        """The tensors among `names` of element `label` over their tolerance (with `roundoff`, if given), by the
        scales known so far: a floor's only grows later, so this over-reports, never under-reports."""
        names = set(names)
        differences = {n: d for n, d in self.elements[label].tally.differences(
            scales.final(self.floor_reasons, self.dtype)).items() if n in names}
        return [e.name for e in judged(differences, self.dtype, self.floor_reasons, roundoff)
                if e.finite and not e.passed]

    def measure(self, where: str, names: list[str], scales: Scales, original: Callable[[], Tally],
                element: Callable[[str], Tally], between: Callable[[], None] = lambda: None) -> None:
        """At a stage whose tensors are `names`: if some element has one over its base tolerance, measure the
        original stage's round-off (`original()`: the distances of its rerun in the other dtype), then `between()`
        (what the stage may drop by then), then for each element still over, its own (`element(label)`)."""
        if not self.enabled:
            return
        over = {label: self.over(scales, label, names) for label in self.elements}
        if not any(over.values()):
            return
        _merge(self.roundoff, self._relative(original(), scales))
        between()
        self.measured.update(names)
        record = {"stage": where, "over_base_tolerance": sorted({n for found in over.values() for n in found}),
                  "measured": ["original"]}
        for label in self.elements:
            if over[label] and self.over(scales, label, names, self.roundoff):
                _merge(self.own[label], self._relative(element(label), scales))
                record["measured"].append(label)
        self.used.append(record)

    def _relative(self, tally: Tally, scales: Scales) -> dict[str, float]:
        """measure_roundoff's relative distances: max |a - b| over float32's floor scale of each tensor."""
        scale = scales.final(self.floor_reasons, torch.float32)
        return {n: rel if finite else math.inf for n, (_, rel, finite) in tally.differences(scale).items()}

    def judged(self, label: str, differences: dict) -> list[TensorError]:
        """Subject.errors' verdicts by the same rule (tolerances.judged_with_roundoff), with the stages' measured
        round-off: the original's, and the element's own where it was measured."""
        return judged_with_roundoff(differences, self.dtype, self.floor_reasons,
                                    (lambda: self.roundoff) if self.enabled else None,
                                    lambda: self.own.get(label, {}))


def _merge(found: dict[str, float], more: dict[str, float]) -> None:
    """A tensor compared at two stages (a tied token table's gradient, at the head and at the embedding) keeps the
    larger of its two measured round-offs (a non-finite one is inf already)."""
    for name, value in more.items():
        found[name] = value if not value <= found.get(name, value) else found.get(name, value)
