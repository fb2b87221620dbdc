"""T5 (encoder-decoder): RMSNorm without bias, no biases anywhere, a relative position bias per stack.

Decoder block i is layer n_encoder_layers + i (Rule.layer_offset), so the two stacks never share a space.
Each decoder block holds two attentions, self (layer.0) and cross (layer.1.EncDecAttention): both use the
block's q/k/v/o spaces, which is a symmetry of each on its own, so the pair moves together.
`relative_attention_bias` ([buckets, heads]) lives in block 0 of each stack and every self-attention
layer of that stack reads it: hence one head permutation per stack (Geometry.shared_head_bias), and no
token permutation at all (Geometry.relative_position_bias: the bias is read from sequence order).
The tied LM head (scaled by d_model^-0.5 before it) and untied ones (T5 v1.1) alike read the residual.
"""

from perm_core.engine.spec import Rule
from perm_core.families.base import Family, Geometry
from perm_core.families.stages import EncoderDecoderLayout

QKV = "qkv"


def geometry(config) -> Geometry:
    decoder = config.num_decoder_layers if config.is_encoder_decoder else 0  # T5EncoderModel: none
    return Geometry(config.d_model, config.num_layers + decoder, config.num_heads, config.num_heads, config.d_kv,
                    config.d_ff, rope=False, first_token_fixed=False, input_kind="seq2seq-text",
                    relative_position_bias=True, n_decoder_layers=decoder, shared_head_bias=True)


P = r"(?:transformer\.)?"  # T5ForSequenceClassification and T5ForTokenClassification keep their model there


def _stack_rules(stack: str, offset: int) -> tuple[Rule, ...]:
    block = P + rf"{stack}\.block\.(?P<layer>\d+)\.layer\."
    attentions = (r"0\.SelfAttention", r"1\.EncDecAttention") if stack == "decoder" else (r"0\.SelfAttention",)
    feed_forward = block + (r"2" if stack == "decoder" else r"1") + r"\.DenseReluDense\."
    return (
        *(Rule(block + rf"{attn}\.{x}\.weight", (x, "resid"), f"attn.{x}", offset)
          for attn in attentions for x in QKV),
        *(Rule(block + rf"{attn}\.o\.weight", ("resid", "o"), "attn.o", offset) for attn in attentions),
        # [buckets, heads]: one column per head, read by every self-attention layer of the stack.
        Rule(block + r"0\.SelfAttention\.relative_attention_bias\.weight", (None, "heads"), "position_bias", offset),
        Rule(block + r"\d\.layer_norm\.weight", ("resid",), "norm", offset),
        Rule(feed_forward + r"wi(?:_0|_1)?\.weight", ("mlp", "resid"), "mlp.in", offset),  # relu or gated
        Rule(feed_forward + r"wo\.weight", ("resid", "mlp"), "mlp.out", offset),
        Rule(P + rf"{stack}\.final_layer_norm\.weight", ("resid",), "norm"),
        Rule(P + rf"{stack}\.embed_tokens\.weight", (None, "resid"), "embedding"),  # when not tied to `shared`
    )


def rules(g: Geometry) -> tuple[Rule, ...]:
    return (
        Rule(P + r"shared\.weight", (None, "resid"), "embedding"),
        *_stack_rules("encoder", 0),
        *_stack_rules("decoder", g.n_layers - g.n_decoder_layers),
        Rule(r"lm_head\.weight", (None, "resid"), "head"),
        # T5ForSequenceClassification: the decoder's state at the last <eos> through dense, tanh (per channel),
        # out_proj. T5ForTokenClassification (encoder only): scores per encoder token. T5ForQuestionAnswering:
        # start | end scores per decoder token.
        Rule(r"classification_head\.dense\.weight", ("resid", "resid"), "head"),
        Rule(r"classification_head\.dense\.bias", ("resid",), "head"),
        Rule(r"classification_head\.out_proj\.weight", (None, "resid"), "head"),
        Rule(r"classification_head\.out_proj\.bias", (None,), "head"),
        Rule(r"(?:classifier|qa_outputs)\.weight", (None, "resid"), "head"),
        Rule(r"(?:classifier|qa_outputs)\.bias", (None,), "head"),
    )

# the shared token table -> the encoder's blocks (its final norm with the last) -> the decoder's (cross-attention
# on the encoder's normed output; its final norm with the last) -> lm_head
STAGES = EncoderDecoderLayout("T5ForConditionalGeneration")


FAMILY = Family("t5", ("t5",), ("T5Model", "T5ForConditionalGeneration", "T5EncoderModel",
                              "T5ForSequenceClassification", "T5ForTokenClassification", "T5ForQuestionAnswering"),
                geometry, rules,
                stages=(STAGES,))
