"""RoBERTa: BERT's layout under roberta.*, an MLM head lm_head.{dense,layer_norm,decoder}, and position ids
counted from padding_idx + 1 (Geometry.position_offset): tokens.py passes them so, moved with their tokens."""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.bert import ENCODER_STAGES, encoder_rules, text_kind
from perm_core.families.stages import Head, StageLayout


def geometry(config) -> Geometry:
    d, heads = config.hidden_size, config.num_attention_heads
    return Geometry(d, config.num_hidden_layers, heads, heads, d // heads, config.intermediate_size,
                    rope=False, first_token_fixed=True, input_kind=text_kind(config),
                    position_offset=config.pad_token_id + 1)


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        *encoder_rules("roberta"),
        Rule(r"lm_head\.dense\.weight", ("resid", "resid"), "head"),
        Rule(r"lm_head\.dense\.bias", ("resid",), "head"),
        Rule(r"lm_head\.layer_norm\.(?:weight|bias)", ("resid",), "norm"),
        Rule(r"lm_head\.decoder\.weight", (None, "resid"), "head"),
        Rule(r"lm_head\.(?:decoder\.)?bias", (None,), "head"),
        # Sequence classification: token 0 (<s>, which never moves) through dense, tanh (per channel), out_proj.
        Rule(r"classifier\.dense\.weight", ("resid", "resid"), "head"),
        Rule(r"classifier\.dense\.bias", ("resid",), "head"),
        Rule(r"classifier\.out_proj\.weight", (None, "resid"), "head"),
        Rule(r"classifier\.out_proj\.bias", (None,), "head"),
        Rule(r"classifier\.weight", (None, "resid"), "head"),  # token classification: logits per token
        Rule(r"classifier\.bias", (None,), "head"),
        Rule(r"qa_outputs\.weight", (None, "resid"), "head"),  # question answering: start | end score per token
        Rule(r"qa_outputs\.bias", (None,), "head"),
    )


# RobertaForCausalLM is a decoder (is_decoder): tokens.py gives it a causal mask built from the moved positions.

# BERT's stages under roberta.*, its MLM head lm_head.{dense,layer_norm} whole and lm_head.decoder (tied to the word
# embeddings) with its bias in chunks; position ids counted from padding_idx + 1
STAGES = (StageLayout("RobertaForMaskedLM", base="roberta", heads=(Head(("lm_head",)),), head_output="decoder",
                      **ENCODER_STAGES),
          # its classification head reads token 0 itself: dense, tanh, out_proj (a row per label); no pooler
          StageLayout("RobertaForSequenceClassification", base="roberta", heads=(Head(("classifier",), pooled=True),),
                      head_output="out_proj", **ENCODER_STAGES))


FAMILY = Family("roberta", ("roberta",), ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
                                          "RobertaForTokenClassification", "RobertaForQuestionAnswering",
                                          "RobertaForMultipleChoice", "RobertaForCausalLM"), geometry, rules,
                stages=STAGES)
