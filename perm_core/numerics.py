"""Full-precision numerics for float64 models: attention softmax and RMSNorm in the model's dtype.

Stock eager attention in ViT, BERT and Llama computes the softmax in float32 even for a float64
model, and Llama's RMSNorm computes its variance in float32: both cap every float64 comparison at
~1e-7. The replacements below are the same math without the downcast (float32 models compute
exactly what they did before) and the attention still returns its probabilities for traces.
"""

from __future__ import annotations

import types

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

EXACT_EAGER = "perm_core_eager"


def exact_eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                          **kwargs):
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:  # Gemma 2's logit soft-capping
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
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


def use_exact_numerics(model) -> None:
    """Prepare a freshly loaded model (weights untouched): exact eager attention, full-precision RMSNorm."""
    model.set_attn_implementation(EXACT_EAGER)
    for module in model.modules():
        if type(module).__name__ == "Gemma3RMSNorm" and hasattr(module, "eps"):
            module.forward = types.MethodType(_gemma_rms_norm_forward, module)
        elif type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rms_norm_forward, module)
