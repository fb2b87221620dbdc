"""Where each streamed family's class keeps its stages (StageLayout), one declaration per class: the base model,
its token embedding, its list of blocks, its final norm, the head. perm_core.stream.layout runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from perm_core.families import Family, family_by_name
from perm_core.stream.shards import CheckpointError


@dataclass(frozen=True)
class StageLayout:
    """Where a family's streamed class keeps its stages: attribute names of the stock transformers modules."""

    head_class: str  # the class streamed: its name, or how its name ends
    base: str = "model"  # the base model in the class: its parameters are named "{base}.*" ("": the class is the
    # base model itself, a headless one)
    blocks: str = "layers"  # the base's list of blocks (a dotted path), each taking (hidden, **what the base gives)
    attention: str = "self_attn"  # a block's attention module: the second item of its output is the probabilities
    token_embedding: str | None = "embed_tokens"  # the base's token table, read at the looked-up rows only (None:
    # an image model, which looks nothing up); the base's other parameters outside its blocks and final norm
    # (position embeddings, a norm, a patch projection and [CLS] token) are the embedding's, read whole
    final_norm: str | None = "norm"  # the base's final norm, run at the end of the last block's stage (or none)
    norm_opens_head: bool = False  # the final norm runs as the head's first step instead: the whole-model trace
    # records the last block's own output as its last hidden state (ViT)
    head: str | None = "lm_head"  # the output head in the class, run in vocabulary chunks (None: a base model
    # without a head, whose outputs are its last hidden state and its pooled output: the head stage is only the
    # final norm where it opens the head, and the pooler)
    head_token: int | None = None  # the one token the head reads (ViT's [CLS]): its logits have no token axis; a
    # headless model's pooled output is that token of its last hidden state (DINOv2's)
    pooler: str | None = None  # a headless model's pooler in the base (BERT's dense + tanh on token 0), read whole
    head_output: str = ""  # the head's module (relative to `head`) whose weight has a row per vocabulary entry
    # (tied to the token table, or its own), read in chunks with its bias; the head's other parameters whole
    built: tuple[str, ...] = ()  # the base's modules whose buffers are computed at construction (rotary
    # frequencies, BERT's position ids): built from the config on the CPU (a vocabulary that just holds the padding
    # row), buffers kept


_CAUSAL_LM = StageLayout("ForCausalLM", built=("rotary_emb",))  # embed_tokens -> layers -> norm -> lm_head
LAYOUTS: dict[str, StageLayout] = {
    "llama": _CAUSAL_LM, "mistral": _CAUSAL_LM, "qwen2": _CAUSAL_LM, "qwen3": _CAUSAL_LM, "gemma3": _CAUSAL_LM,
    "phi3": _CAUSAL_LM,  # fused qkv_proj and gate_up_proj inside its blocks: nothing of the stages changes
    # embed_in -> layers (a parallel residual, partial rotary) -> final_layer_norm -> lm_head (stored as embed_out
    # by old checkpoints, renamed on loading)
    "gpt_neox": StageLayout("ForCausalLM", base="gpt_neox", attention="attention", token_embedding="embed_in",
                            final_norm="final_layer_norm", built=("rotary_emb",)),
    # wte + wpe -> h -> ln_f -> lm_head (tied to wte)
    "gpt2": StageLayout("GPT2LMHeadModel", base="transformer", blocks="h", attention="attn", token_embedding="wte",
                        final_norm="ln_f"),
    # embeddings (word rows, position and token-type tables, a norm) -> encoder.layer -> the MLM head's transform
    # and its decoder (tied to the word embeddings) with its own bias
    "bert": StageLayout("BertForMaskedLM", base="bert", blocks="encoder.layer", attention="attention.self",
                        token_embedding="embeddings.word_embeddings", final_norm=None, head="cls.predictions",
                        head_output="decoder", built=("embeddings",)),
    # RoBERTa: BERT's layout under roberta.*, its MLM head lm_head.{dense,layer_norm} whole and lm_head.decoder
    # (tied to the word embeddings) with its bias in chunks; position ids counted from padding_idx + 1
    "roberta": StageLayout("RobertaForMaskedLM", base="roberta", blocks="encoder.layer", attention="attention.self",
                           token_embedding="embeddings.word_embeddings", final_norm=None, head="lm_head",
                           head_output="decoder", built=("embeddings",)),
    # pixels -> patch projection, [CLS] token and position table -> layers -> the final layernorm, then the
    # classifier on the [CLS] token (its rows, the labels, run as the vocabulary's are)
    "vit": StageLayout("ViTForImageClassification", base="vit", attention="attention", token_embedding=None,
                       final_norm="layernorm", norm_opens_head=True, head="classifier", head_token=0),
    # DeiT's one-classifier class: ViT's stages, a distillation token beside the [CLS] token in the embedding (the
    # teacher class, which averages two classifiers on tokens 0 and 1, is not streamed: its head reads two tokens)
    "deit": StageLayout("DeiTForImageClassification", base="deit", attention="attention", token_embedding=None,
                        final_norm="layernorm", norm_opens_head=True, head="classifier", head_token=0),
}
# Base models without a head (a family's second streamed class): their outputs are the last hidden state and the
# pooled output, as the whole-model trace records them (output.last_hidden, output.pooler)
BASE_LAYOUTS: dict[str, StageLayout] = {
    # embeddings -> encoder.layer -> the pooler (dense + tanh on token 0) beside the last hidden state
    "bert": StageLayout("BertModel", base="", blocks="encoder.layer", attention="attention.self",
                        token_embedding="embeddings.word_embeddings", final_norm=None, head=None, pooler="pooler",
                        built=("embeddings",)),
    # pixels -> embeddings -> encoder.layer -> the final layernorm (the trace's hidden states are the blocks' own
    # outputs: the norm opens the head stage), whose token 0 is the pooled output
    "dinov2": StageLayout("Dinov2Model", base="", blocks="encoder.layer", attention="attention",
                          token_embedding=None, final_norm="layernorm", norm_opens_head=True, head=None, head_token=0),
    # embeddings (word rows, position table, a norm) -> transformer.layer: the last hidden state alone (no pooler,
    # no final norm; the zoo's masked LM, whose head is four modules on the class, is not streamed)
    "distilbert": StageLayout("DistilBertModel", base="", blocks="transformer.layer", attention="attention",
                              token_embedding="embeddings.word_embeddings", final_norm=None, head=None,
                              built=("embeddings",)),
}
STREAMED_FAMILIES = tuple(dict.fromkeys([*LAYOUTS, *BASE_LAYOUTS]))


class StreamingUnsupportedError(CheckpointError):
    """A checkpoint of an architecture the streamed check does not run."""


# Encoder-decoders, streamed by stream.encoder_decoder's stages (two stacks: no StageLayout): family -> class
ENCODER_DECODERS = {"t5": "T5ForConditionalGeneration"}


def supported_summary() -> str:
    causal = [f for f, layout in LAYOUTS.items() if layout.head_class == "ForCausalLM"]
    others = [f"{layout.head_class} ({f})" for f, layout in [*LAYOUTS.items(), *BASE_LAYOUTS.items()]
              if layout.head_class != "ForCausalLM"]
    others += [f"{cls} ({f})" for f, cls in ENCODER_DECODERS.items()]
    return f"the causal language models of {', '.join(causal)}" + "".join(f"; {o}" for o in others)


def family_for(config: dict) -> tuple[Family, type, StageLayout]:
    """The family, the transformers class and the stage layout of a checkpoint's config (a streamed family's
    streamed class)."""
    import transformers

    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    name = architectures[0] if architectures and isinstance(architectures[0], str) else ""
    found = next((f for f in STREAMED_FAMILIES if model_type in family_by_name(f).model_types), None)
    family = family_by_name(found) if found is not None else None
    layouts = [d[found] for d in (LAYOUTS, BASE_LAYOUTS) if found in d]
    # the family's layout of this class (a base model's, or its head's); a class named nowhere: the first
    layout = next((lay for lay in layouts if name and name.endswith(lay.head_class)), layouts[0] if layouts else None)
    if not name and family is not None:  # a config written without architectures (the zoo's converted caches)
        name = next(c for c in family.classes if c.endswith(layout.head_class))
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if family is None or not name.endswith(layout.head_class) or name not in family.classes or cls is None:
        raise StreamingUnsupportedError(
            f"streaming supports {supported_summary()}; this checkpoint is {name or 'an unnamed class'} "
            f"(model_type {model_type!r})")
    return family.for_class(name), cls, layout
