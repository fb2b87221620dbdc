"""Per-head rotations, live: what changes (queries, keys, values) and what cannot (scores, head outputs, outputs).

Queries, keys and values are captured by forward hooks on the attention projection modules while the
stock model runs through functional_call with rotated parameters (hooks on modules still fire). The
input of the output projection (the concatenated per-head values) is captured by a pre-hook, so each
head's contribution to the residual stream, W_O[:, head] z_head, can be formed: it is invariant.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Concat, Scramble, apply_axes
from perm_core.run import trace_names
from perm_core.run.stateless import model_lock
from perm_core.run.threads import one_thread
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT, TOLERANCE, TensorError, worst_rel

_HOOK_LOCK = threading.Lock()  # the model may be shared by several app sessions: one capture at a time


@dataclass
class Quantity:
    layer: int
    name: str  # "queries", "keys", "values", "head values (before W_O)", "attention probabilities", "head outputs"
    changed: float  # relative change of the rotated model's tensor, as it is
    restored: float  # relative error after un-rotating it (the same as `changed` for invariant tensors)
    invariant: bool  # expected to be unchanged


@dataclass
class RotationDemo:
    quantities: list[Quantity]
    examples: dict  # arrays [T, ...] for one layer and head, original and rotated
    proof: list[TensorError]  # every traced tensor (hidden states, attention, outputs) after un-scrambling
    control: list[TensorError]  # Q rotated by R but K by another R': must break
    tolerance: float
    passed: bool
    control_broken: bool


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.to(torch.float64), b.to(torch.float64)
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else (a - b).abs().max().item()


def projection_modules(subject: Subject) -> dict[int, dict[str, tuple[str, object]]]:
    """layer -> role -> (module name, how its output splits): found from the spec's claims, not by name."""
    found: dict[int, dict] = {}
    for name, claim in subject.claims.items():
        tag = claim.rule.tag
        if not name.endswith(".weight") or not tag.startswith("attn."):
            continue
        module = name[: -len(".weight")]
        role = tag.split(".")[1]
        if role == "qkv":  # a fused projection (GPT-2, Phi-3; per head in GPT-NeoX): its output splits as its spec says
            concat = next(a for a in claim.rule.axes if isinstance(a, Concat))
            for i, (part, _) in enumerate(concat.parts):
                found.setdefault(claim.layer, {})[part] = (module, (i, concat))
        else:
            found.setdefault(claim.layer, {})[role] = (module, None)
    return found


def capture(subject: Subject, scramble: Scramble | None = None) -> tuple[dict, dict]:
    """(trace records, {(layer, role): tensor}) of one run; role "z" is the input of the output projection."""
    modules = dict(subject.model.named_modules())
    captured, handles = {}, []

    def keep(layer, role, split):
        def hook(module, args, output):
            if split is not None:
                output = split[1].split(output, output.dim() - 1)[split[0]]
            captured[(layer, role)] = output.detach()
        return hook

    with _HOOK_LOCK, model_lock(subject.model):  # no other session's run passes the hooks
        try:
            for layer, roles in projection_modules(subject).items():
                for role, (module_name, split) in roles.items():
                    module = modules[module_name]
                    if role == "o":
                        handles.append(module.register_forward_pre_hook(
                            lambda m, args, layer=layer: captured.__setitem__((layer, "z"), args[0].detach())))
                    else:
                        handles.append(module.register_forward_hook(keep(layer, role, split)))
            records = subject.trace(scramble)
        finally:
            for handle in handles:
                handle.remove()
    return records, captured


def head_outputs(subject: Subject, params: dict, layer: int, z: torch.Tensor) -> torch.Tensor:
    """Each head's contribution to the residual stream: [heads, B, T, d]."""
    g = subject.geometry
    name, claim = next((n, c) for n, c in subject.claims.items()
                       if c.layer == layer and c.rule.tag == "attn.o" and n.endswith(".weight"))
    weight = params[name]
    weight = weight if claim.rule.axes[1] == "o" else weight.T  # -> [d_resid, heads * head_dim]
    per_head_z = z.unflatten(-1, (g.n_heads, g.head_dim))  # [B, T, H, hd]
    per_head_w = weight.unflatten(-1, (g.n_heads, g.head_dim))  # [d, H, hd]
    return torch.einsum("bthc,dhc->hbtd", per_head_z.to(weight.dtype), per_head_w)


def rotation_demo(model, inputs: dict, key: int, layer: int = 0, head: int = 0) -> RotationDemo:
    with one_thread():
        return _rotation_demo(model, inputs, key, layer, head)


def _rotation_demo(model, inputs: dict, key: int, layer: int, head: int) -> RotationDemo:
    subject = Subject(model, inputs)
    g = subject.geometry
    layer, head = min(max(layer, 0), g.n_layers - 1), min(max(head, 0), g.n_heads - 1)
    scramble = symmetries.build("rotation", key, g)
    rotated_params = subject.transformed_params(scramble)
    original, cap_o = capture(subject)
    rotated, cap_r = capture(subject, scramble)
    inverse = scramble.inverse()
    quantities = []
    names = {"q": "queries", "k": "keys", "v": "values", "z": "head values (before W_O)"}
    for i in range(g.n_layers):
        for role, label in names.items():
            if (i, role) not in cap_o:
                continue
            a, b = cap_o[(i, role)], cap_r[(i, role)]
            back = apply_axes(b, (None, None, "o" if role == "z" else role), inverse, i)
            quantities.append(Quantity(i, label, _rel(b, a), _rel(back, a), False))
        attn_a, attn_b = original[trace_names.attn(i)].tensor, rotated[trace_names.attn(i)].tensor
        quantities.append(Quantity(i, "attention probabilities", _rel(attn_b, attn_a), _rel(attn_b, attn_a), True))
        if (i, "z") in cap_o:
            heads_a = head_outputs(subject, subject.params, i, cap_o[(i, "z")])
            heads_b = head_outputs(subject, rotated_params, i, cap_r[(i, "z")])
            quantities.append(Quantity(i, "head outputs (W_O z, per head)", _rel(heads_b, heads_a),
                                       _rel(heads_b, heads_a), True))
    output_name = trace_names.LOGITS if trace_names.LOGITS in original else trace_names.LAST_HIDDEN
    out_a, out_b = original[output_name].tensor, rotated[output_name].tensor
    quantities.append(Quantity(g.n_layers - 1, "model output", _rel(out_b, out_a), _rel(out_b, out_a), True))

    hd = slice(head * g.head_dim, (head + 1) * g.head_dim)
    attention_name = trace_names.attn(layer)
    examples = {"layer": layer, "head": head, "output_name": output_name,
                "attention": (original[attention_name].tensor[0, head], rotated[attention_name].tensor[0, head]),
                "output": (out_a[0].flatten(), out_b[0].flatten())}
    for role in ("q", "k", "v"):
        if (layer, role) in cap_o:
            kv_head = head // g.heads_per_group if role != "q" else head
            cut = slice(kv_head * g.head_dim, (kv_head + 1) * g.head_dim) if role != "q" else hd
            examples[role] = (cap_o[(layer, role)][0, :, cut], cap_r[(layer, role)][0, :, cut])
    if (layer, "z") in cap_o:
        examples["head_output"] = (head_outputs(subject, subject.params, layer, cap_o[(layer, "z")])[head, 0],
                                   head_outputs(subject, rotated_params, layer, cap_r[(layer, "z")])[head, 0])

    tolerance = TOLERANCE.get(subject.dtype, 1e-4)
    proof = subject.errors(original, subject.unscramble(rotated, scramble))
    control_scramble = next(c for c in symmetries.controls("rotation", key, g) if c.name == "keys_rotated_differently")
    control_trace = subject.trace(control_scramble.scramble)
    control = subject.errors(original, subject.unscramble(control_trace, control_scramble.scramble))
    return RotationDemo(quantities, examples, proof, control, tolerance,
                        bool(proof) and all(e.passed for e in proof), worst_rel(control) > BROKEN_AT)


@dataclass
class Comparison:
    """A candidate symmetry vs a near miss, tensor by tensor (forward pass, after un-scrambling)."""

    title: str
    symmetry: list[TensorError]
    broken: list[TensorError]
    tolerance: float
    symmetry_label: str = "permutation"
    broken_label: str = "rotation"
    notes: dict = field(default_factory=dict)


def _errors(subject: Subject, scramble: Scramble, original) -> list[TensorError]:
    return subject.errors(original, subject.unscramble(subject.trace(scramble), scramble))


def norm_commutation(subject: Subject, key: int) -> dict[str, dict[str, float]]:
    """Does the first norm commute with a permutation / a rotation? On the model's own embedding output.

    LayerNorm: y = gamma * (x - mean x) / std x + beta. A permutation moves gamma and beta along with
    the channels. A rotation mixes channels that have different gains, and it does not keep the mean
    (the all-ones direction), so it fails even with gamma = 1, beta = 0. RMSNorm has no mean: with
    gamma = 1 it commutes with every rotation; its gain alone breaks it.
    """
    g = subject.geometry
    x = subject.trace()[trace_names.EMBED].tensor.to(torch.float64).reshape(-1, g.d_model)
    norm_names = [n for n, c in subject.claims.items() if c.rule.tag == "norm" and c.layer == 0]
    weight = subject.params[next(n for n in norm_names if n.endswith("weight"))].detach().to(torch.float64)
    bias_name = next((n for n in norm_names if n.endswith("bias")), None)
    bias = subject.params[bias_name].detach().to(torch.float64) if bias_name else torch.zeros_like(weight)
    norm_module = dict(subject.model.named_modules())[norm_names[0].rsplit(".", 1)[0]]
    layer_norm = isinstance(norm_module, torch.nn.LayerNorm)  # ViT/BERT/GPT-2/GPT-NeoX; Llama/Phi-3: RMSNorm

    def norm(v, w, b):
        if layer_norm:
            v = v - v.mean(-1, keepdim=True)
            return w * v / (v.square().mean(-1, keepdim=True) + 1e-12).sqrt() + b
        return w * v / (v.square().mean(-1, keepdim=True) + 1e-12).sqrt()

    from perm_core.engine import keys
    perm = keys.permutation(key, g.d_model, "channels")
    rot = keys.orthogonal(key, 1, g.d_model, "channels/rotation")[0]
    ones, zeros = torch.ones_like(weight), torch.zeros_like(weight)
    results = {}
    for label, w, b in (("model's gain and bias", weight, bias), ("gain 1, bias 0", ones, zeros)):
        reference = norm(x, w, b)
        permuted = norm(x[:, perm], w[perm], b[perm])
        rotated = norm(x @ rot.T, w, b)
        results[label] = {"permutation": _rel(permuted, reference[:, perm]),
                          "rotation": _rel(rotated, norm(x, w, b) @ rot.T)}
    results["kind"] = {"LayerNorm": 1.0} if layer_norm else {"RMSNorm": 1.0}
    return results


def residual_rotation(model, inputs: dict, key: int) -> Comparison:
    """A permutation of the residual stream is a symmetry; a general rotation of it is not (norms)."""
    subject = Subject(model, inputs)
    with one_thread():
        original = subject.trace()
    permutation = symmetries.build("channels", key, subject.geometry)
    control = next(c for c in symmetries.controls("channels", key, subject.geometry, subject.n_tokens)
                   if c.name == "residual_rotation")
    with one_thread():
        return Comparison("residual stream: permutation vs general rotation",
                          _errors(subject, permutation, original), _errors(subject, control.scramble, original),
                          TOLERANCE.get(subject.dtype, 1e-4), notes=norm_commutation(subject, key))


def rope_rotations(model, inputs: dict, key: int) -> Comparison:
    """On a RoPE model only Q/K rotations inside each rotary plane survive; a general Q/K rotation breaks."""
    subject = Subject(model, inputs)
    if not subject.geometry.rope:
        raise ValueError("this model has no rotary position embeddings; pick random:llama or smollm2-135m")
    with one_thread():
        return _rope(subject, key)


def _rope(subject: Subject, key: int) -> Comparison:
    original = subject.trace()
    planes = symmetries.build("rotation", key, subject.geometry)
    general = next(c for c in symmetries.controls("rotation", key, subject.geometry)
                   if c.name == "general_rotation_with_rope")
    return Comparison("RoPE: Q/K rotations inside rotary planes vs general Q/K rotations",
                      _errors(subject, planes, original), _errors(subject, general.scramble, original),
                      TOLERANCE.get(subject.dtype, 1e-4), "plane rotations (commute with RoPE)",
                      "general rotation")
