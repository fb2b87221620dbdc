"""The experts of a mixture-of-experts layer: their reordering (the `experts` symmetry), each expert's own neuron
permutation (the `mlp` symmetry inside the experts), and the near misses of both.

The spaces (perm_core.engine.spec): ("experts", layer) is the expert axis, the router's rows and biases;
("expert_mlp", layer) is every expert's hidden neurons as one space of n_experts x d_expert, expert-major (a fused
expert tensor's expert and neuron axes, spec.Merged). Reordering the experts by pi is then one gather of each space:
router row e' = old row pi[e'], and the neurons of new expert e' are those of old expert pi[e'], in their order.
A shared expert (Qwen2-MoE) is no routed expert: it has no router row and the experts never move it; `mlp` permutes
its neurons as a dense MLP's ("mlp", layer).

The router's translation (`router_shift`): one vector v added to every router row and one number c to every router
bias of a layer, ("router_shift", layer) a transforms.Translation. Every expert's logit of a token x then moves by
the same v.x + c: Mixtral's, Qwen's and OLMoE's softmax over the experts, and gpt-oss's top k of the logits and its
softmax over those k, read only the logits' differences, so every token chooses the same experts with the same
weights. One row shifted alone (its negative control) moves one expert's logit against the others.
"""

from __future__ import annotations

import torch

from perm_core.engine import keys
from perm_core.engine.spec import Scramble
from perm_core.engine.transforms import Permutation, Translation

EXPERT_TAGS = frozenset({"experts.gate_up", "experts.down"})  # every tensor of the routed experts, biases included


def expert_order(key: int, g, layer: int) -> torch.Tensor:
    return keys.permutation(key, g.n_experts, f"experts/{layer}")


def experts(key: int, g) -> Scramble:
    """Each MoE layer's experts reordered by its own permutation, router rows and biases with them."""
    spaces = {}
    for layer in g.moe_layers:
        order = expert_order(key, g, layer)
        neurons = (order[:, None] * g.d_expert + torch.arange(g.d_expert)).flatten()
        spaces[("experts", layer)] = (Permutation(order),)
        spaces[("expert_mlp", layer)] = (Permutation(neurons),)
    return Scramble(spaces)


def expert_neurons(key: int, g, layer: int) -> dict:
    """The `mlp` symmetry inside the experts of one layer: every expert its own permutation of its neurons, the
    experts in place ({} without experts)."""
    if layer not in g.moe_layers:
        return {}
    perms = keys.permutations(key, g.n_experts, g.d_expert, f"mlp/{layer}/experts")
    index = (torch.arange(g.n_experts)[:, None] * g.d_expert + perms).flatten()
    return {"expert_mlp": (Permutation(index),)}


def router_shift(key: int, g, alone: bool = False) -> Scramble:
    """Each MoE layer's router translated by its own (v, c) drawn from the key: v with entries of variance
    1 / d_model (v.x about the size of x's entries), c a standard normal; alone: added to expert 0's row only."""
    spaces = {}
    for layer in g.moe_layers:
        drawn = torch.from_numpy(keys.rng_for(key, f"router_shift/{layer}").standard_normal(g.d_model + 1))
        rows = torch.eye(g.n_experts, dtype=torch.float64)[0] if alone else torch.ones(g.n_experts, dtype=torch.float64)
        spaces[("router_shift", layer)] = (Translation(rows, drawn[:-1] / g.d_model**0.5, drawn[-1]),)
    return Scramble(spaces)


def _interleaving_ignored(element: Scramble, g) -> Scramble:
    """The element with each fused gate|up axis permuted as if gate and up were two halves [gate | up] (they
    alternate, gpt-oss): every expert's neuron permutation moves columns of both halves across gate and up.

    The fused axis is transformed whole first (Concat.whole), then part by part as the element says; the whole
    gather w is chosen so that the two together are the halves' gather b: x[w[q]] = x[b] for w = b[q^-1], q being
    the parts' gather laid back on the interleaved axis (new (e, i, h) <- old 2 * index[e, i] + h)."""
    spaces = dict(element.spaces)
    i_size = g.d_expert
    for layer in g.moe_layers:
        index = spaces[("expert_mlp", layer)][0].index
        q = (2 * index[:, None] + torch.arange(2)).flatten()
        expert, neuron = index // i_size, index % i_size  # old (expert, neuron) of each new flat (e, i)
        halves = torch.arange(2)[None, :] * i_size  # gate half, up half
        b = (expert[:, None] * 2 * i_size + halves + neuron[:, None])  # [E * I, 2]: old flat, new (e, h, i)
        b = b.view(g.n_experts, i_size, 2).transpose(1, 2).flatten()
        spaces[("expert_gate_up", layer)] = (Permutation(b[torch.argsort(q)]),)
    return Scramble(spaces)


def controls(name: str, key: int, g, element, control) -> list:
    """Near misses of `experts` and of `mlp` inside the experts (none without experts); element() is the symmetry's
    own element, control(name, description, make) one Control."""
    if not g.n_experts:
        return []
    if name == "router_shift":
        return [control("one_row_shifted", "one router row (and its bias) translated alone, the others not",
                        lambda: router_shift(key, g, alone=True))]
    if name == "experts":
        return [control("router_not_permuted", "experts reordered, their router rows and biases not",
                        lambda: element().with_controls(skip_tags=frozenset({"router"}))),
                control("router_alone", "router rows and biases reordered, the experts not",
                        lambda: element().with_controls(skip_tags=EXPERT_TAGS))]
    found = [control("expert_down_not_permuted", "each expert's neurons permuted in gate|up, not in down",
                     lambda: element().with_controls(skip_tags=frozenset({"experts.down"})))]
    if g.experts_interleaved:
        found.append(control("interleaving_ignored", "gate|up permuted as two halves, not as alternating columns",
                             lambda: _interleaving_ignored(element(), g)))
    return found


def key_space_bits(name: str, g) -> float:
    if name == "router_shift":  # continuous, as rotations are
        return float("inf") if g.n_experts else 0.0
    if name == "experts":
        return len(g.moe_layers) * keys.permutation_bits(g.n_experts) if g.n_experts else 0.0
    return len(g.moe_layers) * g.n_experts * keys.permutation_bits(g.d_expert)  # mlp inside the experts
