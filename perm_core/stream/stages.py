"""Where each streamed class keeps its stages (StageLayout), one declaration per class: the base model, its token
embedding, its list of blocks, its final norm, its heads (each a few modules of the class run in order, on the last
hidden state or on one token of it). perm_core.stream.layout runs them all with one engine: nothing in it names a
family or a class.
"""

from __future__ import annotations

from dataclasses import dataclass

from perm_core.families import Family, family_by_name
from perm_core.stream.shards import CheckpointError


@dataclass(frozen=True)
class Head:
    """One output of the head stage: modules of the class run in order on the last hidden state (or on one token of
    it), each one's output the next one's input."""

    modules: tuple[str, ...]  # dotted paths in the class (DistilBERT's vocab_transform, activation (the class's
    # own, a module without parameters), vocab_layer_norm, vocab_projector); the last holds the rows per vocabulary
    # entry (StageLayout.head_output)
    token: int | None = None  # the one token it reads (ViT's [CLS]): its output has no token axis
    output: str = "output.logits"  # its name in the whole-model trace (run.trace)


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
    heads: tuple[Head, ...] = (Head(("lm_head",)),)  # the output heads in the class, each run in vocabulary chunks
    # (none: a base model without a head, whose outputs are its last hidden state and its pooled output: the head
    # stage is only the final norm where it opens the head, and the pooler)
    logits_mean: bool = False  # the trace's output.logits is the mean of the heads' outputs, recorded before them
    # (DeiT's teacher class averages its [CLS] and distillation classifiers); else each head's output is its own
    head_output: str = ""  # the module in each head's last module (relative to it) whose weight has a row per
    # vocabulary entry or label (tied to the token table, or its own), read in chunks with its bias: every head's
    # the same number of rows, a chunk the same rows of each; the heads' other parameters whole
    pooled_token: int | None = None  # a headless model's pooled output: that token of its last hidden state
    # (DINOv2's)
    pooler: str | None = None  # a headless model's pooler in the base (BERT's dense + tanh on token 0), read whole
    built: tuple[str, ...] = ()  # the base's modules whose buffers are computed at construction (rotary
    # frequencies, BERT's position ids): built from the config on the CPU (a vocabulary that just holds the padding
    # row), buffers kept


_CAUSAL_LM = StageLayout("ForCausalLM", built=("rotary_emb",))  # embed_tokens -> layers -> norm -> lm_head
_BERT = {"blocks": "encoder.layer", "attention": "attention.self", "token_embedding": "embeddings.word_embeddings",
         "final_norm": None, "built": ("embeddings",)}
_DISTILBERT = {**_BERT, "blocks": "transformer.layer", "attention": "attention"}
# pixels -> patch projection, [CLS] token (DeiT's distillation token beside it) and position table -> layers -> the
# final layernorm (it opens the head: the trace's last hidden state is the last block's own output)
_VIT = {"attention": "attention", "token_embedding": None, "final_norm": "layernorm", "norm_opens_head": True}
_CLASSIFIER = (Head(("classifier",), token=0),)  # its rows, the labels, run as the vocabulary's are
# Each streamed family's streamed classes. A headless one (base ""): its outputs are the last hidden state and the
# pooled output, as the whole-model trace records them (output.last_hidden, output.pooler)
LAYOUTS: dict[str, tuple[StageLayout, ...]] = {
    "llama": (_CAUSAL_LM,), "mistral": (_CAUSAL_LM,), "qwen2": (_CAUSAL_LM,), "qwen3": (_CAUSAL_LM,),
    "gemma3": (_CAUSAL_LM,),
    "phi3": (_CAUSAL_LM,),  # fused qkv_proj and gate_up_proj inside its blocks: nothing of the stages changes
    # embed_in -> layers (a parallel residual, partial rotary) -> final_layer_norm -> lm_head (stored as embed_out
    # by old checkpoints, renamed on loading)
    "gpt_neox": (StageLayout("ForCausalLM", base="gpt_neox", attention="attention", token_embedding="embed_in",
                             final_norm="final_layer_norm", built=("rotary_emb",)),),
    # wte + wpe -> h -> ln_f -> lm_head (tied to wte)
    "gpt2": (StageLayout("GPT2LMHeadModel", base="transformer", blocks="h", attention="attn", token_embedding="wte",
                         final_norm="ln_f"),),
    "bert": (
        # embeddings (word rows, position and token-type tables, a norm) -> encoder.layer -> the MLM head's
        # transform and its decoder (tied to the word embeddings) with its own bias
        StageLayout("BertForMaskedLM", base="bert", heads=(Head(("cls.predictions",)),), head_output="decoder",
                    **_BERT),
        # the same -> encoder.layer -> the pooler (dense + tanh on token 0) beside the last hidden state
        StageLayout("BertModel", base="", heads=(), pooler="pooler", **_BERT)),
    # RoBERTa: BERT's layout under roberta.*, its MLM head lm_head.{dense,layer_norm} whole and lm_head.decoder
    # (tied to the word embeddings) with its bias in chunks; position ids counted from padding_idx + 1
    "roberta": (StageLayout("RobertaForMaskedLM", base="roberta", heads=(Head(("lm_head",)),), head_output="decoder",
                            **_BERT),),
    "distilbert": (
        # embeddings (word rows, position table, a norm) -> transformer.layer (no final norm) -> the MLM head: four
        # modules on the class, its projector tied to the word embeddings with its own bias
        StageLayout("DistilBertForMaskedLM", base="distilbert", **_DISTILBERT,
                    heads=(Head(("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector")),)),
        # the same, headless: the last hidden state alone (no pooler)
        StageLayout("DistilBertModel", base="", heads=(), **_DISTILBERT)),
    # ViT's stages -> the classifier on the [CLS] token
    "vit": (StageLayout("ViTForImageClassification", base="vit", heads=_CLASSIFIER, **_VIT),),
    "deit": (
        # the teacher class: a classifier on the [CLS] token and one on the distillation token, the logits their
        # mean; the trace records all three (output.logits, output.cls_logits, output.distillation_logits)
        StageLayout("DeiTForImageClassificationWithTeacher", base="deit", logits_mean=True,
                    heads=(Head(("cls_classifier",), token=0, output="output.cls_logits"),
                           Head(("distillation_classifier",), token=1, output="output.distillation_logits")),
                    **_VIT),
        StageLayout("DeiTForImageClassification", base="deit", heads=_CLASSIFIER, **_VIT)),  # one classifier
    # pixels -> embeddings -> encoder.layer -> the final layernorm, whose token 0 is the pooled output
    "dinov2": (StageLayout("Dinov2Model", base="", blocks="encoder.layer", heads=(), pooled_token=0, **_VIT),),
}
STREAMED_FAMILIES = tuple(LAYOUTS)


class StreamingUnsupportedError(CheckpointError):
    """A checkpoint of an architecture the streamed check does not run."""


# Encoder-decoders, streamed by stream.encoder_decoder's stages (two stacks: no StageLayout): family -> class
ENCODER_DECODERS = {"t5": "T5ForConditionalGeneration"}


def supported_summary() -> str:
    causal = [f for f, layouts in LAYOUTS.items() if layouts[0].head_class == "ForCausalLM"]
    others = [f"{layout.head_class} ({f})" for f, layouts in LAYOUTS.items() for layout in layouts
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
    layouts = LAYOUTS.get(found, ())
    # the family's layout of this class; a class named nowhere (a config without architectures): the first
    layout = next((lay for lay in layouts if name and name.endswith(lay.head_class)), layouts[0] if layouts else None)
    if not name and family is not None:  # a config written without architectures (the zoo's converted caches)
        name = next(c for c in family.classes if c.endswith(layout.head_class))
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if family is None or not name.endswith(layout.head_class) or name not in family.classes or cls is None:
        raise StreamingUnsupportedError(
            f"streaming supports {supported_summary()}; this checkpoint is {name or 'an unnamed class'} "
            f"(model_type {model_type!r})")
    return family.for_class(name), cls, layout
