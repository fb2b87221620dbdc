"""Run a stock model through functional_call and record everything under one naming scheme (run.trace_names builds and
parses every name).

Names, the same for every family:
  embed                      the embedding output fed to block 0           [B, T, d]
  blocks.{i}.hidden          the residual stream after block i             [B, T, d]
  blocks.{i}.attn            attention probabilities of block i            [B, H, T, T]
  blocks.{i}.cross_attn      an encoder-decoder's cross-attention          [B, H, decoder T, encoder T]
  decoder.embed              an encoder-decoder's decoder embedding output [B, decoder T, d]
  output.logits / output.pooler / output.last_hidden
  output.start_logits / output.end_logits      question answering, one score per token [B, T]
  output.prediction_logits / output.seq_relationship_logits / output.cls_logits / output.distillation_logits
                             the other heads' outputs (BERT pre-training; DeiT's two classifiers)
A head's output has a token axis where it has one entry per token (a language model's or token classifier's
logits [B, T, classes], question answering's [B, T]); pooled outputs ([B, classes], a multiple-choice head's
[B, choices]) have none. An encoder-decoder's per-token outputs are the decoder's, whose tokens never move.
  grad.input                 d loss / d pixels (ViT) or d loss / d embed (text)
  grad.blocks.{i}.hidden     d loss / d hidden state
  grad.param.{name}          d loss / d parameter
Every record carries its axis roles, so the spec engine can un-scramble it like a weight.
Encoder-decoders (T5) number their blocks encoder first, then decoder (as Rule.layer_offset does), and
"tokens" are the encoder's: the decoder's token axes never move (see tokens.py).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch

from perm_core.engine.spec import PIXELS, Claim
from perm_core.families import Geometry
from perm_core.fast import graph_forward
from perm_core.run import trace_names
from perm_core.run.stateless import functional_call

TOKEN_RESID = (None, "tokens", "resid")


@dataclass
class Record:
    tensor: torch.Tensor
    axes: object  # axis roles, or PIXELS
    layer: int | None = None


def invariant_loss(primary: torch.Tensor) -> torch.Tensor:
    """A loss every symmetry leaves unchanged (it only sees the multiset of output entries)."""
    flat = primary.flatten()
    return torch.logsumexp(flat, 0) + flat.square().mean()


class MixedDtypeError(ValueError):
    """The model's forward mixed dtypes with its parameters cast to one: a tensor outside them does not follow."""


# torch's words for two dtypes meeting in one op (a matmul, a copy into a buffer, an addition's out tensor)
_DTYPE_CLASH = re.compile(r"same dtype|scalar type|dtype .* (?:but|does not match)|Input type", re.IGNORECASE)


@contextlib.contextmanager
def _dtype_clash_named(params: dict):
    """A run that fails because two dtypes met is told as that, in one sentence, instead of as a stack of modeling
    frames: the model's own parameters were all cast to this run's dtype, so the other dtype came from elsewhere."""
    try:
        yield
    except RuntimeError as error:
        if not _DTYPE_CLASH.search(str(error)):
            raise
        dtype = str(next(iter(params.values())).dtype).removeprefix("torch.") if params else "its"
        raise MixedDtypeError(
            f"The model does not run with its parameters in {dtype}: a tensor that is not one of its parameters (a "
            f"forward hook's, a buffer) keeps another dtype, and torch says: {str(error).splitlines()[0]}. A check "
            "runs the model in its own dtype and in the other of float32 and float64 (for round-off): make such "
            "tensors follow the activations' dtype, e.g. `vector.to(hidden.dtype)` in the hook.") from None


def run(model, params: dict, kwargs: dict, g: Geometry, claims: dict[str, Claim] | None = None,
        backward: bool = False, on_param_grad=None, graph: bool = False) -> dict[str, Record]:
    """on_param_grad(name, Record): with backward, each parameter's gradient is handed over as backward produces it
    and not kept (no grad.param.* records): a float64 check then never holds a second model-sized set.
    graph: run a forward without backward as one TorchScript graph (perm_core.fast.graph_forward: the same numbers,
    one GIL round trip), for forwards repeated on one input, as an app's key changes are."""
    if graph and not backward:
        out = graph_forward.forward(model, params, {**kwargs, "output_hidden_states": True,
                                                    "output_attentions": True})
        if out is not None:
            return _forward_records(out, model, g)
    if backward:
        params = {name: p.detach().requires_grad_(True) for name, p in params.items()}
        if "pixel_values" in kwargs:
            kwargs = {**kwargs, "pixel_values": kwargs["pixel_values"].detach().requires_grad_(True)}
    context = torch.enable_grad() if backward else torch.no_grad()
    with context, _dtype_clash_named(params):
        out = functional_call(model, params, args=(), kwargs={**kwargs, "output_hidden_states": True,
                                                            "output_attentions": True}, strict=False)
        records = _forward_records(out, model, g)
        if backward:
            records.update(_backward_records(out, records, params, kwargs, claims, g, on_param_grad))
    for record in records.values():
        record.tensor = record.tensor.detach()
    return records


def _forward_records(out, model, g: Geometry) -> dict[str, Record]:
    if getattr(out, "encoder_hidden_states", None) is not None:
        return _seq2seq_records(out)
    hidden = out.hidden_states
    records = {trace_names.EMBED: Record(hidden[0], TOKEN_RESID)}
    for i, state in enumerate(hidden[1:]):
        records[trace_names.hidden(i)] = Record(state, TOKEN_RESID)
    for i, probs in enumerate(out.attentions):
        records[trace_names.attn(i)] = Record(probs, (None, ("heads", i), "tokens", "tokens"))
    for name, per_token_dims in HEAD_OUTPUTS.items():
        tensor = getattr(out, name, None)
        if tensor is not None:
            records[trace_names.output(name)] = Record(tensor, _head_axes(tensor, tensor.dim() == per_token_dims))
    if getattr(out, "pooler_output", None) is not None:
        records[trace_names.POOLER] = Record(out.pooler_output, (None, "resid"))
    if getattr(out, "last_hidden_state", None) is not None:
        records[trace_names.LAST_HIDDEN] = Record(out.last_hidden_state, TOKEN_RESID)
    return records


def _seq2seq_records(out) -> dict[str, Record]:
    encoder_layers = len(out.encoder_hidden_states) - 1
    decoder_resid = (None, None, "resid")
    records = {trace_names.EMBED: Record(out.encoder_hidden_states[0], TOKEN_RESID),
               trace_names.DECODER_EMBED: Record(out.decoder_hidden_states[0], decoder_resid)}
    for i, state in enumerate(out.encoder_hidden_states[1:]):
        records[trace_names.hidden(i)] = Record(state, TOKEN_RESID)
    for i, state in enumerate(out.decoder_hidden_states[1:], start=encoder_layers):
        records[trace_names.hidden(i)] = Record(state, decoder_resid)
    for i, probs in enumerate(out.encoder_attentions):
        records[trace_names.attn(i)] = Record(probs, (None, ("heads", i), "tokens", "tokens"))
    for i, (probs, cross) in enumerate(zip(out.decoder_attentions, out.cross_attentions, strict=True),
                                       start=encoder_layers):
        records[trace_names.attn(i)] = Record(probs, (None, ("heads", i), None, None))
        records[trace_names.cross_attn(i)] = Record(cross, (None, ("heads", i), None, "tokens"))
    heads = {name: getattr(out, name, None) for name in HEAD_OUTPUTS}
    for name, tensor in heads.items():  # one row per decoder token, or pooled: no axis moves
        if tensor is not None:
            records[trace_names.output(name)] = Record(tensor, _head_axes(tensor, False))
    if all(tensor is None for tensor in heads.values()):
        records[trace_names.LAST_HIDDEN] = Record(out.last_hidden_state, decoder_resid)
    return records


# Output field -> the number of dimensions it has when it holds one entry per token.
HEAD_OUTPUTS = {"logits": 3, "start_logits": 2, "end_logits": 2, "prediction_logits": 3,
                "seq_relationship_logits": 3, "cls_logits": 3, "distillation_logits": 3}


def _head_axes(tensor: torch.Tensor, per_token: bool) -> tuple:
    return (None, "tokens", *(None,) * (tensor.dim() - 2)) if per_token else (None,) * tensor.dim()


def primary_output(records: dict[str, Record]) -> torch.Tensor:
    """What the invariant loss reads: the logits; else every head output, flattened end to end (question
    answering's start and end scores; BERT pre-training's two heads); else the last hidden state."""
    if trace_names.LOGITS in records:
        return records[trace_names.LOGITS].tensor
    heads = [records[name].tensor.flatten() for name in map(trace_names.output, HEAD_OUTPUTS) if name in records]
    if heads:
        return torch.cat(heads)
    if trace_names.LAST_HIDDEN in records:
        return records[trace_names.LAST_HIDDEN].tensor
    raise ValueError("the model produced neither logits nor a last hidden state")


def _backward_records(out, records, params, kwargs, claims, g: Geometry, on_param_grad=None) -> dict[str, Record]:
    loss = invariant_loss(primary_output(records))
    image = "pixel_values" in kwargs
    hidden_names = [n for n in records if trace_names.is_residual(n)]
    hidden_names = [n for n in hidden_names if records[n].tensor.requires_grad]
    targets = [records[n].tensor for n in hidden_names] + list(params.values())
    if image:
        targets.append(kwargs["pixel_values"])
    if on_param_grad is None:
        grads = torch.autograd.grad(loss, targets, allow_unused=True)
    else:
        grads = _streamed_grads(loss, targets, params, claims, on_param_grad)
    result = {}
    for name, grad in zip(hidden_names, grads, strict=False):
        # For text the embedding output is the model's input; for images the pixels are.
        label = trace_names.GRAD_INPUT if name == trace_names.EMBED and not image else trace_names.grad(name)
        if grad is not None:
            result[label] = Record(grad, records[name].axes)
    for name, grad in zip(params, grads[len(hidden_names):], strict=False):
        if grad is not None:
            result[trace_names.param_grad(name)] = Record(grad, claims[name].rule.axes, claims[name].layer)
    if image and grads[-1] is not None:
        result[trace_names.GRAD_INPUT] = Record(grads[-1], PIXELS)
    return result


def _streamed_grads(loss, targets, params: dict, claims, on_param_grad) -> list:
    """torch.autograd.grad's list, with every parameter's entry None: each is handed to on_param_grad as soon
    as it is accumulated (handing_over_grads)."""
    leaves = set(map(id, params.values()))
    others = [t for t in targets if id(t) not in leaves]
    for tensor in others:
        tensor.retain_grad()
    with handing_over_grads(params, claims, on_param_grad):
        torch.autograd.backward(loss, inputs=targets)
    return [None if id(t) in leaves else t.grad for t in targets]


@contextlib.contextmanager
def handing_over_grads(leaves: dict[str, torch.Tensor], claims, take):
    """For the duration, each parameter leaf's gradient is handed to take(name, Record) as soon as backward has
    accumulated it, then dropped from the leaf, so that its memory serves the next one: no model-sized set of
    gradients is held (the whole-model check's backward, and each stage of a streamed one)."""
    def hand_over(name):
        def hook(leaf):
            grad, leaf.grad = leaf.grad, None
            take(name, Record(grad, claims[name].rule.axes, claims[name].layer))
        return hook

    handles = [leaf.register_post_accumulate_grad_hook(hand_over(name)) for name, leaf in leaves.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
