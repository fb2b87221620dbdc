"""Llama: RMSNorm, RoPE, grouped-query attention (k/v have n_kv_heads), SwiGLU (gate and up move together)."""

from perm_core.families import Family, Geometry
from perm_core.spec import Rule

P = r"(?:model\.)?"
L = P + r"layers\.(?P<layer>\d+)\."


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    return Geometry(d, config.num_hidden_layers, heads, config.num_key_value_heads or heads, head_dim,
                    config.intermediate_size, rope=True, first_token_fixed=False, input_kind="causal-text")


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"embed_tokens\.weight", (None, "resid"), "embedding"),
        *(Rule(L + rf"self_attn\.{x}_proj\.weight", (x, "resid"), f"attn.{x}") for x in "qkv"),
        *(Rule(L + rf"self_attn\.{x}_proj\.bias", (x,), f"attn.{x}") for x in "qkv"),
        Rule(L + r"self_attn\.o_proj\.weight", ("resid", "o"), "attn.o"),
        Rule(L + r"self_attn\.o_proj\.bias", ("resid",), "attn.o"),
        Rule(L + r"(?:input|post_attention)_layernorm\.weight", ("resid",), "norm"),
        *(Rule(L + rf"mlp\.{x}_proj\.weight", ("mlp", "resid"), f"mlp.{x}") for x in ("gate", "up")),
        *(Rule(L + rf"mlp\.{x}_proj\.bias", ("mlp",), f"mlp.{x}") for x in ("gate", "up")),
        Rule(L + r"mlp\.down_proj\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(L + r"mlp\.down_proj\.bias", ("resid",), "mlp.out"),
        Rule(P + r"norm\.weight", ("resid",), "norm"),
        Rule(r"lm_head\.weight", (None, "resid"), "head"),
        Rule(r"score\.weight", (None, "resid"), "head"),  # LlamaForTokenClassification: logits per token
        Rule(r"score\.bias", (None,), "head"),
    )


# LlamaForSequenceClassification is not listed: like GPT-2's, it pools the last token in array order.
FAMILY = Family("llama", ("llama",), ("LlamaModel", "LlamaForCausalLM", "LlamaForTokenClassification"), geometry,
                rules)
