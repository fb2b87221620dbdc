"""Llama: RMSNorm, RoPE, grouped-query attention (k/v have n_kv_heads), SwiGLU (gate and up move together)."""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER

P = r"(?:model\.|transformer\.)?"  # LlamaForQuestionAnswering keeps its LlamaModel as `transformer`
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
        Rule(r"qa_outputs\.weight", (None, "resid"), "head"),  # question answering: start | end score per token
        Rule(r"qa_outputs\.bias", (None,), "head"),
    )


def head_classes(prefix: str) -> tuple[str, ...]:
    """The classes of a Llama-like family: the model, its language model and every head transformers has.
    The sequence classifier pools the last token in array order, which stays in place (see gpt2.py)."""
    return tuple(prefix + suffix for suffix in ("Model", "ForCausalLM", "ForTokenClassification",
                                                "ForSequenceClassification", "ForQuestionAnswering"))


FAMILY = Family("llama", ("llama",), head_classes("Llama"), geometry, rules, pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
