"""BERT (encoder.layer.N.attention.self.{query,key,value}); the MLM decoder is tied to the embeddings."""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import Head, StageLayout

QKV = {"query": "q", "key": "k", "value": "v"}


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    return Geometry(d, config.num_hidden_layers, heads, heads, d // heads, config.intermediate_size,
                    rope=False, first_token_fixed=True, input_kind=text_kind(config))


def text_kind(config) -> str:
    """A decoder (is_decoder: BertLMHeadModel, RobertaForCausalLM) attends causally: tokens.py then gives it the
    causal mask built from the moved positions, as for GPT-2. Its [CLS] stays first all the same (harmless for
    a language model, and what a pooler reading token 0 needs)."""
    return "causal-text" if getattr(config, "is_decoder", False) else "bidirectional-text"


def encoder_rules(prefix: str) -> tuple[Rule, ...]:
    """Embeddings, encoder blocks and pooler under `prefix.` (BERT's layout, shared by RoBERTa)."""
    p = rf"(?:{prefix}\.)?"
    layer = p + r"encoder\.layer\.(?P<layer>\d+)\."
    return (
        Rule(p + r"embeddings\.(?:word|position|token_type)_embeddings\.weight", (None, "resid"), "embedding"),
        Rule(p + r"embeddings\.LayerNorm\.(?:weight|bias)", ("resid",), "norm"),
        *(Rule(layer + rf"attention\.self\.{n}\.weight", (r, "resid"), f"attn.{r}") for n, r in QKV.items()),
        *(Rule(layer + rf"attention\.self\.{n}\.bias", (r,), f"attn.{r}") for n, r in QKV.items()),
        Rule(layer + r"attention\.output\.dense\.weight", ("resid", "o"), "attn.o"),
        Rule(layer + r"attention\.output\.dense\.bias", ("resid",), "attn.o"),
        Rule(layer + r"(?:attention\.output|output)\.LayerNorm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(layer + r"intermediate\.dense\.weight", ("mlp", "resid"), "mlp.in"),
        Rule(layer + r"intermediate\.dense\.bias", ("mlp",), "mlp.in"),
        Rule(layer + r"output\.dense\.weight", ("resid", "mlp"), "mlp.out"),
        Rule(layer + r"output\.dense\.bias", ("resid",), "mlp.out"),
        Rule(p + r"pooler\.dense\.weight", ("resid", "resid"), "head"),
        Rule(p + r"pooler\.dense\.bias", ("resid",), "head"),
    )


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        *encoder_rules("bert"),
        Rule(r"cls\.predictions\.transform\.dense\.weight", ("resid", "resid"), "head"),
        Rule(r"cls\.predictions\.transform\.dense\.bias", ("resid",), "head"),
        Rule(r"cls\.predictions\.transform\.LayerNorm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(r"cls\.predictions\.decoder\.weight", (None, "resid"), "head"),
        Rule(r"cls\.predictions\.(?:decoder\.)?bias", (None,), "head"),
        Rule(r"classifier\.weight", (None, "resid"), "head"),
        Rule(r"classifier\.bias", (None,), "head"),
        Rule(r"cls\.seq_relationship\.weight", (None, "resid"), "head"),  # next-sentence prediction: pooled [CLS]
        Rule(r"cls\.seq_relationship\.bias", (None,), "head"),
        Rule(r"qa_outputs\.weight", (None, "resid"), "head"),  # question answering: start | end score per token
        Rule(r"qa_outputs\.bias", (None,), "head"),
    )


# Where BERT-like encoders keep their stages: embeddings (word rows, position and token-type tables, a norm) ->
# encoder.layer, no final norm
ENCODER_STAGES = {"blocks": "encoder.layer", "attention": "attention.self",
                  "token_embedding": "embeddings.word_embeddings", "final_norm": None, "built": ("embeddings",)}
STAGES = (
    # the MLM head's transform and its decoder (tied to the word embeddings) with its own bias
    StageLayout("BertForMaskedLM", base="bert", heads=(Head(("cls.predictions",)),), head_output="decoder",
                **ENCODER_STAGES),
    # the pooler (dense + tanh on token 0) beside the last hidden state
    StageLayout("BertModel", base="", heads=(), pooler="pooler", **ENCODER_STAGES),
    # the pooler (it reads token 0 itself) then the classifier (a row per label); dropout is the identity in eval
    StageLayout("BertForSequenceClassification", base="bert", heads=(Head(("bert.pooler", "classifier"), pooled=True),),
                **ENCODER_STAGES))


# Sequence classification, multiple choice and next-sentence prediction read the pooled [CLS], which never moves;
# token classification and question answering have one row of scores per token, which moves with its token
# (trace.py: logits [B, T, labels] and start/end logits [B, T] carry a token axis).
FAMILY = Family("bert", ("bert",), ("BertModel", "BertForMaskedLM", "BertForSequenceClassification",
                                    "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice",
                                    "BertLMHeadModel", "BertForPreTraining", "BertForNextSentencePrediction"),
                geometry, rules, stages=STAGES)
