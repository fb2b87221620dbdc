"""Does rotation add to permutation? Fusion over several seed pairs, with 95 % intervals.

For each pair (fusion_pairs: two digits ViTs from seeds 2 i and 2 i + 1) and each method, B is aligned to A (the
anchor), proved to be B's own function (fusion.prove_alignment, float64), averaged with A and walked along
(1 - alpha) A + alpha aligned-B. Methods: plain averaging; weight matching (matching.align_by_weights) and
activation matching on held-out training images (activation_matching), each with permutations only and with
per-head rotations. Over the pairs: each figure's t-interval, and the paired interval of what rotation adds to
permutation, from which `verdict` says in one sentence whether rotation adds on this data.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from perm_core.applications import fusion_pairs
from perm_core.applications.activation_matching import align_by_activations, record_activations
from perm_core.applications.fusion import barrier_height, cached_split, evaluate_params, interpolate, prove_alignment
from perm_core.applications.intervals import Interval, paired_difference, t_interval
from perm_core.applications.matching import align_by_weights, distance
from perm_core.engine.spec import Scramble
from perm_core.run.threads import one_thread
from perm_core.verify.subject import Subject

KINDS = ("weights", "activations")
METHODS = ("average", *(f"{kind}: {group}" for kind in KINDS for group in ("permutation", "permutation+rotation")))
PROOF_IMAGES = 32
Progress = Callable[[float, str], None] | None


@dataclass(frozen=True)
class ExperimentSettings:
    pairs: int = 5
    pair: fusion_pairs.PairSettings = field(default_factory=fusion_pairs.PairSettings)
    points: int = 11  # on the interpolation path, both ends included


@dataclass
class MethodRun:
    method: str
    accuracy: float  # of (A + aligned B) / 2 on the 360 test digits
    loss: float
    barrier: float  # max over the path of the test loss above the straight line between its ends
    path_loss: list[float]
    path_accuracy: list[float]
    distance_before: float  # ||A - B||, A the anchor
    distance_after: float  # ||A - aligned B||
    proved: bool | None  # aligned B is B's function and the negative control breaks; None: nothing aligned
    proof_error: float | None  # worst relative error of aligned B against B over every traced tensor
    control_error: float | None  # the same for the negative control (the key side left out)


@dataclass
class PairRun:
    seeds: tuple[int, int]
    accuracy_a: float
    accuracy_b: float
    loss_a: float
    loss_b: float
    methods: list[MethodRun] = field(default_factory=list)


@dataclass
class MethodSummary:
    method: str
    accuracy: Interval
    barrier: Interval
    distance_before: Interval
    distance_after: Interval
    distance_cut: Interval  # percent of ||A - B|| that matching removes


@dataclass
class ExperimentResult:
    settings: ExperimentSettings
    path_alpha: list[float]
    endpoints: Interval  # accuracy of every trained model, A and B
    pairs: list[PairRun]
    summaries: list[MethodSummary]
    rotation_accuracy_gain: dict[str, Interval]  # kind -> paired (permutation+rotation) - (permutation), points
    rotation_barrier_gain: dict[str, Interval]  # kind -> paired barrier difference
    verdict: str
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self, method: str) -> MethodSummary:
        return next(s for s in self.summaries if s.method == method)


def aligned(method: str, subject_a: Subject, subject_b: Subject, acts_a: dict, acts_b: dict) -> Scramble:
    kind, _, group = method.partition(": ")
    if method == "average":
        return Scramble()
    if kind == "weights":
        return align_by_weights(group, subject_a.params, subject_b.params, subject_b.spec, subject_b.claims,
                                subject_b.geometry)
    return align_by_activations(group, acts_a, acts_b, subject_b.geometry)


def run_pair(model_a, model_b, seeds, alphas, methods=METHODS) -> PairRun:
    """Every method on one trained pair (both float64)."""
    train_x, _, test_x, test_y = cached_split()
    _, held = fusion_pairs.held_out_split()
    test_x = test_x.double()
    subject_a = Subject(model_a, {"pixel_values": test_x[:1]})
    subject_b = Subject(model_b, {"pixel_values": test_x[:1]})
    acts_a, acts_b = record_activations(model_a, train_x[held]), record_activations(model_b, train_x[held])
    acc_a, loss_a = evaluate_params(model_a, subject_a.params, test_x, test_y)
    acc_b, loss_b = evaluate_params(model_b, subject_b.params, test_x, test_y)
    pair = PairRun(tuple(seeds), acc_a, acc_b, loss_a, loss_b)
    for method in methods:
        scramble = aligned(method, subject_a, subject_b, acts_a, acts_b)
        params_b = subject_b.params if scramble.is_identity else subject_b.transformed_params(scramble)
        path = [evaluate_params(model_a, interpolate(subject_a.params, params_b, alpha), test_x, test_y)
                for alpha in alphas]
        middle = min(range(len(alphas)), key=lambda i: abs(alphas[i] - 0.5))
        proof = None if scramble.is_identity else prove_alignment(model_b, scramble, PROOF_IMAGES)
        pair.methods.append(MethodRun(
            method, path[middle][0], path[middle][1], barrier_height(alphas, [loss for _, loss in path]),
            [loss for _, loss in path], [acc for acc, _ in path],
            distance(subject_a.params, subject_b.params), distance(subject_a.params, params_b),
            None if proof is None else bool(proof.passed and proof.control_broken),
            None if proof is None else proof.max_rel_error, None if proof is None else proof.control_rel_error))
    return pair


def summarize(pairs: list[PairRun], methods=METHODS) -> list[MethodSummary]:
    def values(method, name):
        return [getattr(next(m for m in p.methods if m.method == method), name) for p in pairs]

    return [MethodSummary(method, t_interval(values(method, "accuracy")), t_interval(values(method, "barrier")),
                          t_interval(values(method, "distance_before")), t_interval(values(method, "distance_after")),
                          t_interval([100 * (b - a) / b for b, a in zip(values(method, "distance_before"),
                                                                         values(method, "distance_after"),
                                                                         strict=True)]))
            for method in methods]


def rotation_gains(pairs: list[PairRun], figure: str, scale: float = 1.0) -> dict[str, Interval]:
    """kind -> the paired t-interval of figure(permutation+rotation) - figure(permutation), times `scale`."""
    def values(method):
        return [scale * getattr(next(m for m in p.methods if m.method == method), figure) for p in pairs]

    return {kind: paired_difference(values(f"{kind}: permutation+rotation"), values(f"{kind}: permutation"))
            for kind in KINDS}


def verdict(gains: dict[str, Interval]) -> str:
    """One sentence from the paired intervals of merged accuracy (points): adds, costs, or cannot be told."""
    def said(kind):
        gain = gains[kind]
        reading = ("rotation adds" if gain.above(0) else "rotation costs" if gain.below(0) else
                   "no difference this many pairs can show")
        return (f"{gain.mean:+.1f} points with {kind[:-1]} matching (95 % interval {gain.low:+.1f} to "
                f"{gain.high:+.1f}: {reading})")

    n = next(iter(gains.values())).n
    return (f"Over {n} seed pairs, adding per-head rotations to permutation matching changes the merged accuracy by "
            f"{said('activations')} and by {said('weights')}.")


def run_experiment(settings: ExperimentSettings = ExperimentSettings(), progress: Progress = None) -> ExperimentResult:
    """Train settings.pairs pairs and fuse each every way; about 25 s a pair at the default width on one core."""
    if settings.pairs < 2:
        raise ValueError(f"an interval needs at least two pairs, got {settings.pairs}")
    if settings.points < 3:
        raise ValueError(f"the path needs at least 3 points, got {settings.points}")
    with one_thread():
        return _run(settings, progress)


def _run(settings: ExperimentSettings, progress: Progress) -> ExperimentResult:
    started = time.perf_counter()
    step = progress or (lambda fraction, message: None)
    alphas = np.linspace(0.0, 1.0, settings.points).tolist()
    pairs = []
    for index in range(settings.pairs):
        seeds = (2 * index, 2 * index + 1)
        models = []
        for member, seed in enumerate(seeds):
            def trained(fraction, index=index, member=member, seed=seed):
                step((index + 0.4 * (member + fraction)) / settings.pairs,
                     f"pair {index + 1}/{settings.pairs}: training the model of seed {seed}")
            models.append(fusion_pairs.train_member(settings.pair, seed, trained))
        step((index + 0.8) / settings.pairs, f"pair {index + 1}/{settings.pairs}: matching, proving and fusing")
        pairs.append(run_pair(*models, seeds, alphas))
    step(1.0, "done")
    gains = rotation_gains(pairs, "accuracy", 100.0)
    return ExperimentResult(settings, alphas, t_interval([acc for p in pairs for acc in (p.accuracy_a, p.accuracy_b)]),
                            pairs, summarize(pairs), gains, rotation_gains(pairs, "barrier"), verdict(gains),
                            time.perf_counter() - started)
