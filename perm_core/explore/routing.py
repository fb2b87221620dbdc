"""Which experts each token chose in one mixture-of-experts block: original, scrambled and un-scrambled.

Read, not recomputed: in every MoE family transformers 5.23 has (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, gpt-oss) the
block calls its routed experts as experts(hidden [N, H], top_k_index [N, k], top_k_weights [N, k]), so a pre-hook on
that module records the router's own choice and weights in the run that computes everything else (MoE blocks run
eagerly: perm_core.fast.graph_forward refuses them, so the hook sees every call).

Each view is a [tokens, experts] map: 1 (chosen) or the routing weight where a token chose an expert, 0 elsewhere.
The scrambled map is what the scrambled model chose, at its own token positions and expert numbers; the element
moves the map's rows by the token key and its columns by the experts key (("experts", layer): scrambled expert e
is original expert order[e], its router row moved there), so `expected` is the original's map moved by the element
and `restored` the scrambled map moved back by its inverse. Both use the element's own permutations: a negative
control that reorders the experts without their router rows makes the scrambled choices differ from `expected`,
and the un-scrambled ones from the original.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from perm_core.engine.spec import apply_axes
from perm_core.engine.transforms import Permutation
from perm_core.run import capture


def experts_modules(subject) -> dict[int, str]:
    """MoE block -> the module of its routed experts (the one holding gate_up_proj); {} for a dense model."""
    return {claim.layer: name.rsplit(".", 1)[0] for name, claim in subject.claims.items()
            if claim.rule.tag == "experts.gate_up" and claim.layer in subject.geometry.moe_layers}


@contextmanager
def recording_routing(subject):
    """Yields {block: (chosen experts [N, k], their weights [N, k])}, filled once the forward inside has run."""
    modules = experts_modules(subject)
    routing: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    if not modules:
        yield routing
        return
    with capture.recording_calls(subject.model, modules.values()) as boxes:
        yield routing
    for layer, name in modules.items():
        args = boxes[name].get("args")
        if args is None:
            continue
        if len(args) < 3 or args[1].is_floating_point():
            raise RuntimeError(f"{name} was not called as experts(hidden, top_k_index, top_k_weights)")
        routing[layer] = (args[1], args[2])


def _maps(index: torch.Tensor, weights: torch.Tensor, n_tokens: int, n_experts: int):
    """([B, T, E] 1 where chosen, [B, T, E] the weight where chosen), 0 elsewhere, in float64."""
    shape = (index.shape[0] // n_tokens, n_tokens, n_experts)
    flat = torch.zeros(index.shape[0], n_experts, dtype=torch.float64)
    chosen = flat.scatter(1, index, 1.0)
    weighted = flat.scatter(1, index, weights.double())
    return chosen.reshape(shape), weighted.reshape(shape)


@dataclass(frozen=True)
class RoutingView:
    layer: int
    top_k: int
    chosen: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # [T, E] 1 where the token chose the expert
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # [T, E] the token's routing weight on the expert
    expected: torch.Tensor  # [T, E] the original's choices moved by the element
    token_order: list[int]  # scrambled position p holds original token token_order[p]
    expert_order: list[int]  # scrambled expert e is original expert expert_order[e]

    @property
    def n_tokens(self) -> int:
        return self.chosen[0].shape[0]

    @property
    def n_experts(self) -> int:
        return self.chosen[0].shape[1]

    def _rows_equal(self, a: torch.Tensor, b: torch.Tensor) -> int:
        return int((a == b).all(dim=1).sum())

    @property
    def as_expected(self) -> int:
        """Tokens whose scrambled choice is the original's moved by the keys."""
        return self._rows_equal(self.chosen[1], self.expected)

    @property
    def came_back(self) -> int:
        """Tokens whose un-scrambled choice is the original's."""
        return self._rows_equal(self.chosen[2], self.chosen[0])

    @property
    def differ_in_place(self) -> int:
        """Rows of the scrambled map that differ from the original's row at the same place."""
        return self.n_tokens - self._rows_equal(self.chosen[1], self.chosen[0])

    @property
    def weights_moved(self) -> float:
        return (self.weights[1] - self.weights[0]).abs().max().item()

    @property
    def weights_error(self) -> float:
        return (self.weights[2] - self.weights[0]).abs().max().item()


def _order(chain, size: int) -> list[int]:
    """The permutation a chain of one Permutation makes (identity where the chain is empty)."""
    perms = [t for t in chain if isinstance(t, Permutation)]
    return perms[-1].index.tolist() if len(perms) == len(chain) == 1 else list(range(size))


def routing_view(explorer, result, layer: int) -> RoutingView | None:
    """The chosen block's routing, original | scrambled | un-scrambled (batch row 0); None for a block without
    experts or a run that recorded none."""
    if layer not in explorer.original_routing or layer not in result.routing:
        return None
    n_tokens, n_experts = explorer.n_tokens, explorer.geometry.n_experts
    original = _maps(*explorer.original_routing[layer], n_tokens, n_experts)
    scrambled = _maps(*result.routing[layer], n_tokens, n_experts)
    axes = (None, "tokens", ("experts", layer))
    element = result.scramble

    def moved(tensor, scramble):
        return apply_axes(tensor, axes, scramble, layer)

    chosen = (original[0], scrambled[0], moved(scrambled[0], element.inverse()))
    weights = (original[1], scrambled[1], moved(scrambled[1], element.inverse()))
    tokens = element.tokens.index.tolist() if element.tokens is not None else list(range(n_tokens))
    return RoutingView(layer, result.routing[layer][0].shape[-1], tuple(t[0] for t in chosen),
                       tuple(t[0] for t in weights), moved(original[0], element)[0], tokens,
                       _order(element.chain("experts", layer), n_experts))


def choice_sentences(view: RoutingView) -> tuple[str, str, str]:
    """What each column of the choice map shows, in numbers read off the maps."""
    t, e, k = view.n_tokens, view.n_experts, view.top_k
    counts = view.chosen[0].sum(dim=0)
    most = int(counts.argmax())
    tokens_moved = sum(p != i for p, i in enumerate(view.token_order))
    experts_moved = sum(s != o for s, o in enumerate(view.expert_order))
    relabel = "the experts key is off, so the expert numbers stay"
    if experts_moved:
        s = next(s for s, o in enumerate(view.expert_order) if s != o)
        relabel = (f"the experts key relabelled {experts_moved} of {e} experts (scrambled expert {s} is original "
                   f"expert {view.expert_order[s]})")
    return (f"Each of the {t} tokens chose {k} of the {e} experts; expert {most} was chosen most, by "
            f"{int(counts[most])} tokens.",
            f"The token key moved {tokens_moved} of {t} tokens and {relabel}: {view.as_expected} of {t} tokens "
            f"chose the original's experts so moved; {view.differ_in_place} of {t} rows differ from the original's "
            "row at the same place.",
            f"{view.came_back} of {t} tokens chose the same experts as the original after un-scrambling.")


def weight_sentences(view: RoutingView) -> tuple[str, str, str]:
    """What each column of the routing-weight map shows, in numbers read off the maps."""
    row_sums = view.weights[0].sum(dim=1)
    low, high = f"{row_sums.min():.3g}", f"{row_sums.max():.3g}"
    return ("The weight each token gives each expert it chose (0 elsewhere); a token's weights sum to "
            + (f"{low}." if low == high else f"{low} to {high}."),
            f"The same weights, tokens and experts moved by the keys: cell by cell they differ from the original's "
            f"by up to {view.weights_moved:.3g}.",
            f"Un-scrambled, they differ from the original's by at most {view.weights_error:.1e}.")
