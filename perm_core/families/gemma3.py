"""Gemma 3 (text): Llama's layout plus a Q/K RMSNorm per head, four norms per block, a sliding window.

Every RMSNorm multiplies by (1 + weight). `q_norm`/`k_norm` normalize each head on its own with one
gain per head channel shared by all heads: head permutations leave them alone, V/O transforms never
see them, and a Q/K transform must commute with that diagonal gain (see Geometry.restrictions).
The embedding is scaled by sqrt(d_model), a scalar that every symmetry leaves alone.
"""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry, UnsupportedModelError
from perm_core.families.stages import CAUSAL_LM, SEQUENCE_CLASSIFIER

P = r"(?:model\.)?"
L = P + r"layers\.(?P<layer>\d+)\."
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def geometry(config) -> Geometry:
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedModelError("Gemma 3 with bidirectional attention (an embedding model) is not supported")
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    layer_types = getattr(config, "layer_types", None) or ()
    window = config.sliding_window if "sliding_attention" in layer_types else None
    return Geometry(d, config.num_hidden_layers, heads, config.num_key_value_heads or heads, head_dim,
                    config.intermediate_size, rope=True, first_token_fixed=False, input_kind="causal-text",
                    qk_norm=True, sliding_window=window)


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"embed_tokens\.weight", (None, "resid"), "embedding"),
        *(Rule(L + rf"self_attn\.{x}_proj\.weight", (x, "resid"), f"attn.{x}") for x in "qkv"),
        *(Rule(L + rf"self_attn\.{x}_proj\.bias", (x,), f"attn.{x}") for x in "qkv"),
        Rule(L + r"self_attn\.o_proj\.weight", ("resid", "o"), "attn.o"),
        Rule(L + r"self_attn\.o_proj\.bias", ("resid",), "attn.o"),
        # One gain per head channel, shared by every head: no transform generated for Gemma 3 moves it.
        Rule(L + r"self_attn\.[qk]_norm\.weight", (None,), "qk_norm"),
        Rule(L + rf"(?:{'|'.join(NORMS)})\.weight", ("resid",), "norm"),
        *(Rule(L + rf"mlp\.{x}_proj\.weight", ("mlp", "resid"), f"mlp.{x}") for x in ("gate", "up")),
        Rule(L + r"mlp\.down_proj\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(P + r"norm\.weight", ("resid",), "norm"),
        Rule(r"lm_head\.weight", (None, "resid"), "head"),
        Rule(r"score\.weight", (None, "resid"), "head"),  # sequence classification: the last token's scores
        Rule(r"score\.bias", (None,), "head"),
    )


MULTIMODAL = ("Gemma 3's multimodal model (model_type gemma3: a SigLIP vision tower and a projector beside the "
              "language model) has no symmetry spec here; only the text-only Gemma 3 (gemma3_text) is supported")
# Gemma3TextForSequenceClassification pools the last token in array order, which stays in place (see gpt2.py).
FAMILY = Family("gemma3", ("gemma3_text",), ("Gemma3TextModel", "Gemma3ForCausalLM",
                                             "Gemma3TextForSequenceClassification"), geometry, rules,
                refused=tuple((name, MULTIMODAL) for name in ("Gemma3ForConditionalGeneration",
                                                              "Gemma3ForSequenceClassification", "Gemma3Model")),
                pools_last_token=True,
                stages=(CAUSAL_LM, SEQUENCE_CLASSIFIER))
