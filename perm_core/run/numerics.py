"""Full-precision numerics for float64 models: attention softmax and RMSNorm in the model's dtype.

What downcasts in the stock code (transformers 5.23, the version pinned here):
* eager attention of ViT, Llama and Gemma 3: softmax(..., dtype=torch.float32), then cast back;
* Llama's RMSNorm (the variance and the normalization) and Gemma 3's RMSNorm (all of it) in float32;
  T5's T5LayerNorm (an RMSNorm) its variance. T5's relative position bias reaches the attention as
  `position_bias`, added to the scores before the mask.
Each caps a float64 comparison at ~1e-7. BERT's and GPT-2's eager attention compute the softmax in the
model's dtype (GPT-2's optional reorder_and_upcast_attn path, off by default, would compute its scores in
float32 but is never taken with the attention installed here); BERT, ViT and GPT-2 use torch's LayerNorm,
which keeps the dtype. The replacements below are the same math without the downcast (float32
models, and float64 BERT and GPT-2, compute exactly what they did before: tests/unit/test_numerics.py)
and the attention still returns its probabilities for traces.
"""

from __future__ import annotations

import contextlib
import types

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

EXACT_EAGER = "perm_core_eager"


def exact_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                          position_bias=None, s_aux=None, **kwargs):
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:  # Gemma 2's logit soft-capping
        scores = torch.tanh(scores / softcap) * softcap
    if position_bias is not None:  # T5's relative position bias, [1 | B, H, query, key]
        scores = scores + position_bias
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    if s_aux is not None:  # gpt-oss's attention sinks: one extra logit per head in the softmax, then dropped
        sinks = s_aux.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[-2], 1)
        combined = torch.cat([scores, sinks.to(scores.dtype)], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values  # as the stock code does
        probs = torch.softmax(combined, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return output, probs


AttentionInterface.register(EXACT_EAGER, exact_eager_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(EXACT_EAGER, eager_mask)


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    compute_dtype = torch.promote_types(hidden_states.dtype, torch.float32)
    states = hidden_states.to(compute_dtype)
    states = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * states.to(hidden_states.dtype)


def _gemma_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """Gemma 3's RMSNorm: gain (1 + weight), applied before casting back (stock: always in float32)."""
    compute_dtype = torch.promote_types(hidden_states.dtype, torch.float32)
    states = hidden_states.to(compute_dtype)
    states = states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + self.eps)
    return (states * (1.0 + self.weight.to(compute_dtype))).to(hidden_states.dtype)


def _exact_router_forward(self, hidden_states: torch.Tensor):
    """A softmax-then-top-k router (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) with its softmax in the model's dtype
    (stock: float32); Mixtral always renormalizes the top k, the others where norm_topk_prob says."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    top, index = torch.topk(probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top.to(logits.dtype), index


SOFTMAX_ROUTERS = ("MixtralTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "OlmoeTopKRouter")


def use_exact_numerics(model) -> None:
    """Prepare a freshly loaded model (weights untouched): exact eager attention, full-precision RMSNorm."""
    model.set_attn_implementation(EXACT_EAGER)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        # Fused experts run through grouped_mm by default, which refuses float64: the loop over experts takes it.
        model.set_experts_implementation("eager")
    for module in model.modules():
        if type(module).__name__ == "Gemma3RMSNorm" and hasattr(module, "eps"):
            module.forward = types.MethodType(_gemma_rms_norm_forward, module)
        elif type(module).__name__.endswith(("RMSNorm", "T5LayerNorm")) and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_forward, module)
        elif type(module).__name__ in SOFTMAX_ROUTERS:
            module.forward = types.MethodType(_exact_router_forward, module)


@contextlib.contextmanager
def exact_numerics(model):
    """The model on exact numerics (use_exact_numerics) for the duration, then as it came: its attention and experts
    implementations and its modules' own forwards. A researcher's model loaded by transformers (sdpa attention,
    stock norms) is traced, scrambled and compared on the same numerics as a model perm_core loaded, and is handed
    back unchanged. A model that is on them already (perm_core loaded it) is left alone: the app's shared models
    run other sessions' forwards meanwhile."""
    attention = model.config._attn_implementation
    if attention == EXACT_EAGER:
        yield model
        return
    experts = getattr(model.config, "_experts_implementation", None)
    own_forwards = {module: module.__dict__.get("forward") for module in model.modules()}
    use_exact_numerics(model)
    try:
        yield model
    finally:
        for module, forward in own_forwards.items():
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward
        model.set_attn_implementation(attention)
        if experts not in (None, "eager"):
            model.set_experts_implementation(experts)
