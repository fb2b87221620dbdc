"""AppTest: Explore on a mixture of experts shows which experts each token chose in the chosen block, original |
scrambled | un-scrambled, and the routing weights beside; each column's sentence says the numbers its chart holds,
and the scrambled chart is the original's moved by the keys' own permutations. A dense model shows no routing."""

import re

import numpy as np

from perm_core.engine import moe, symmetries
from perm_core.families import geometry_of
from perm_core.models.random_models import build_random_model
from tests.app.test_explore import block_views, charts, decode, explore, title

COLUMNS = ("Original", "Scrambled", "Un-scrambled")


def maps(at, what: str) -> dict[str, np.ndarray]:
    return {title(c).split(":")[0]: decode(c["data"][0]["z"]) for c in charts(at) if what in title(c)}


def captions(at) -> list[str]:
    return [c.value for c in at.caption]


def test_mixtral_shows_the_choices_move_with_the_keys_and_come_back():
    at = explore(model="random:mixtral", dtype="float64", on_experts="1", k_experts="7", k_tokens="5", layer="1",
                 block_view="experts")
    assert "Inside block 1" in [s.value for s in at.subheader] and "experts" in block_views(at)
    assert at.button_group(key="block_view").value == "experts"
    chosen, weights = maps(at, "experts chosen, block 1"), maps(at, "routing weights, block 1")
    assert set(chosen) == set(weights) == set(COLUMNS)
    n_tokens, n_experts = chosen["Original"].shape
    assert n_experts == 4 and set(np.unique(chosen["Original"])) == {0.0, 1.0}
    assert (chosen["Original"].sum(axis=1) == 2).all()  # every token chose two experts

    # The scrambled chart is the original's with rows moved by the token key and columns by the experts key
    geometry = geometry_of(build_random_model("mixtral")[0])
    tokens = symmetries.build("tokens", 5, geometry, n_tokens).tokens.index.numpy()
    order = moe.expert_order(7, geometry, 1).numpy()
    assert (chosen["Scrambled"] == chosen["Original"][tokens][:, order]).all()
    assert not (chosen["Scrambled"] == chosen["Original"]).all()
    assert (chosen["Un-scrambled"] == chosen["Original"]).all()

    # Each sentence's numbers are those of the charts above it
    same = int((chosen["Un-scrambled"] == chosen["Original"]).all(axis=1).sum())
    assert same == n_tokens
    said = captions(at)
    assert f"{same} of {n_tokens} tokens chose the same experts as the original after un-scrambling." in said
    differ = int((~(chosen["Scrambled"] == chosen["Original"]).all(axis=1)).sum())
    scrambled = next(s for s in said if "chose the original's experts so moved" in s)
    assert f"{n_tokens} of {n_tokens} tokens chose the original's experts so moved" in scrambled
    assert f"{differ} of {n_tokens} rows differ from the original's row at the same place" in scrambled
    relabelled = int((order != np.arange(4)).sum())
    assert f"the experts key relabelled {relabelled} of 4 experts" in scrambled
    counts = chosen["Original"].sum(axis=0)
    assert (f"expert {int(counts.argmax())} was chosen most, by {int(counts.max())} tokens" in
            next(s for s in said if "was chosen most" in s))
    # weights: the charts hold float32 (plotly's payload); the sentence's bound is the float64 one, far below
    restored = float(re.search(r"differ from the original's by at most ([\d.e+-]+)\.",
                               next(s for s in said if "by at most" in s)).group(1))
    assert restored <= 1e-12 and np.abs(weights["Un-scrambled"] - weights["Original"]).max() <= 1e-6
    moved = float(re.search(r"cell by cell they differ from the original's by up to ([\d.e+-]+)\.",
                            next(s for s in said if "cell by cell they differ" in s)).group(1))
    assert abs(moved - np.abs(weights["Scrambled"] - weights["Original"]).max()) <= 1e-3 * moved
    assert (weights["Scrambled"] > 0).sum() == (chosen["Scrambled"] > 0).sum()  # weights only where chosen


def test_the_control_that_leaves_the_router_rows_shows_choices_that_do_not_come_back():
    at = explore(model="random:mixtral", dtype="float64", on_experts="1", k_experts="7", layer="1",
                 control="experts/router_not_permuted", block_view="experts")
    chosen = maps(at, "experts chosen, block 1")
    same = int((chosen["Un-scrambled"] == chosen["Original"]).all(axis=1).sum())
    n_tokens = chosen["Original"].shape[0]
    assert same < n_tokens
    assert f"{same} of {n_tokens} tokens chose the same experts as the original after un-scrambling." in captions(at)


def test_a_dense_model_shows_no_routing():
    at = explore(model="random:llama", dtype="float64", block_view="experts")  # a link from a mixture of experts
    assert "experts" not in block_views(at) and at.button_group(key="block_view").value == "hidden"
    assert any("`block_view=experts` is not a valid value here" in w.value for w in at.warning)
    assert not maps(at, "experts chosen")
