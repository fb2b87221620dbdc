"""Explore's routing view of a mixture-of-experts block (perm_core.explore.routing): the experts each token chose,
as the model's own routers gave them, in float64. Scrambled, each token's choice is the original's moved by the
keys, checked here against the keys' own permutations (not the view's); un-scrambled, every token chose exactly the
original's experts with the original's weights. The negative control (experts reordered, their router rows not)
shows choices that do not come back; a dense model has no routing view."""

import pytest
import torch

from perm_core.engine import moe, symmetries
from perm_core.explore.exploration import Exploration
from perm_core.explore.page_data import PageChoice, block_views
from perm_core.explore.routing import choice_sentences, routing_view, weight_sentences
from perm_core.models.random_models import build_random_model, random_inputs

pytestmark = pytest.mark.usefixtures("one_thread")

KEYS = {"tokens": 5, "channels": 2, "mlp": 3, "experts": 7}
EXACT = 1e-12  # float64 routing weights un-scrambled: measured at or below 1e-15


def explorer_of(family: str) -> Exploration:
    model = build_random_model(family, dtype=torch.float64, seed=3)[0]
    return Exploration(model, random_inputs(family, model, seed=3))


@pytest.fixture(scope="module", params=["mixtral", "gpt_oss", "qwen2_moe"])
def explorer(request):
    return explorer_of(request.param)


def choices(index: torch.Tensor) -> list[set[int]]:
    return [set(row) for row in index.tolist()]


def moved_by_keys(explorer, layer: int, scrambled: torch.Tensor) -> list[set[int]]:
    """The scrambled run's choices in original tokens and expert numbers, from the keys alone: scrambled position p
    holds original token tokens[p], scrambled expert e is original expert order[e] (perm_core.engine.moe)."""
    tokens = symmetries.build("tokens", KEYS["tokens"], explorer.geometry, explorer.n_tokens).tokens.index.tolist()
    order = moe.expert_order(KEYS["experts"], explorer.geometry, layer).tolist()
    back = [set()] * len(tokens)
    for position, row in enumerate(choices(scrambled)):
        back[tokens[position]] = {order[e] for e in row}
    return back


def test_scrambled_choices_are_the_keys_permutation_and_come_back_exactly(explorer):
    result = explorer.run(KEYS)
    assert result.passed
    layers = explorer.geometry.moe_layers
    assert layers and set(result.routing) == set(explorer.original_routing) == set(layers)
    for layer in layers:
        original = choices(explorer.original_routing[layer][0])
        assert moved_by_keys(explorer, layer, result.routing[layer][0]) == original
        view = routing_view(explorer, result, layer)
        n = explorer.n_tokens
        assert view.chosen[0].sum().item() == n * view.top_k == 2 * n  # two experts a token, four in all
        assert view.as_expected == view.came_back == n
        assert torch.equal(view.chosen[2], view.chosen[0])
        assert view.weights_error <= EXACT
        assert view.differ_in_place > 0 and view.weights_moved > 0.1  # the keys moved the choices
        assert view.expert_order == moe.expert_order(KEYS["experts"], explorer.geometry, layer).tolist() != [0, 1, 2, 3]


def test_experts_reordered_without_their_router_rows_do_not_come_back(explorer):
    """The negative control: the routers still choose by their old rows, so the choices moved back by the experts
    key land on other experts."""
    result = explorer.run(KEYS, control="experts/router_not_permuted")
    for layer in explorer.geometry.moe_layers:
        original = choices(explorer.original_routing[layer][0])
        assert moved_by_keys(explorer, layer, result.routing[layer][0]) != original
        view = routing_view(explorer, result, layer)
        assert view.came_back < explorer.n_tokens and view.as_expected < explorer.n_tokens
        assert view.weights_error > 0.1


def test_the_router_translation_changes_no_choice():
    """router_shift adds one v.x + c to every expert's logit of a token: gpt-oss (a router with a bias) chooses the
    same experts, in place, with the same weights."""
    explorer = explorer_of("gpt_oss")
    result = explorer.run({"router_shift": 9})
    for layer in explorer.geometry.moe_layers:
        view = routing_view(explorer, result, layer)
        assert view.differ_in_place == 0 and view.came_back == explorer.n_tokens
        assert view.weights_error <= EXACT and view.weights_moved <= EXACT


def test_the_sentences_say_the_views_numbers():
    explorer = explorer_of("mixtral")
    result = explorer.run(KEYS, control="experts/router_not_permuted")
    view = routing_view(explorer, result, 1)
    n = explorer.n_tokens
    first, second, third = choice_sentences(view)
    counts = view.chosen[0].sum(dim=0)
    assert f"expert {int(counts.argmax())} was chosen most, by {int(counts.max())} tokens" in first
    assert f"{view.as_expected} of {n} tokens chose the original's experts so moved" in second
    assert third == f"{view.came_back} of {n} tokens chose the same experts as the original after un-scrambling."
    assert view.came_back < n
    assert f"by at most {view.weights_error:.1e}" in weight_sentences(view)[2]


def test_a_dense_model_has_no_routing_view():
    model = build_random_model("llama", dtype=torch.float64, seed=3)[0]
    explorer = Exploration(model, random_inputs("llama", model, seed=3))
    result = explorer.run({"tokens": 5})
    assert explorer.original_routing == {} and result.routing == {}
    assert routing_view(explorer, result, 0) is None
    block = block_views(explorer, result, PageChoice(0, 0, None), None, explorer.subject.inputs, {"tokens": 5}, None)
    assert block.routing is None


def test_the_sentence_counts_the_tokens_and_experts_the_keys_moved():
    """How many tokens and experts the sentence says the keys moved, against the keys' own permutations: none with
    the token and experts keys off, and with them on the number of places each permutation changes."""
    explorer = explorer_of("mixtral")
    still = choice_sentences(routing_view(explorer, explorer.run({"channels": 2}), 1))[1]
    assert still.startswith("The token key moved 0 of 12 tokens and the experts key is off, so the expert numbers")
    view = routing_view(explorer, explorer.run(KEYS), 1)
    tokens = symmetries.build("tokens", KEYS["tokens"], explorer.geometry, explorer.n_tokens).tokens.index
    order = moe.expert_order(KEYS["experts"], explorer.geometry, 1)
    moved_tokens = int((tokens != torch.arange(len(tokens))).sum())
    moved_experts = int((order != torch.arange(len(order))).sum())
    assert 0 < moved_tokens and 0 < moved_experts
    assert choice_sentences(view)[1].startswith(
        f"The token key moved {moved_tokens} of 12 tokens and the experts key relabelled {moved_experts} of 4 experts")


def test_the_take_home_summary_has_each_blocks_routing_numbers():
    """Explore's Markdown summary of a mixture of experts: one row per MoE block with the views' own counts, which
    the negative control lowers; a dense model's summary has no such section."""
    import re

    from perm_core.explore.page_data import _proof_rows
    from perm_core.explore.routing import routing_views
    from ui.summary import explore_summary

    explorer = explorer_of("mixtral")
    for control in (None, "experts/router_not_permuted"):
        result = explorer.run(KEYS, control=control)
        views = routing_views(explorer, result)
        assert [v.layer for v in views] == list(explorer.geometry.moe_layers) == [0, 1]
        text = explore_summary("random:mixtral", "ids", "keys", result, result.verdict(),
                               _proof_rows(explorer, result), "python -m perm_core check random:mixtral", views)
        rows = re.findall(r"^\| (\d) \| (\d+) of 12 \| (\d+) of 12 \| ([\d.e+-]+) \|$", text, re.M)
        assert [(int(r[0]), int(r[1]), int(r[2])) for r in rows] == [(v.layer, v.as_expected, v.came_back)
                                                                       for v in views]
        assert [float(r[3]) for r in rows] == [float(f"{v.weights_error:.1e}") for v in views]
        came_back = [v.came_back for v in views]
        assert came_back == [12, 12] if control is None else min(came_back) < 12
    dense = build_random_model("llama", dtype=torch.float64, seed=3)[0]
    explorer_of_dense = Exploration(dense, random_inputs("llama", dense, seed=3))
    result = explorer_of_dense.run({"tokens": 5})
    assert routing_views(explorer_of_dense, result) == []
    assert "Experts chosen" not in explore_summary("random:llama", "ids", "keys", result, result.verdict(),
                                                   _proof_rows(explorer_of_dense, result), "cmd")
