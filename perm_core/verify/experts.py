"""Which expert holds a check's error, where a compared tensor's first axis is a layer's experts: the gradients of
the fused expert weights and biases (gate_up_proj, down_proj: [E, ...]) and of the router's rows and bias ([E, H],
[E]). Each such tensor gets its error per expert: each expert's largest |un-scrambled - original| over the tensor's
own scale, so the largest of them is the tensor's max_rel_error.

These say how far a break spread, not where it began: it spreads through the backward pass to every expert whose
gradient it changed. Measured with one expert of block 0 broken (gate|up permuted, down not), on random:mixtral,
gpt_oss and qwen3_moe, each expert in turn (11 breaks; qwen3_moe's expert 0 sees no token there): the broken
expert's gradient was the worst in 24 of the block's 45 expert tensors. Where it began is
verify.expert_blocks' diagnosis, run on the forward: it named the broken expert alone in each of 8 such breaks
(tests/unit/test_check_experts.py plants two).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from perm_core.engine.moe import EXPERT_TAGS
from perm_core.run import trace_names
from perm_core.verify.tolerances import TensorError, relative

EXPERT_AXIS_TAGS = EXPERT_TAGS | {"router"}  # every tensor whose axis 0 is the experts (families/experts.py)


def expert_tensors(subject) -> frozenset[str]:
    """The trace names of the gradients whose axis 0 is a layer's experts ({} for a dense model)."""
    return frozenset(trace_names.param_grad(name) for name, claim in subject.claims.items()
                     if claim.rule.tag in EXPERT_AXIS_TAGS)


def largest_per_expert(reference: torch.Tensor, restored: torch.Tensor) -> torch.Tensor:
    """Each expert's max |restored - reference| over its slice (axis 0); NaN where its slice is not finite."""
    return (restored - reference).abs().reshape(reference.shape[0], -1).amax(dim=1)


def per_expert(reference: torch.Tensor, restored: torch.Tensor, scale: float) -> tuple[float, ...]:
    """Each expert's relative error: its slice's max |restored - reference| over the whole tensor's scale."""
    return tuple(relative(diff, scale)[1] for diff in largest_per_expert(reference, restored).tolist())


def measured(names, original: dict, restored, scale: dict[str, float]) -> dict[str, tuple[float, ...]]:
    """per_expert of each of `names` that both sides hold (`restored` may build each tensor when asked)."""
    found = {}
    for name in names:
        if name in original and name in restored:
            found[name] = per_expert(getattr(original[name], "tensor", original[name]), restored[name], scale[name])
    return found


def with_expert_errors(errors: list[TensorError], per: dict[str, tuple[float, ...]]) -> list[TensorError]:
    return [replace(e, expert_errors=per[e.name]) if e.name in per else e for e in errors]


def expert_columns(error: TensorError, tensors: list[TensorError]) -> dict:
    """A per-tensor table's expert columns for one row: none where no tensor of the table has experts (a dense
    model's table stays as it was), empty cells for the tensors without them."""
    if not any(t.expert_errors for t in tensors):
        return {}
    if not error.expert_errors:
        return {"worst expert": None, "experts over tolerance": ""}
    return {"worst expert": error.worst_expert,
            "experts over tolerance": f"{error.experts_over_tolerance} of {len(error.expert_errors)}"}
