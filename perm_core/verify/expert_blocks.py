"""The mixture-of-experts blocks of a run, as their experts module saw them, and where a failing check's break in
them began.

Every MoE family transformers 5.23 has (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss) calls its routed experts as
experts(hidden [N, H], top_k_index [N, k], top_k_weights [N, k]); a pre-hook on that module
(capture.recording_calls) records those arguments: the routers' own choices, read, not recomputed. MoE blocks run
eagerly (perm_core.fast.graph_forward refuses them), so the hook sees every call.

diagnose: each block's experts run on the block's recorded input, every token sent to one expert with weight 1, by
the block's own experts module; each expert's un-scrambled output against the original's, and the tokens whose
router chose other experts. In the first block where something breaks the inputs still agree, so the experts over
tolerance there are the ones that broke; tokens rerouted while every expert is exact name the router.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from perm_core.engine.spec import Scramble, apply_axes
from perm_core.engine.transforms import Permutation
from perm_core.run import capture
from perm_core.run.stateless import functional_call

# The negative controls of the experts, of mlp inside them and of the router's translation (perm_core.engine.moe.
# controls): a report says where in the experts each of them broke
MOE_CONTROLS = frozenset({"router_not_permuted", "router_alone", "expert_down_not_permuted", "interleaving_ignored",
                          "one_row_shifted"})


def experts_modules(subject) -> dict[int, str]:
    """MoE block -> the module of its routed experts (the one holding gate_up_proj); {} for a dense model."""
    return {claim.layer: name.rsplit(".", 1)[0] for name, claim in subject.claims.items()
            if claim.rule.tag == "experts.gate_up" and claim.layer in subject.geometry.moe_layers}


@contextmanager
def recording_experts(subject):
    """Yields {block: (hidden [N, H], chosen experts [N, k], their weights [N, k])}, filled once the forward inside
    has run."""
    modules = experts_modules(subject)
    calls: dict[int, tuple] = {}
    if not modules:
        yield calls
        return
    with capture.recording_calls(subject.model, modules.values()) as boxes:
        yield calls
    for layer, name in modules.items():
        args = boxes[name].get("args")
        if args is None:
            continue
        if len(args) < 3 or args[1].is_floating_point():
            raise RuntimeError(f"{name} was not called as experts(hidden, top_k_index, top_k_weights)")
        calls[layer] = args[:3]


def choice_maps(index: torch.Tensor, weights: torch.Tensor, n_tokens: int, n_experts: int):
    """([B, T, E] 1 where the token chose the expert, [B, T, E] its weight there), 0 elsewhere, in float64 on the CPU
    (a few numbers a token, wherever the model ran: MPS has no float64)."""
    shape = (index.shape[0] // n_tokens, n_tokens, n_experts)
    index = index.cpu()
    flat = torch.zeros(index.shape[0], n_experts, dtype=torch.float64)
    return flat.scatter(1, index, 1.0).reshape(shape), flat.scatter(1, index, weights.cpu().double()).reshape(shape)


def expert_order(scramble: Scramble, layer: int, n_experts: int) -> list[int]:
    """Scrambled expert e is original expert order[e] (the identity where the element does not reorder them)."""
    chain = scramble.chain("experts", layer)
    if len(chain) == 1 and isinstance(chain[0], Permutation):
        return chain[0].index.tolist()
    return list(range(n_experts))


@dataclass(frozen=True)
class ExpertBlock:
    """One MoE block of a failing check, original against un-scrambled."""

    layer: int
    expert_errors: list[float]  # each expert (original numbering) on every token: max |difference| / max |original|
    experts_over_tolerance: list[int]
    tokens_rerouted: int  # tokens whose un-scrambled choice of experts is not the original's
    n_tokens: int


def _each_expert(module, params: dict, prefix: str, hidden: torch.Tensor, expert: int) -> torch.Tensor:
    own = {name: params[prefix + name] for name, _ in module.named_parameters()}
    index = torch.full((hidden.shape[0], 1), expert, dtype=torch.long, device=hidden.device)
    with torch.no_grad():
        return functional_call(module, own, args=(hidden, index, torch.ones(index.shape, dtype=hidden.dtype,
                                                                            device=hidden.device)))


def diagnose(subject, scramble: Scramble, params: dict, tolerance: float) -> list[ExpertBlock]:
    """Each MoE block of the original run and of the run of `params` under `scramble`, compared (module docstring);
    [] for a dense model. Two forwards and two calls of each expert per block: only a failing check asks."""
    modules = experts_modules(subject)
    if not modules:
        return []
    with recording_experts(subject) as original:
        subject.trace()
    with recording_experts(subject) as scrambled:
        subject.trace(scramble, params=params)
    inverse, g = scramble.inverse(), subject.geometry
    blocks = []
    for layer in sorted(set(original) & set(scrambled)):
        module, prefix = subject.model.get_submodule(modules[layer]), modules[layer] + "."
        order = expert_order(scramble, layer, g.n_experts)
        errors = []
        for scrambled_expert, expert in enumerate(order):
            mine = _each_expert(module, subject.params, prefix, original[layer][0], expert)
            theirs = _each_expert(module, params, prefix, scrambled[layer][0], scrambled_expert)
            back = apply_axes(theirs.reshape(-1, subject.n_tokens, theirs.shape[-1]), (None, "tokens", "resid"),
                              inverse, layer)
            scale = mine.abs().max().item()
            errors.append((back.reshape(mine.shape) - mine).abs().max().item() / scale if scale > 0 else 0.0)
        errors = [errors[order.index(e)] for e in range(g.n_experts)]  # original numbering
        chosen = choice_maps(*original[layer][1:], subject.n_tokens, g.n_experts)[0]
        moved_back = apply_axes(choice_maps(*scrambled[layer][1:], subject.n_tokens, g.n_experts)[0],
                                (None, "tokens", ("experts", layer)), inverse, layer)
        rerouted = int((moved_back != chosen).any(dim=-1).sum())
        blocks.append(ExpertBlock(layer, errors, [e for e, err in enumerate(errors) if not err <= tolerance],
                                  rerouted, chosen.shape[0] * chosen.shape[1]))
    return blocks


def block_notes(blocks: list[ExpertBlock], most: int = 3) -> list[str]:
    """The first `most` blocks where an expert or the routing breaks, in words (the first is where it began)."""
    notes = []
    for block in blocks:
        if not block.experts_over_tolerance and not block.tokens_rerouted:
            continue
        over = ", ".join(f"{e} ({block.expert_errors[e]:.1e})" for e in block.experts_over_tolerance)
        notes.append(f"block {block.layer}'s experts, each on every token: "
                     + (f"{len(block.experts_over_tolerance)} of {len(block.expert_errors)} differ, "
                        f"expert{'s' if len(block.experts_over_tolerance) > 1 else ''} {over}"
                        if over else f"all {len(block.expert_errors)} exact")
                     + f"; {block.tokens_rerouted} of {block.n_tokens} tokens chose other experts")
    return notes[:most]
