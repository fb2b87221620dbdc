"""DistilBERT: BERT's post-norm block under other names (transformer.layer.N.attention.{q,k,v,out}_lin,
sa_layer_norm, ffn.lin1/lin2, output_layer_norm); learned positions taken as position_ids, no token types."""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.bert import ENCODER_STAGES
from perm_core.families.stages import Function, Head, StageLayout

P = r"(?:distilbert\.)?"
L = P + r"transformer\.layer\.(?P<layer>\d+)\."


def geometry(config) -> Geometry:
    d, heads = config.dim, config.n_heads
    return Geometry(d, config.n_layers, heads, heads, d // heads, config.hidden_dim,
                    rope=False, first_token_fixed=True, input_kind="bidirectional-text")


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"embeddings\.(?:word|position)_embeddings\.weight", (None, "resid"), "embedding"),
        Rule(P + r"embeddings\.LayerNorm\.(?:weight|bias)", ("resid",), "norm"),
        *(Rule(L + rf"attention\.{x}_lin\.weight", (x, "resid"), f"attn.{x}") for x in "qkv"),
        *(Rule(L + rf"attention\.{x}_lin\.bias", (x,), f"attn.{x}") for x in "qkv"),
        Rule(L + r"attention\.out_lin\.weight", ("resid", "o"), "attn.o"),
        Rule(L + r"attention\.out_lin\.bias", ("resid",), "attn.o"),
        Rule(L + r"(?:sa|output)_layer_norm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(L + r"ffn\.lin1\.weight", ("mlp", "resid"), "mlp.in"),
        Rule(L + r"ffn\.lin1\.bias", ("mlp",), "mlp.in"),
        Rule(L + r"ffn\.lin2\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(L + r"ffn\.lin2\.bias", ("resid",), "mlp.out"),
        # DistilBertForMaskedLM: dense, GELU, LayerNorm, projector (tied to the word embeddings).
        Rule(r"vocab_transform\.weight", ("resid", "resid"), "head"),
        Rule(r"vocab_transform\.bias", ("resid",), "head"),
        Rule(r"vocab_layer_norm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(r"vocab_projector\.weight", (None, "resid"), "head"),
        Rule(r"vocab_projector\.bias", (None,), "head"),
        # Sequence classification: token 0 ([CLS], which never moves) through dense, ReLU (per channel), classifier.
        Rule(r"pre_classifier\.weight", ("resid", "resid"), "head"),
        Rule(r"pre_classifier\.bias", ("resid",), "head"),
        Rule(r"classifier\.weight", (None, "resid"), "head"),
        Rule(r"classifier\.bias", (None,), "head"),
        Rule(r"qa_outputs\.weight", (None, "resid"), "head"),  # question answering: start | end score per token
        Rule(r"qa_outputs\.bias", (None,), "head"),
    )

# embeddings (word rows, position table, a norm) -> transformer.layer (no final norm)
_STAGES = {**ENCODER_STAGES, "blocks": "transformer.layer", "attention": "attention"}
STAGES = (
    # the MLM head: four modules on the class, its projector tied to the word embeddings with its own bias
    StageLayout("DistilBertForMaskedLM", base="distilbert", **_STAGES,
                heads=(Head(("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector")),)),
    StageLayout("DistilBertModel", base="", heads=(), **_STAGES),  # headless: the last hidden state alone
    # token 0 through pre_classifier, the ReLU its forward applies inline, and the classifier (a row per label)
    StageLayout("DistilBertForSequenceClassification", base="distilbert", **_STAGES,
                heads=(Head(("pre_classifier", Function("relu"), "classifier"), token=0),)))


FAMILY = Family("distilbert", ("distilbert",), ("DistilBertModel", "DistilBertForMaskedLM",
                                                "DistilBertForSequenceClassification",
                                                "DistilBertForTokenClassification", "DistilBertForQuestionAnswering",
                                                "DistilBertForMultipleChoice"), geometry, rules, stages=STAGES)
