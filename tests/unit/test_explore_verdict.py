"""perm_core's Explore verdict says what was measured; the page adds what the visitor can do about it, and the line
it shows is the same sentence as before the two were apart."""

import torch

from perm_core.engine.spec import Scramble
from perm_core.engine.transforms import Permutation
from perm_core.explore.exploration import ExploreResult
from perm_core.verify.tolerances import TensorError
from ui.explore_panels import verdict_line

BIAS = ("The relative position bias is computed from the order of the tokens in the sequence and takes no position "
        "ids, so moved tokens see different biases.")


def result(moved: float, rel: float, not_holding: dict[str, str] | None = None, **scramble) -> ExploreResult:
    tokens = Permutation(torch.tensor([1, 0, 2]))
    return ExploreResult(Scramble(tokens=tokens, **scramble), {}, {},
                         [TensorError("blocks.0.hidden", rel / 2, rel, 1e-9)], torch.float64,
                         moved=moved, moved_what="hidden states", not_holding=not_holding or {})


def test_keys_that_move_nothing_measure_that_and_the_page_asks_for_another_key():
    still = result(moved=0.01, rel=2e-12)
    assert still.outcome == "moved nothing" and not still.passed
    measured = "Scrambled differs by 0.01 (hidden states); un-scrambled by 2.0e-12: the keys moved nothing " \
               "(below 0.1), so this proves nothing."
    assert still.verdict() == measured
    assert verdict_line(still) == f"{measured} Choose another key."


def test_a_symmetry_the_model_lacks_is_named_and_the_page_says_to_switch_it_off():
    broken = result(moved=0.5, rel=0.25, not_holding={"tokens": BIAS})
    assert broken.outcome == "lacks a symmetry" and broken.expected_failure
    measured = ("Scrambled differs by 0.5 (hidden states); un-scrambled by 2.5e-01: NOT identical, the worst "
                f"relative error exceeds the float64 tolerance 1e-09. As expected: tokens is not a symmetry of this "
                f"model. {BIAS}")
    assert broken.verdict() == measured
    assert verdict_line(broken) == f"{measured} Switch tokens off to check the others."
    two = result(moved=0.5, rel=0.25, not_holding={"tokens": BIAS, "heads": "Heads differ."})
    assert verdict_line(two).endswith(f"are not a symmetry of this model. {BIAS} Heads differ. "
                                      "Switch tokens and heads off to check the others.")


def test_every_other_outcome_is_shown_as_measured():
    passed = result(moved=0.5, rel=1e-12)
    failed = result(moved=0.5, rel=0.25)
    non_finite = result(moved=0.5, rel=0.25)
    non_finite.errors = [TensorError("output.logits", float("nan"), float("nan"), 1e-9, finite=False)]
    for outcome, run in (("identical", passed), ("not identical", failed), ("non-finite", non_finite)):
        assert run.outcome == outcome and verdict_line(run) == run.verdict()
    assert verdict_line(passed) == ("Scrambled differs by 0.5 (hidden states); un-scrambled by 1.0e-12 in float64: "
                                    "all 1 un-scrambled tensors match the original (tolerance 1e-09).")
    assert verdict_line(failed) == ("Scrambled differs by 0.5 (hidden states); un-scrambled by 2.5e-01: NOT "
                                    "identical, the worst relative error exceeds the float64 tolerance 1e-09.")
