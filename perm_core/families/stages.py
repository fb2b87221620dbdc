"""Where a family's classes keep their stages, the words each family file declares them in: the base model, its token
embedding, its list of blocks, its final norm, its heads (each a few modules of the class run in order, on the last
hidden state or on one token of it), or for an encoder-decoder its two stacks. perm_core.stream runs every layout
with one engine and names no family and no class: a family's stages are declared in its own file, beside its rules.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    """A head's step that the class's forward applies inline, not as a module of the class: the function of that
    name in torch.nn.functional (DistilBERT's classifier applies nn.ReLU() made on the spot)."""

    name: str


LAST_NON_PADDING = "last non-padding"  # Head.token: each row's last token that is no padding


@dataclass(frozen=True)
class Head:
    """One output of the head stage: modules of the class run in order on the last hidden state (or on one token of
    it), each one's output the next one's input."""

    modules: tuple[str | Function, ...]  # dotted paths in the class (DistilBERT's vocab_transform, activation (the
    # class's own, a module without parameters), vocab_layer_norm, vocab_projector), or functions its forward applies
    # inline; the last holds the rows per vocabulary entry (StageLayout.head_output)
    token: int | str | None = None  # the one token it reads, before its modules (ViT's [CLS]); LAST_NON_PADDING:
    # its modules' output at each row's last token that is no padding, found as transformers' sequence classifiers
    # find it (from the row's ids and the config's pad_token_id; the last token without one). Either way its output
    # has no token axis
    output: str = "logits"  # its output field: the whole-model trace records it as trace_names.output(output)
    pooled: bool = False  # its first module reads one token of the last hidden state itself (BERT's pooler,
    # RoBERTa's classification head: token 0): its output has no token axis

    @property
    def per_token(self) -> bool:
        """Whether its output has one entry per token (a token axis)."""
        return self.token is None and not self.pooled


@dataclass(frozen=True)
class StageLayout:
    """Where one streamed class of a family keeps its stages: attribute names of the stock transformers modules."""

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


@dataclass(frozen=True)
class EncoderDecoderLayout:
    """Where an encoder-decoder class keeps its stages: one token table shared by both stacks and the head, each
    stack's blocks with one relative position table (read by every block of the stack) and a final norm."""

    head_class: str  # the class streamed, by its full name
    token_embedding: str = "shared"  # the shared token table, read at the looked-up rows only
    head: str = "lm_head"  # the head's rows per vocabulary entry (tied to the token table, or its own), no bias
    stacks: tuple[str, ...] = ("encoder", "decoder")  # the encoder first: the trace numbers its blocks first
    blocks: str = "block"  # a stack's list of blocks
    stack_embedding: str = "embed_tokens"  # a stack's own token lookup (the shared table), then its dropout
    final_norm: str = "final_layer_norm"  # a stack's final norm, run at the end of its last block's stage
    self_attention: str = "layer.0"  # a block's self-attention layer: the last item of its output is the
    # probabilities
    attention: str = "layer.0.SelfAttention"  # in it, the attention whose compute_bias turns the position table
    # into the bias its scores add
    position_table: str = "relative_attention_bias"  # in block 0's attention: its stack's relative position table
    cross_attention: str = "layer.1"  # a decoder block's cross-attention layer (its output's last item as above)
    scale_option: str = "scale_decoder_outputs"  # the config's flag for scaling the decoder's output before the
    # head (by d_model ** -0.5); absent, a tied head scales it


CAUSAL_LM = StageLayout("ForCausalLM", built=("rotary_emb",))  # embed_tokens -> layers -> norm -> lm_head
# the same stages, then score (a row per label) on every token, read at each row's last token that is no padding
SEQUENCE_CLASSIFIER = StageLayout("ForSequenceClassification", heads=(Head(("score",), token=LAST_NON_PADDING),),
                                  built=("rotary_emb",))
