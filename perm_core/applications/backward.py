"""The backward pass under a symmetry: gradients and SGD steps commute with scrambling.

If g is a symmetry (f(g.theta, g.x) = g.f(theta, x)) and the loss is measured on the un-scrambled
output, then L(g.theta, g.x) = L(theta, x) for every theta, so its gradient is equivariant:
grad L(g.theta, g.x) = g.grad L(theta, x). Hence a plain SGD step taken in the scrambled world lands
exactly on the scrambled image of the step taken in the original world, step after step.
`sgd_lockstep` measures that on the updates (theta'_t - theta'_0 against g(theta_t - theta_0)), so a
negative control is judged on its training, never on where it started.

Losses (the loss sees the output after it is un-scrambled, so it is invariant by construction):
  class       cross-entropy of the classifier logits to a target class (or a label per image)
  next_token  mean next-token cross-entropy of a causal LM on its own input
  similarity  1 - cosine(mean-pooled last hidden state, embedding of a reference sentence)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from perm_core.engine.spec import PIXELS, Scramble, apply_axes, transform_params
from perm_core.engine.tokens import model_inputs
from perm_core.models.registry import mean_pool
from perm_core.run import trace_names
from perm_core.run.stateless import functional_call
from perm_core.run.trace import TOKEN_RESID, Record
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import (
    BROKEN_AT,
    FLOOR,
    TOLERANCE,
    TensorError,
    headline,
    is_finite,
    tensor_errors,
    worst,
    worst_abs,
    worst_rel,
)

LOSSES = {
    "class": "cross-entropy to a chosen class",
    "next_token": "next-token cross-entropy",
    "similarity": "1 - cosine similarity to a reference sentence's embedding",
}


@dataclass(frozen=True)
class Loss:
    kind: str  # a key of LOSSES
    targets: torch.Tensor | None = None  # "class": one label per batch item
    reference: torch.Tensor | None = None  # "similarity": reference embedding [D], original space


def losses_for(model) -> list[str]:
    """The losses that make sense for a model's output."""
    from perm_core.families import family_of

    g = family_of(model).geometry(model.config)
    if g.input_kind == "image":
        return ["class"]
    if g.input_kind == "causal-text":
        return ["next_token", "similarity"]
    return ["similarity"]


def _outputs(subject: Subject, params: dict, scramble: Scramble, pixels_grad: bool):
    """Run the model in the world of `scramble`; return (model output, the tensor standing for the input)."""
    kwargs = model_inputs(subject.inputs, subject.geometry, scramble, subject.dtype)
    if "pixel_values" in kwargs and pixels_grad:
        kwargs["pixel_values"] = kwargs["pixel_values"].detach().requires_grad_(True)
    out = functional_call(subject.model, params, args=(), kwargs={**kwargs, "output_hidden_states": True},
                          strict=False)
    source = kwargs["pixel_values"] if "pixel_values" in kwargs else out.hidden_states[0]
    return out, source


def loss_of(subject: Subject, out, scramble: Scramble, loss: Loss) -> torch.Tensor:
    """The loss on the un-scrambled output, so the same number comes out in either world."""
    inverse = scramble.inverse()
    if loss.kind == "class":
        logits = out.logits
        if logits.dim() != 2:
            raise ValueError("the class loss needs a classifier ([batch, classes] logits)")
        return F.cross_entropy(logits, loss.targets.to(logits.device))
    if loss.kind == "next_token":
        logits = apply_axes(out.logits, (None, "tokens", None), inverse)  # back to the original order
        ids = subject.inputs["input_ids"]
        mask = subject.inputs.get("attention_mask", torch.ones_like(ids))[:, 1:].bool()
        per_token = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        return per_token[mask].mean()
    if loss.kind == "similarity":
        last = apply_axes(out.hidden_states[-1], TOKEN_RESID, inverse)
        ids = subject.inputs["input_ids"]
        mask = subject.inputs.get("attention_mask", torch.ones_like(ids))
        embedding = mean_pool(last, mask)[0]
        return 1 - F.cosine_similarity(embedding, loss.reference.to(embedding), dim=0)
    raise ValueError(f"unknown loss {loss.kind!r}; choose from {', '.join(LOSSES)}")


def sentence_embedding(subject: Subject, inputs: dict) -> torch.Tensor:
    """Mean-pooled last hidden state [D] of a text input, with the subject's own weights."""
    with torch.no_grad():
        out = functional_call(subject.model, subject.params, args=(),
                              kwargs={**model_inputs(inputs, subject.geometry, Scramble(), subject.dtype),
                                      "output_hidden_states": True}, strict=False)
    return mean_pool(out.hidden_states[-1], inputs.get("attention_mask",
                                                       torch.ones_like(inputs["input_ids"])))[0]


def gradients(subject: Subject, loss: Loss, scramble: Scramble | None = None, param_names=None,
              params: dict | None = None) -> tuple[float, dict[str, Record]]:
    """(loss, {"grad.input": ..., "grad.param.NAME": ...}) in the world of `scramble`."""
    scramble = scramble or Scramble()
    if params is None:
        params = subject.params if scramble.is_identity else subject.transformed_params(scramble)
    names = list(params) if param_names is None else list(param_names)
    # Every parameter requires grad, so the embedding output (the text models' input) is in the graph.
    params = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    with torch.enable_grad():
        out, source = _outputs(subject, params, scramble, pixels_grad=True)
        value = loss_of(subject, out, scramble, loss)
        grads = torch.autograd.grad(value, [source] + [params[n] for n in names], allow_unused=True)
    axes = PIXELS if subject.geometry.input_kind == "image" else TOKEN_RESID
    records = {trace_names.GRAD_INPUT: Record(grads[0].detach(), axes)}
    for name, grad in zip(names, grads[1:], strict=True):
        claim = subject.claims[name]
        grad = torch.zeros_like(params[name]) if grad is None else grad.detach()
        records[trace_names.param_grad(name)] = Record(grad, claim.rule.axes, claim.layer)
    return value.item(), records


@dataclass
class GradientComparison:
    loss_original: float
    loss_scrambled: float
    original: dict[str, torch.Tensor]
    scrambled: dict[str, torch.Tensor]  # as the scrambled world sees them (permuted)
    unscrambled: dict[str, torch.Tensor]
    errors: list[TensorError]
    tolerance: float

    @property
    def worst_name(self) -> str:
        """The gradient whose error max_rel_error reports: the largest relative error among the headline tensors
        (a non-finite one counts as the largest; tensors zero in exact arithmetic are reported apart)."""
        worst_error = max(headline(self.errors) or self.errors,
                          key=lambda e: math.inf if not e.finite or math.isnan(e.max_rel_error) else e.max_rel_error)
        return trace_names.differentiated(worst_error.name)

    @property
    def max_rel_error(self) -> float:
        return worst_rel(self.errors)

    @property
    def passed(self) -> bool:
        return bool(self.errors) and all(e.passed for e in self.errors)


def compare_gradients(model, inputs: dict, loss: Loss, keys_by_symmetry: dict[str, int],
                      param_names=None, keep=None) -> GradientComparison:
    """Gradients in the original world, in the scrambled world, and the latter un-scrambled. Every gradient is
    compared; `keep` (names such as "grad.input", "grad.param.NAME"; default all) are the ones the result holds
    in its three dicts, so a page that draws a few never keeps three model-sized sets."""
    subject = Subject(model, inputs)
    scramble = subject.build(keys_by_symmetry)
    loss_a, original = gradients(subject, loss, None, param_names)
    loss_b, scrambled = gradients(subject, loss, scramble, param_names)
    restored = subject.unscramble(scrambled, scramble)
    errors = subject.errors(original, restored)
    kept = set(original) if keep is None else set(keep)
    return GradientComparison(loss_a, loss_b, {n: r.tensor for n, r in original.items() if n in kept},
                              {n: r.tensor for n, r in scrambled.items() if n in kept},
                              {n: t for n, t in restored.items() if n in kept}, errors,
                              TOLERANCE.get(subject.dtype, 1e-4))


@dataclass
class SGDStep:
    step: int
    loss_original: float
    loss_scrambled: float
    # The training error: the scrambled world's accumulated update theta'_t - theta'_0 against the applied
    # transform of the original world's update theta_t - theta_0, per tensor on that update's own scale.
    # Nothing has been trained at step 0 (both updates are zero): 0 there by definition.
    update_abs_error: float
    update_rel_error: float
    # The parameter-space error: transform(theta_t) vs theta'_t, per tensor on the parameter's own scale.
    # Much smaller than the update error (an update is small next to the weights it moves).
    param_abs_error: float
    param_rel_error: float


@dataclass
class SGDResult:
    steps: list[SGDStep] = field(default_factory=list)
    tolerance: float = 1e-4
    control: str | None = None
    lr: float = 0.0
    update_moved: float = 0.0  # the largest |theta_t - theta_0| of the original world, over steps and tensors

    @property
    def trained(self) -> bool:
        """Did the original world's weights move at all? (Not with lr=0, steps=0 or a zero gradient.)"""
        return len(self.steps) > 1 and self.update_moved > 0

    @property
    def max_rel_error(self) -> float:
        """The verdict's number: the worst update error from step 1 on (inf for any NaN or infinity)."""
        return worst(s.update_rel_error for s in self.steps[1:])

    @property
    def max_param_error(self) -> float:
        return worst(s.param_rel_error for s in self.steps)

    @property
    def passed(self) -> bool:
        """The true symmetry: trained, and every update un-scrambles within the tolerance."""
        return self.trained and self.max_rel_error <= self.tolerance

    @property
    def broken(self) -> bool:
        """A negative control: trained, and some update is off by more than BROKEN_AT (relative)."""
        return self.trained and self.max_rel_error > BROKEN_AT

    @property
    def verdict(self) -> str:
        if not self.trained:
            return "nothing was trained"
        if self.control is None:
            return "passed" if self.passed else "failed"
        return "broken" if self.broken else "not broken"


def params_error(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(max abs, max rel) over all parameters; rel is against each tensor's scale, floored by the largest.
    A NaN or infinity anywhere (in either dict, or in an error) makes both +inf."""
    return streamed_params_error((expected[name], actual[name]) for name in expected)


def streamed_params_error(pairs) -> tuple[float, float]:
    """params_error over (expected, actual) pairs made one at a time, so a model-sized set of expected tensors
    never exists at once."""
    measured, floor = [], None
    for want, got in pairs:
        floor = FLOOR.get(want.dtype, 1e-3) if floor is None else floor
        if not (is_finite(want) and is_finite(got)):
            return math.inf, math.inf
        if want.numel():
            diff = (got.to(torch.float64) - want.to(torch.float64)).abs().max().item()
            measured.append((diff, want.abs().max().item()))
    largest = worst(own for _, own in measured)
    abs_errors, rel_errors = [], []
    for diff, own in measured:
        scale = max(own, floor * largest)
        abs_errors.append(diff)
        rel_errors.append(diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst(abs_errors), worst(rel_errors)


def update_error(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor],
                 floor_reasons: dict[str, str]) -> tuple[float, float]:
    """(max abs, max rel) of the scrambled world's update against the transformed original update.

    Each tensor is judged on its own update's scale (compare.tensor_errors); an update that is zero in
    exact arithmetic (a key bias: its gradient is zero) against the floor; a NaN anywhere is +inf.
    """
    named = {trace_names.param_grad(n): t for n, t in expected.items()}
    errors = tensor_errors(named, {trace_names.param_grad(n): t for n, t in actual.items()}, floor_reasons)
    return worst_abs(errors), worst_rel(errors)


def sgd_lockstep(model, inputs: dict, loss: Loss, keys_by_symmetry: dict[str, int], steps: int = 5,
                 lr: float = 0.001, control: str | None = None, progress=None) -> SGDResult:
    """`steps` plain SGD steps in both worlds, measuring whether *training* commutes with the transform.

    The scrambled world starts from g(theta_0), g the applied transform (the symmetry, or with `control`
    the negative control, e.g. "norms_not_permuted", a near miss that is not a symmetry). After each step
    the scrambled world's accumulated update theta'_t - theta'_0 is compared with g(theta_t - theta_0),
    the transformed update of the original world. For a symmetry the two agree to round-off; for a
    control the gradients differ, so the trajectories diverge and the error is of order 1 -- but only once
    something was trained: with lr=0 or steps=0 both updates are zero and the result says so.

    Each world keeps its accumulated update as a tensor of its own (theta_t = theta_0 + delta_t), so the
    update is never recovered by subtracting two nearly equal weights (that would cost float32 all its
    digits for a small learning rate).
    """
    from perm_core.engine import symmetries

    subject = Subject(model, inputs)
    applied = subject.build(keys_by_symmetry)
    if control is not None:
        found = [c for name, key in keys_by_symmetry.items()
                 for c in symmetries.controls(name, key, subject.geometry, subject.n_tokens) if c.name == control]
        if not found:
            raise ValueError(f"no negative control named {control!r} for {', '.join(keys_by_symmetry)}")
        applied = found[0].scramble
    # The shared model's own tensors, only ever read: every theta_t below is a new tensor (theta_0 + delta_t).
    theta_0 = {n: p.detach() for n, p in subject.params.items()}
    theta_s0 = transform_params(theta_0, subject.spec, applied, subject.claims)
    delta = {n: torch.zeros_like(p) for n, p in theta_0.items()}
    delta_s = {n: torch.zeros_like(p) for n, p in theta_s0.items()}
    result = SGDResult(tolerance=TOLERANCE.get(subject.dtype, 1e-4), control=control, lr=lr)
    moved = []
    # At most one world's parameters and gradients are alive at a time, the parameters' error is measured tensor
    # by tensor and the updates are applied in place: about 5 model-sized sets at the peak instead of 8.
    for step in range(steps + 1):
        upd_abs, upd_rel = 0.0, 0.0
        if step:
            expected_update = transform_params(delta, subject.spec, applied, subject.claims)
            upd_abs, upd_rel = update_error(expected_update, delta_s, subject.floor_reasons)
            del expected_update
        par_abs, par_rel = streamed_params_error(
            (transform_params({n: theta_0[n] + delta[n]}, subject.spec, applied, subject.claims)[n],
             theta_s0[n] + delta_s[n]) for n in theta_0)
        moved.append(worst(d.abs().max().item() for d in delta.values() if d.numel()))
        last = step == steps
        loss_a = _step(subject, loss, None, {n: theta_0[n] + delta[n] for n in theta_0}, delta, lr, last)
        loss_b = _step(subject, loss, applied, {n: theta_s0[n] + delta_s[n] for n in theta_s0}, delta_s, lr, last)
        result.steps.append(SGDStep(step, loss_a, loss_b, upd_abs, upd_rel, par_abs, par_rel))
        if last:
            break
        if progress:
            progress((step + 1) / steps, f"SGD step {step + 1}/{steps}")
    result.update_moved = worst(moved)
    return result


def _step(subject: Subject, loss: Loss, scramble: Scramble | None, theta: dict, delta: dict, lr: float,
          last: bool) -> float:
    """The loss at theta and, unless it is the last step, one SGD step on the accumulated update, in place
    (delta - lr * grad, rounded as written)."""
    value, grads = gradients(subject, loss, scramble, params=theta)
    if not last:
        for name, d in delta.items():
            d.sub_(grads[trace_names.param_grad(name)].tensor * lr)
    return value


def weight_matrices(model) -> list[str]:
    """2-D weights worth showing (the embedding tables and vocabulary heads are too big to draw)."""
    skip = ("embeddings", "embed_tokens", "lm_head", "wte", "wpe", "decoder")
    return [n for n, p in model.named_parameters() if p.dim() == 2 and not any(s in n for s in skip)]


def make_loss(kind: str, subject: Subject, target_class: int = 0, reference: dict | None = None) -> Loss:
    """A Loss for the page/CLI: a class index, or a reference text's encoding for "similarity"."""
    if kind == "class":
        batch = next(iter(subject.inputs.values())).shape[0]
        return Loss("class", targets=torch.full((batch,), int(target_class)))
    if kind == "similarity":
        if reference is None:
            raise ValueError("the similarity loss needs a reference sentence")
        return Loss("similarity", reference=sentence_embedding(subject, reference))
    return Loss(kind)
