"""GPT-NeoX (Pythia): a fused query_key_value laid out per head, partial RoPE, a parallel residual.

query_key_value's output is viewed as [head, 3 * head_dim] and chunked into q | k | v inside each head
(transformers 5.23, GPTNeoXAttention.forward), so its output axis is a Concat with one group per head.
RoPE rotates only the first rotary_pct * head_dim channels of each q/k head (Geometry.rotary_dim).
The parallel residual (attention and MLP both read the block's input) needs nothing of the spec: every
symmetry here acts on the residual stream and inside each branch alike. Old checkpoints name the
untied output head embed_out; transformers renames it lm_head on load.
"""

from dataclasses import replace

from perm_core.engine.spec import Concat, Rule
from perm_core.families.base import Family, Geometry, UnsupportedModelError
from perm_core.families.stages import LAST_NON_PADDING, Head, StageLayout

P = r"(?:gpt_neox\.)?"
L = P + r"layers\.(?P<layer>\d+)\."


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = d // heads
    rotary = int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    if rotary % 2:
        raise UnsupportedModelError(f"GPT-NeoX with an odd rotary width ({rotary} of {head_dim}) is not supported")
    return Geometry(d, config.num_hidden_layers, heads, heads, head_dim, config.intermediate_size,
                    rope=rotary > 0, first_token_fixed=False, input_kind="causal-text", rotary_dim=rotary)


def rules(g: Geometry) -> tuple[Rule, ...]:
    qkv = Concat((("q", g.head_dim), ("k", g.head_dim), ("v", g.head_dim)), groups=g.n_heads)
    return (
        Rule(P + r"embed_in\.weight", (None, "resid"), "embedding"),
        Rule(L + r"(?:input|post_attention)_layernorm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(L + r"attention\.query_key_value\.weight", (qkv, "resid"), "attn.qkv"),
        Rule(L + r"attention\.query_key_value\.bias", (qkv,), "attn.qkv"),
        Rule(L + r"attention\.dense\.weight", ("resid", "o"), "attn.o"),
        Rule(L + r"attention\.dense\.bias", ("resid",), "attn.o"),
        Rule(L + r"mlp\.dense_h_to_4h\.weight", ("mlp", "resid"), "mlp.in"),
        Rule(L + r"mlp\.dense_h_to_4h\.bias", ("mlp",), "mlp.in"),
        Rule(L + r"mlp\.dense_4h_to_h\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(L + r"mlp\.dense_4h_to_h\.bias", ("resid",), "mlp.out"),
        Rule(P + r"final_layer_norm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(r"(?:lm_head|embed_out)\.weight", (None, "resid"), "head"),
        Rule(r"classifier\.weight", (None, "resid"), "head"),  # GPTNeoXForTokenClassification: logits per token
        Rule(r"classifier\.bias", (None,), "head"),
        Rule(r"score\.weight", (None, "resid"), "head"),  # sequence classification: the last token's scores
        Rule(r"score\.bias", (None,), "head"),
        Rule(r"qa_outputs\.weight", (None, "resid"), "head"),  # question answering: start | end score per token
        Rule(r"qa_outputs\.bias", (None,), "head"),
    )


# GPTNeoXForSequenceClassification pools the last token in array order, which stays in place (see gpt2.py).

# embed_in -> layers (a parallel residual, partial rotary) -> final_layer_norm -> lm_head (stored as embed_out by old
# checkpoints, renamed on loading)
STAGES = StageLayout("ForCausalLM", base="gpt_neox", attention="attention", token_embedding="embed_in",
                     final_norm="final_layer_norm", built=("rotary_emb",))
# the same stages, then score (a row per label) read at each row's last token that is no padding
CLASSIFIER = replace(STAGES, head_class="ForSequenceClassification",
                     heads=(Head(("score",), token=LAST_NON_PADDING),))


FAMILY = Family("gpt_neox", ("gpt_neox",), ("GPTNeoXModel", "GPTNeoXForCausalLM", "GPTNeoXForTokenClassification",
                                            "GPTNeoXForSequenceClassification", "GPTNeoXForQuestionAnswering"),
                geometry, rules, pools_last_token=True,
                stages=(STAGES, CLASSIFIER))
