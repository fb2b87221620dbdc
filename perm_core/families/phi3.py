"""Phi-3: fused qkv_proj (all query heads | key heads | value heads, GQA sizes) and fused gate_up_proj.

gate_up_proj's output is [gate | up], chunked in two and multiplied neuron by neuron, so both halves
live in the one MLP space and move with the same permutation. RMSNorm, no biases. RoPE may rotate only
the first partial_rotary_factor * head_dim channels of each q/k head (Geometry.rotary_dim). A sliding
window (Phi-3-mini's 2047) acts on every layer through one mask, as in Mistral (see tokens.py).
"""

from perm_core.engine.spec import Concat, Rule
from perm_core.families.base import Family, Geometry, UnsupportedModelError
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER

P = r"(?:model\.)?"
L = P + r"layers\.(?P<layer>\d+)\."


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    rotary = int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    if rotary % 2:
        raise UnsupportedModelError(f"Phi-3 with an odd rotary width ({rotary} of {head_dim}) is not supported")
    window = getattr(config, "sliding_window", None)
    return Geometry(d, config.num_hidden_layers, heads, config.num_key_value_heads or heads, head_dim,
                    config.intermediate_size, rope=rotary > 0, first_token_fixed=False, input_kind="causal-text",
                    rotary_dim=rotary, sliding_window=window, window_in_every_layer=window is not None)


def rules(g: Geometry) -> tuple[Rule, ...]:
    qkv = Concat((("q", g.n_heads * g.head_dim), ("k", g.n_kv_heads * g.head_dim), ("v", g.n_kv_heads * g.head_dim)))
    gate_up = Concat((("mlp", g.d_mlp), ("mlp", g.d_mlp)))
    return (
        Rule(P + r"embed_tokens\.weight", (None, "resid"), "embedding"),
        Rule(L + r"self_attn\.qkv_proj\.weight", (qkv, "resid"), "attn.qkv"),
        Rule(L + r"self_attn\.o_proj\.weight", ("resid", "o"), "attn.o"),
        Rule(L + r"(?:input|post_attention)_layernorm\.weight", ("resid",), "norm"),
        Rule(L + r"mlp\.gate_up_proj\.weight", (gate_up, "resid"), "mlp.in"),
        Rule(L + r"mlp\.down_proj\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(P + r"norm\.weight", ("resid",), "norm"),
        Rule(r"lm_head\.weight", (None, "resid"), "head"),
        Rule(r"score\.weight", (None, "resid"), "head"),  # Phi3ForTokenClassification: logits per token
        Rule(r"score\.bias", (None,), "head"),  # sequence classification: the last token's scores
    )


# Phi3ForSequenceClassification pools the last token in array order, which stays in place (see gpt2.py).
FAMILY = Family("phi3", ("phi3",), ("Phi3Model", "Phi3ForCausalLM", "Phi3ForTokenClassification",
                                    "Phi3ForSequenceClassification"), geometry, rules, pools_last_token=True,
                # fused qkv_proj and gate_up_proj inside its blocks: the stages are Llama's
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
