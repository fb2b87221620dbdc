"""The fusion experiment's figures on two hand-made pairs whose every number is known: the distance cut, the
paired rotation gains and their direction in the verdict, the endpoints, and the verdict's thresholds. No model
is trained: the pairs are written down, and _run is given them in place of training and fusing."""

import math

import pytest

from perm_core.applications import fusion_experiment as fx
from perm_core.applications import fusion_pairs
from perm_core.applications.intervals import Interval

T_975_1 = 12.7062047  # t(0.975) with 1 degree of freedom: two pairs


def method_run(method, accuracy, barrier, before, after):
    return fx.MethodRun(method, accuracy, 0.0, barrier, [], [], before, after, None, None, None)


# method -> (accuracy, barrier, ||A - B||, ||A - aligned B||) per pair. With activations, rotation adds 10 and 11
# points and lowers the barrier by 0.5 and 0.6; with weights, it costs 10 and 11 points and raises it by 0.5, 0.6.
FIGURES = {
    "average": ((0.50, 2.0, 10.0, 10.0), (0.40, 3.0, 20.0, 20.0)),
    "weights: permutation": ((0.70, 1.0, 5.0, 1.0), (0.72, 1.0, 10.0, 4.0)),  # cuts 80 % and 60 %
    "weights: permutation+rotation": ((0.60, 1.5, 5.0, 2.0), (0.61, 1.6, 10.0, 5.0)),  # 60 % and 50 %
    "activations: permutation": ((0.70, 1.0, 5.0, 1.0), (0.70, 1.0, 10.0, 2.0)),  # 80 % both
    "activations: permutation+rotation": ((0.80, 0.5, 5.0, 0.5), (0.81, 0.4, 10.0, 1.0)),  # 90 % both
}
ENDPOINTS = ((0.90, 0.80), (0.85, 0.95))  # (accuracy of A, of B) per pair


def pair(index):
    accuracy_a, accuracy_b = ENDPOINTS[index]
    run = fx.PairRun((2 * index, 2 * index + 1), accuracy_a, accuracy_b, 0.0, 0.0)
    run.methods = [method_run(method, *figures[index]) for method, figures in FIGURES.items()]
    return run


PAIRS = [pair(0), pair(1)]


def two_value_interval(first, second):
    """mean +- t(0.975, 1) s / sqrt(2), with s = |first - second| / sqrt(2): half-width t |first - second| / 2."""
    mean, half = (first + second) / 2, T_975_1 * abs(first - second) / 2
    return mean, mean - half, mean + half


def assert_interval(interval, first, second):
    assert (interval.mean, interval.low, interval.high) == pytest.approx(two_value_interval(first, second), abs=1e-6)
    assert interval.n == 2


def test_the_distance_cut_is_the_share_of_the_distance_before_that_matching_removes():
    summaries = {s.method: s for s in fx.summarize(PAIRS)}
    assert_interval(summaries["weights: permutation"].distance_cut, 80.0, 60.0)  # 5 -> 1 and 10 -> 4
    assert_interval(summaries["weights: permutation+rotation"].distance_cut, 60.0, 50.0)
    assert_interval(summaries["activations: permutation+rotation"].distance_cut, 90.0, 90.0)
    assert_interval(summaries["average"].distance_cut, 0.0, 0.0)
    assert_interval(summaries["weights: permutation"].distance_before, 5.0, 10.0)
    assert_interval(summaries["weights: permutation"].distance_after, 1.0, 4.0)
    assert_interval(summaries["activations: permutation"].accuracy, 0.70, 0.70)
    assert_interval(summaries["weights: permutation+rotation"].barrier, 1.5, 1.6)


def test_the_rotation_gains_are_rotation_minus_permutation_and_the_verdict_reads_their_sign():
    accuracy = fx.rotation_gains(PAIRS, "accuracy", 100.0)
    assert_interval(accuracy["activations"], 10.0, 11.0)  # 80 - 70, 81 - 70 points
    assert_interval(accuracy["weights"], -10.0, -11.0)  # 60 - 70, 61 - 72
    barrier = fx.rotation_gains(PAIRS, "barrier")
    assert_interval(barrier["activations"], -0.5, -0.6)
    assert_interval(barrier["weights"], 0.5, 0.6)
    sentence = fx.verdict(accuracy)
    # t |10 - 11| / 2 = 6.35: the interval 4.1 to 16.9 lies above 0, and -16.9 to -4.1 below it
    assert "+10.5 points with activation matching (95 % interval +4.1 to +16.9: rotation adds)" in sentence
    assert "-10.5 points with weight matching (95 % interval -16.9 to -4.1: rotation costs)" in sentence


@pytest.mark.parametrize("low,high,reading", [
    (1e-9, 2.0, "rotation adds"),  # just above 0
    (0.0, 2.0, "no difference this many pairs can show"),  # touching 0 is not above it
    (-2.0, 0.0, "no difference this many pairs can show"),
    (-2.0, -1e-9, "rotation costs"),  # just below 0
])
def test_the_verdict_needs_the_whole_interval_on_one_side_of_zero(low, high, reading):
    interval = Interval((low + high) / 2, low, high, 3, 0.95)
    sentence = fx.verdict({"activations": interval, "weights": interval})
    assert sentence.startswith("Over 3 seed pairs") and sentence.count(reading) == 2


@pytest.fixture
def written_down_pairs(monkeypatch):
    """_run with training replaced by the seed itself and fusing by the hand-made pair of those seeds."""
    calls = []
    monkeypatch.setattr(fusion_pairs, "train_member", lambda settings, seed, progress: seed)

    def run_pair(model_a, model_b, seeds, alphas):
        calls.append((model_a, model_b, seeds, alphas))
        return PAIRS[model_a // 2]

    monkeypatch.setattr(fx, "run_pair", run_pair)
    return calls


def test_the_experiment_reports_the_figures_of_its_pairs(written_down_pairs):
    progress = []
    result = fx.run_experiment(fx.ExperimentSettings(pairs=2, points=3), lambda f, m: progress.append((f, m)))
    assert written_down_pairs == [(0, 1, (0, 1), [0.0, 0.5, 1.0]), (2, 3, (2, 3), [0.0, 0.5, 1.0])]
    assert result.path_alpha == [0.0, 0.5, 1.0] and result.pairs == PAIRS
    values = [0.90, 0.80, 0.85, 0.95]  # mean 0.875, s = sqrt(0.0125 / 3)
    half = 3.1824463 * math.sqrt(0.0125 / 3) / 2  # t(0.975, 3) s / sqrt(4)
    assert (result.endpoints.mean, result.endpoints.high) == pytest.approx((sum(values) / 4, 0.875 + half), abs=1e-6)
    assert_interval(result.rotation_accuracy_gain["activations"], 10.0, 11.0)
    assert_interval(result.rotation_barrier_gain["weights"], 0.5, 0.6)
    assert "rotation adds" in result.verdict and "rotation costs" in result.verdict
    assert_interval(result.summary("weights: permutation").distance_cut, 80.0, 60.0)
    assert progress[-1] == (1.0, "done")


@pytest.mark.parametrize("pairs,points,refused", [(1, 3, "pairs"), (2, 2, "3 points"), (2, 3, None)])
def test_two_pairs_and_three_points_are_the_least_the_experiment_runs_on(written_down_pairs, pairs, points, refused):
    settings = fx.ExperimentSettings(pairs=pairs, points=points)
    if refused:
        with pytest.raises(ValueError, match=refused):
            fx.run_experiment(settings)
    else:
        assert len(fx.run_experiment(settings).pairs) == 2
