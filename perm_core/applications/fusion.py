"""Model fusion of two digits ViTs: align B to A with exact symmetries, then average the weights.

Design (documented choices):
- The residual stream IS matched, by one permutation for the whole model (residual channels are
  shared by every block, and a permutation is the only residual symmetry of a LayerNorm model).
  Without it the attention and MLP weights of A and B read incomparable coordinates. It is found from
  hidden-state correlations and kept only if it lowers the final parameter distance.
- "permutation": residual + per-layer heads, head channels (Q/K and V/O) and MLP neurons.
  "rotation": only the per-head Procrustes rotations (residual, heads and neurons left as they are).
  "permutation+rotation": residual + heads + MLP neurons, then Procrustes inside each matched head
  (a rotation subsumes any channel permutation, so those are not matched separately).
- Every alignment is a perm_core Scramble applied with transform_params, and `prove_alignment`
  checks with perm_core.verify.check that aligned B computes exactly what B computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F

from perm_core.applications.matching import METHODS, align, distance, match_residual
from perm_core.engine.spec import Scramble
from perm_core.models import digits
from perm_core.run import trace_names
from perm_core.run.stateless import functional_call, own_dtype
from perm_core.run.threads import one_thread
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT, TOLERANCE, tensor_entry, worst_rel

Progress = Callable[[float, str], None] | None
GROUPS = {"attention": ("attn.",), "mlp": ("mlp.",), "other": ("embedding", "position", "norm", "head")}


@dataclass
class Proof:
    """aligned B vs B on held-out digits: every traced tensor, errors against perm_core's tolerance."""

    passed: bool
    max_rel_error: float
    tolerance: float
    n_images: int
    tensors: list[dict]
    control: str
    control_rel_error: float
    control_broken: bool


@dataclass
class MethodResult:
    method: str
    accuracy: float  # fused model (A + aligned B) / 2 on the 360 test digits
    loss: float
    path_alpha: list[float]  # (1 - alpha) A + alpha aligned-B
    path_loss: list[float]
    path_accuracy: list[float]
    barrier: float  # max over the path of loss minus the straight line between the end points
    distance_before: float
    distance_after: float
    group_distance_before: dict[str, float]
    group_distance_after: dict[str, float]
    residual_matched: bool
    proof: Proof | None = None


@dataclass
class FusionResult:
    model_a: str
    model_b: str
    accuracy_a: float
    loss_a: float
    accuracy_b: float
    loss_b: float
    methods: list[MethodResult] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


@cache
def cached_split():
    """digits_split() costs seconds (scikit-learn's loader); the split is fixed, so load it once."""
    return digits.digits_split()


def evaluate_params(model, params: dict, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` run with `params` (never mutating it)."""
    with torch.no_grad():
        logits = functional_call(model, params, args=(), kwargs={"pixel_values": images}).logits.float()
    return (logits.argmax(-1) == labels).float().mean().item(), F.cross_entropy(logits, labels).item()


def interpolate(params_a: dict, params_b: dict, alpha: float) -> dict:
    return {name: (1 - alpha) * params_a[name] + alpha * params_b[name] for name in params_a}


def barrier_height(alphas, losses) -> float:
    line = (1 - np.asarray(alphas)) * losses[0] + np.asarray(alphas) * losses[-1]
    return float(np.max(np.asarray(losses) - line))


def group_names(claims, group: str) -> list[str]:
    prefixes = GROUPS[group]
    return [n for n, c in claims.items() if c.rule.tag.startswith(prefixes)]


def _check_pair(model_a, model_b) -> None:
    shapes_a = {n: tuple(p.shape) for n, p in model_a.named_parameters()}
    shapes_b = {n: tuple(p.shape) for n, p in model_b.named_parameters()}
    if shapes_a != shapes_b:
        raise ValueError("the two models must have the same architecture (same parameter names and shapes)")
    config = model_a.config
    if getattr(config, "model_type", None) != "vit" or config.image_size != 8 or config.num_labels != 10:
        raise ValueError("fusion is measured on the digits test set: both models must be 8x8 digits ViTs "
                         "(e.g. digits-vit and digits-vit-b)")


def residual_candidate(model_a, model_b, images: torch.Tensor):
    """A residual permutation from the correlation of all hidden states (every block, every token)."""
    def stacked(model):
        records = Subject(model, {"pixel_values": images}).trace()
        names = [trace_names.EMBED] + sorted(n for n in records if trace_names.parse(n).kind == "hidden")
        return torch.cat([records[n].tensor.reshape(-1, records[n].tensor.shape[-1]) for n in names])

    return match_residual(stacked(model_a), stacked(model_b))


def aligned_for(method, subject_a: Subject, subject_b: Subject, residual) -> tuple[Scramble, dict, bool]:
    """The alignment with the residual permutation and without it; the closer one wins (never worse)."""
    spec, claims, g = subject_b.spec, subject_b.claims, subject_b.geometry
    candidates = [False, True] if "permutation" in method else [False]
    best = None
    for use_residual in candidates:
        scramble = align(method, subject_a.params, subject_b.params, spec, claims, g,
                         residual if use_residual else None)
        params = subject_b.transformed_params(scramble) if not scramble.is_identity else subject_b.params
        dist = distance(subject_a.params, params)
        if best is None or dist < best[0]:
            best = (dist, scramble, params, use_residual)
    return best[1], best[2], best[3]


def misaligned(scramble: Scramble) -> Scramble:
    """Negative control: the same alignment with the key side left out, so Q/K pairing breaks."""
    return Scramble({space: chain for space, chain in scramble.spaces.items() if space[0] != "k"})


def prove_alignment(model_b, scramble: Scramble, n_images: int = 64) -> Proof:
    """Run B and aligned B on held-out digits; un-scramble aligned B's trace and compare every tensor."""
    _, _, test_x, _ = cached_split()
    subject = Subject(model_b, {"pixel_values": test_x[:n_images]})
    original = subject.trace()
    errors = subject.errors(original, subject.unscramble(subject.trace(scramble), scramble))
    tolerance = TOLERANCE.get(subject.dtype, 1e-4)
    worst = worst_rel(errors)
    control = misaligned(scramble)
    if control.is_identity:  # an alignment that moves only key-side spaces: the control moves the queries alone
        from perm_core.engine.symmetries import rotation
        control = Scramble({s: c for s, c in rotation(7, subject.geometry).spaces.items() if s[0] == "q"})
    control_errors = subject.errors(original, subject.unscramble(subject.trace(control), control))
    control_worst = worst_rel(control_errors)
    passed = bool(errors) and all(e.passed for e in errors)
    return Proof(passed, worst, tolerance, n_images, [tensor_entry(e, empty_floor=True) for e in errors],
                 "alignment with the key-side transforms left out", control_worst, control_worst > BROKEN_AT)


def fuse(loaded_a, loaded_b, methods=METHODS, n_points: int = 11, prove: bool = True,
         progress: Progress = None) -> FusionResult:
    """Align, prove, average and walk the linear path for every method. ~1-3 s per method on 2 CPUs."""
    with one_thread():
        return _fuse(loaded_a, loaded_b, methods, n_points, prove, progress)


def _fuse(loaded_a, loaded_b, methods, n_points, prove, progress) -> FusionResult:
    model_a, model_b = loaded_a.model, loaded_b.model
    _check_pair(model_a, model_b)
    if n_points < 2:
        raise ValueError("the path needs at least 2 points")
    train_x, _, test_x, test_y = cached_split()
    dtype = own_dtype(model_a)
    test_x = test_x.to(dtype)
    step = (lambda f, m: progress(f, m)) if progress else (lambda f, m: None)
    step(0.0, "matching the residual stream")
    residual = residual_candidate(model_a, model_b, train_x[:128].to(dtype))
    subject_a = Subject(model_a, {"pixel_values": test_x[:1]})
    subject_b = Subject(model_b, {"pixel_values": test_x[:1]})
    acc_a, loss_a = evaluate_params(model_a, subject_a.params, test_x, test_y)
    acc_b, loss_b = evaluate_params(model_a, subject_b.params, test_x, test_y)
    result = FusionResult(loaded_a.info.name, loaded_b.info.name, acc_a, loss_a, acc_b, loss_b)
    alphas = np.linspace(0.0, 1.0, n_points).tolist()
    groups = {g: group_names(subject_b.claims, g) for g in GROUPS}
    for index, method in enumerate(methods):
        base = index / len(methods)
        step(base, f"{method}: aligning B to A")
        scramble, aligned, used_residual = aligned_for(method, subject_a, subject_b, residual)
        # plain averaging aligns nothing: aligned B is B itself, and there is nothing to prove
        proof = prove_alignment(model_b, scramble) if prove and not scramble.is_identity else None
        losses, accuracies = [], []
        for k, alpha in enumerate(alphas):
            step(base + (k + 1) / (len(alphas) + 1) / len(methods), f"{method}: path point {k + 1}/{len(alphas)}")
            # alpha = 0 is model A itself for every method: measured once above.
            acc, loss = (acc_a, loss_a) if alpha == 0.0 else evaluate_params(
                model_a, interpolate(subject_a.params, aligned, alpha), test_x, test_y)
            losses.append(loss)
            accuracies.append(acc)
        if 0.5 in alphas:
            fused_acc, fused_loss = accuracies[alphas.index(0.5)], losses[alphas.index(0.5)]
        else:
            fused_acc, fused_loss = evaluate_params(model_a, interpolate(subject_a.params, aligned, 0.5),
                                                    test_x, test_y)
        result.methods.append(MethodResult(
            method, fused_acc, fused_loss, alphas, losses, accuracies, barrier_height(alphas, losses),
            distance(subject_a.params, subject_b.params), distance(subject_a.params, aligned),
            {g: distance(subject_a.params, subject_b.params, n) for g, n in groups.items()},
            {g: distance(subject_a.params, aligned, n) for g, n in groups.items()},
            used_residual, proof))
    step(1.0, "done")
    return result
