"""GPT-2: Conv1D weights are stored [in, out]; c_attn fuses q|k|v along its output axis."""

from dataclasses import replace

from perm_core.engine.spec import Concat, Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import LAST_NON_PADDING, Head, StageLayout

P = r"(?:transformer\.)?"
L = P + r"h\.(?P<layer>\d+)\."


def geometry(config) -> Geometry:
    d, heads = config.n_embd, config.n_head
    return Geometry(d, config.n_layer, heads, heads, d // heads, config.n_inner or 4 * d,
                    rope=False, first_token_fixed=False, input_kind="causal-text")


def rules(g: Geometry) -> tuple[Rule, ...]:
    qkv = Concat((("q", g.d_model), ("k", g.d_model), ("v", g.d_model)))
    return (
        Rule(P + r"wte\.weight", (None, "resid"), "embedding"),
        Rule(P + r"wpe\.weight", (None, "resid"), "embedding"),
        Rule(L + r"ln_[12]\.(?:weight|bias)", ("resid",), "norm"),
        Rule(L + r"attn\.c_attn\.weight", ("resid", qkv), "attn.qkv"),
        Rule(L + r"attn\.c_attn\.bias", (qkv,), "attn.qkv"),
        Rule(L + r"attn\.c_proj\.weight", ("o", "resid"), "attn.o"),
        Rule(L + r"attn\.c_proj\.bias", ("resid",), "attn.o"),
        Rule(L + r"mlp\.c_fc\.weight", ("resid", "mlp"), "mlp.in"),
        Rule(L + r"mlp\.c_fc\.bias", ("mlp",), "mlp.in"),
        Rule(L + r"mlp\.c_proj\.weight", ("mlp", "resid"), "mlp.out"),
        Rule(L + r"mlp\.c_proj\.bias", ("resid",), "mlp.out"),
        Rule(P + r"ln_f\.(?:weight|bias)", ("resid",), "norm"),
        Rule(r"lm_head\.weight", (None, "resid"), "head"),  # tied to wte unless tie_word_embeddings=False
        Rule(r"classifier\.weight", (None, "resid"), "head"),  # GPT2ForTokenClassification: logits per token
        Rule(r"classifier\.bias", (None,), "head"),
        # GPT2ForSequenceClassification: the last token's scores (that token stays in place: fixed_last_token).
        Rule(r"score\.weight", (None, "resid"), "head"),
        Rule(r"score\.bias", (None,), "head"),
        Rule(r"qa_outputs\.weight", (None, "resid"), "head"),  # question answering: start | end score per token
        Rule(r"qa_outputs\.bias", (None,), "head"),
    )


# GPT2ForSequenceClassification reads the logits of the LAST token in array order: its last token stays in place
# under token permutation (pools_last_token, see Geometry.fixed_last_token), as BERT's [CLS] does.

# wte + wpe -> h -> ln_f -> lm_head (tied to wte)
STAGES = StageLayout("GPT2LMHeadModel", base="transformer", blocks="h", attention="attn", token_embedding="wte",
                     final_norm="ln_f")
# the same stages, then score (a row per label) read at each row's last token that is no padding
CLASSIFIER = replace(STAGES, head_class="GPT2ForSequenceClassification",
                     heads=(Head(("score",), token=LAST_NON_PADDING),))


FAMILY = Family("gpt2", ("gpt2",), ("GPT2Model", "GPT2LMHeadModel", "GPT2ForTokenClassification",
                                    "GPT2ForSequenceClassification", "GPT2ForQuestionAnswering"), geometry, rules,
                refused=(("GPT2DoubleHeadsModel", "a language model and a multiple-choice head at once, over "
                          "[batch, choices, tokens] (logits [B, choices, T, vocab]), has no spec here"),),
                pools_last_token=True,
                stages=(STAGES, CLASSIFIER))
