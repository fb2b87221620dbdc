"""Which experts each token chose in one mixture-of-experts block: original, scrambled and un-scrambled.

Read, not recomputed: the arguments each block's routed experts were called with, recorded in the run that computes
everything else (perm_core.verify.expert_blocks.recording_experts): the routers' own choices and weights.

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
from perm_core.verify.expert_blocks import choice_maps, expert_order, recording_experts


@contextmanager
def recording_routing(subject):
    """Yields {block: (chosen experts [N, k], their weights [N, k])}, filled once the forward inside has run."""
    routing: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    with recording_experts(subject) as calls:
        yield routing
    routing.update({layer: args[1:] for layer, args in calls.items()})


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


def routing_view(explorer, result, layer: int) -> RoutingView | None:
    """The chosen block's routing, original | scrambled | un-scrambled (batch row 0); None for a block without
    experts or a run that recorded none."""
    if layer not in explorer.original_routing or layer not in result.routing:
        return None
    n_tokens, n_experts = explorer.n_tokens, explorer.geometry.n_experts
    original = choice_maps(*explorer.original_routing[layer], n_tokens, n_experts)
    scrambled = choice_maps(*result.routing[layer], n_tokens, n_experts)
    axes = (None, "tokens", ("experts", layer))
    element = result.scramble

    def moved(tensor, scramble):
        return apply_axes(tensor, axes, scramble, layer)

    chosen = (original[0], scrambled[0], moved(scrambled[0], element.inverse()))
    weights = (original[1], scrambled[1], moved(scrambled[1], element.inverse()))
    tokens = element.tokens.index.tolist() if element.tokens is not None else list(range(n_tokens))
    return RoutingView(layer, result.routing[layer][0].shape[-1], tuple(t[0] for t in chosen),
                       tuple(t[0] for t in weights), moved(original[0], element)[0], tokens,
                       expert_order(element, layer, n_experts))


def routing_views(explorer, result) -> list[RoutingView]:
    """routing_view of every block that recorded its routing, in block order ([] for a dense model)."""
    views = (routing_view(explorer, result, layer) for layer in sorted(explorer.original_routing))
    return [view for view in views if view is not None]


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
