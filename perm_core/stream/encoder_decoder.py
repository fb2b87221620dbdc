"""An encoder-decoder checkpoint (T5ForConditionalGeneration) as stages that run one at a time: a layout of the one
driver (stream.forward, stream.reverse, stream.check), which asks it what stream.layout's one stack answers.

Stages, in the order the model runs them: the shared token table (its rows looked up for the encoder's ids and the
decoder's), the encoder's blocks (the last one ending with the encoder's final norm: the whole-model trace records
the encoder's last hidden state normed), the decoder's blocks (self-attention under the causal mask, then
cross-attention on the encoder's normed output; the last one ending with the decoder's final norm), the lm_head in
vocabulary chunks (the decoder's output scaled by d_model**-0.5 first where the config says so, as the stock
forward does for a tied head).

The relative position bias: block 0 of each stack owns the table ([buckets, heads]) that every self-attention layer
of the stack reads as a bias. Each block's stage computes the bias from that table with the stock attention's own
compute_bias (deterministic: the same values block 0 hands on in the stock run), so each stage holds its own
input: its hidden state, the table (a few hundred numbers), and a decoder block's encoder output. Backward, a stage
gives a gradient for each of those inputs: the table's and the encoder output's are sums over the stages that
read them, accumulated as the stages run in reverse (stream.reverse.Sums).

Every block is given what the stock stack gives it (the masks built by transformers from the same inputs) from a
dry run of each stack's own forward stopped at its first block.
"""

from __future__ import annotations

import contextlib

import torch

from perm_core.families.stages import EncoderDecoderLayout
from perm_core.run import trace_names
from perm_core.run.stateless import functional_call
from perm_core.run.trace import TOKEN_RESID
from perm_core.stream.layout import BlockRecorder, StopAtBlock, StreamedModel, module_at
from perm_core.stream.shards import ShardReader
from perm_core.stream.stages import StreamingUnsupportedError, family_for, is_encoder_decoder

DECODER_RESID = (None, None, "resid")  # the decoder's tokens never move (engine.tokens)
STACKS = ("encoder", "decoder")


def streamed_model(directory, dtype: torch.dtype, reader: ShardReader | None = None) -> StreamedModel:
    """A checkpoint's streamed model: an encoder-decoder's stages, or one stack's (stream.layout)."""
    if is_encoder_decoder(reader.directory if reader is not None else directory):
        return EncoderDecoderModel(directory, dtype, reader)
    return StreamedModel(directory, dtype, reader)


class _Rows(torch.nn.Module):
    """Stands in for an embedding module: the given table, looked up as nn.Embedding looks it up."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(index, self.table)


class EncoderDecoderModel(StreamedModel):
    """An encoder-decoder checkpoint's architecture on the meta device, its parameters grouped into stages: the
    shared token table, each stack's blocks (a stack's final norm with its last block; its relative position table
    read by every block of the stack), the head. Blocks are numbered encoder first, then decoder, as the trace and
    Rule.layer_offset number them."""

    def __init__(self, directory, dtype: torch.dtype, reader: ShardReader | None = None):
        from transformers import AutoConfig

        raw = self._read_config(directory, reader)
        self.family, cls, self.layout = family_for(raw, EncoderDecoderLayout)
        self.config = AutoConfig.from_pretrained(self.reader.directory, local_files_only=True)
        self._instantiate(cls, dtype)
        self.prefix = ""
        self._claim_parameters()
        g = self.geometry
        self.n_layers, self.n_encoder = g.n_layers, g.n_layers - g.n_decoder_layers
        stored = {id(p): n for n, p in self.model.named_parameters()}
        layout = self.layout
        self.embed_name = stored[id(module_at(self.model, layout.token_embedding).weight)]
        self.head_name = stored[id(self._head_module().weight)]
        self.tied = self.head_name == self.embed_name
        self.head_chunked, self.head_whole, self.head_locals = [self.head_name], [], {"weight": self.head_name}
        self.head_norm_names, self.norm_names = [], []
        self.embedding_names = [self.embed_name]
        # does the stock forward scale the decoder's output before the head (a tied head: T5's)
        self.scale_output = bool(getattr(self.config, layout.scale_option, self.config.tie_word_embeddings))
        self.tables = {s: stored[id(module_at(self._first_block(s), layout.attention, layout.position_table).weight)]
                       for s in STACKS}
        self.final_norms = {s: [n for n in self.names if n.startswith(f"{s}.{layout.final_norm}.")] for s in STACKS}
        staged = {self.embed_name, self.head_name, *self.tables.values(),
                  *(n for names in self.final_norms.values() for n in names),
                  *(n for layer in range(self.n_layers) for n in self._own(layer))}
        unstaged = [n for n in self.names if n not in staged]
        if unstaged or not all(self.final_norms.values()):
            raise StreamingUnsupportedError(f"{self.cls_name} has {', '.join(unstaged) or 'a layout'} that no "
                                            "stage of a streamed check runs")
        self.encoder_layer = self.n_encoder - 1
        self.stack_starts = {0: trace_names.EMBED, self.n_encoder: trace_names.DECODER_EMBED}

    # --- the stages as the one driver walks them (stream.layout.StreamedModel's questions) ---

    embedding_axes = {trace_names.EMBED: TOKEN_RESID, trace_names.DECODER_EMBED: DECODER_RESID}
    tokens_move = False  # the decoder's tokens never move, and its blocks read every encoder token
    pixels = False

    def looked_up(self, kwargs: dict) -> list[int]:
        """The shared table's rows an input looks up, encoder's and decoder's ids together, ascending."""
        return sorted(set(kwargs["input_ids"].flatten().tolist()) | set(kwargs["decoder_input_ids"].flatten().tolist()))

    def hidden_axes(self, layer: int) -> tuple:
        return TOKEN_RESID if self.stack_of(layer)[0] == "encoder" else DECODER_RESID

    def block_axes(self, layer: int) -> dict[str, tuple]:
        """Its output, its self-attention probabilities (the encoder's tokens move along both token axes, the
        decoder's not) and a decoder block's cross-attention probabilities [B, H, decoder T, encoder T]."""
        heads = ("heads", layer)
        if self.stack_of(layer)[0] == "encoder":
            return {trace_names.hidden(layer): TOKEN_RESID, trace_names.attn(layer): (None, heads, "tokens", "tokens")}
        return {trace_names.hidden(layer): DECODER_RESID, trace_names.attn(layer): (None, heads, None, None),
                trace_names.cross_attn(layer): (None, heads, None, "tokens")}

    def grad_in(self, layer: int) -> str:
        """The encoder's first block's input is the model's input; the decoder's first block's is its embedding."""
        stack, index = self.stack_of(layer)
        if index:
            return trace_names.grad(trace_names.hidden(layer - 1))
        return trace_names.GRAD_INPUT if stack == "encoder" else trace_names.grad(trace_names.DECODER_EMBED)

    def summed(self, layer: int) -> list[str]:
        """Its stack's relative position table (block 0's), read by every block of the stack."""
        return [self.table(layer)]

    # --- where the stages' parameters are ---

    def stack_of(self, layer: int) -> tuple[str, int]:
        """(the stack, the block's index in it) of trace block `layer`."""
        return ("encoder", layer) if layer < self.n_encoder else ("decoder", layer - self.n_encoder)

    def _stack(self, stack: str, stock: bool = False) -> torch.nn.Module:
        return getattr(self.stock if stock else self.model, stack)

    def _own(self, layer: int) -> list[str]:
        stack, index = self.stack_of(layer)
        return [n for n in self.names if n.startswith(f"{stack}.{self.layout.blocks}.{index}.")
                and n != self.tables[stack]]

    def last_of_stack(self, layer: int) -> bool:
        return layer in (self.n_encoder - 1, self.n_layers - 1)

    def block_names(self, layer: int) -> list[str]:
        """A block's parameters (its stack's final norm with the last; its stack's position table apart: table)."""
        stack, _ = self.stack_of(layer)
        return self._own(layer) + (self.final_norms[stack] if self.last_of_stack(layer) else [])

    def table(self, layer: int) -> str:
        """The relative position table that block `layer` reads (its stack's block 0's)."""
        return self.tables[self.stack_of(layer)[0]]

    @property
    def output_axes(self) -> dict[str, tuple]:
        return {trace_names.LOGITS: (None, None, None)}  # one row per decoder token: no axis moves

    # --- what the blocks are given ---

    def layer_kwargs(self, kwargs: dict, stock: bool = False) -> list[dict]:
        """Each block's keyword arguments besides its hidden state, position bias and encoder output, when the
        model runs on `kwargs` (model inputs): a dry run of each stack's own forward on zero embeddings, stopped at
        its first block (every block of a stack is given the same)."""
        found = {}
        encoder_embeds = torch.zeros((*kwargs["input_ids"].shape, self.geometry.d_model), dtype=self.dtype)
        decoder_ids = kwargs["decoder_input_ids"]
        calls = {"encoder": {"inputs_embeds": encoder_embeds, "attention_mask": kwargs.get("attention_mask")},
                 "decoder": {"inputs_embeds": torch.zeros((*decoder_ids.shape, self.geometry.d_model),
                                                          dtype=self.dtype),
                             "attention_mask": kwargs.get("decoder_attention_mask"),
                             "encoder_hidden_states": encoder_embeds,
                             "encoder_attention_mask": kwargs.get("attention_mask"), "use_cache": False}}
        for stack, call in calls.items():
            module = self._stack(stack, stock)
            sink: list = [None]
            recorder = BlockRecorder(sink, 0, self._first_block(stack, stock), stop=True)
            with self._swapped(module, {self.layout.blocks: torch.nn.ModuleList([recorder])}), \
                    contextlib.suppress(StopAtBlock):
                module(**call)
            found[stack] = {k: v for k, v in sink[0].items()
                            if k not in ("position_bias", "encoder_hidden_states", "encoder_decoder_position_bias")}
        return [found[self.stack_of(layer)[0]] for layer in range(self.n_layers)]

    # --- running the stages ---

    def embed(self, weights: dict[str, torch.Tensor], looked_up: list[int], kwargs: dict, stock: bool = False
              ) -> dict[str, torch.Tensor]:
        """The embedding stage: the encoder's first block input and the decoder's (embedding_axes), each stack's own
        token lookup (tied to the shared table) and dropout on its ids, with the looked-up rows of `weights` only."""
        position = {token: i for i, token in enumerate(looked_up)}
        rows = weights[self.embed_name]
        found = {}
        for stack, ids in (("encoder", kwargs["input_ids"]), ("decoder", kwargs["decoder_input_ids"])):
            module = self._stack(stack, stock)
            local = ids.clone().apply_(position.__getitem__)
            lookup = module_at(module, self.layout.stack_embedding)
            found[trace_names.embed("" if stack == "encoder" else trace_names.DECODER)] = module.dropout(
                functional_call(lookup, {"weight": rows}, args=(local,)))
        return found

    def position_bias(self, layer: int, table: torch.Tensor, length: int, stock: bool = False) -> torch.Tensor:
        """The relative position bias [1, heads, length, length] that block `layer`'s self-attention adds: its
        stack's block 0 attention's own compute_bias, on `table`."""
        stack, _ = self.stack_of(layer)
        attention = module_at(self._first_block(stack, stock), self.layout.attention)
        with self._swapped(attention, {self.layout.position_table: _Rows(table)}):
            return attention.compute_bias(length, length, device=table.device)

    def block(self, layer: int, weights: dict[str, torch.Tensor], hidden: torch.Tensor, kwargs: dict,
              encoder_out: torch.Tensor | None = None, stock: bool = False) -> dict[str, torch.Tensor | None]:
        """block_axes' tensors: the block's output (normed when it is its stack's last), its self-attention
        probabilities and a decoder block's cross-attention probabilities (None for the stock model), its stack's
        position table among `weights`; a decoder block reads `encoder_out`."""
        stack, index = self.stack_of(layer)
        base = self._stack(stack, stock)
        module = module_at(base, self.layout.blocks)[index]
        prefix, table = f"{stack}.{self.layout.blocks}.{index}.", weights[self.table(layer)]
        local = {n[len(prefix):]: w for n, w in weights.items() if n.startswith(prefix) and n != self.table(layer)}
        box: dict = {}
        hooked = [("attn", self.layout.self_attention)] + ([("cross", self.layout.cross_attention)]
                                                           if stack == "decoder" else [])
        handles = [module_at(module, path).register_forward_hook(
            lambda m, a, out, kind=kind: box.__setitem__(kind, out[-1])) for kind, path in hooked]
        call = {**kwargs, "position_bias": self.position_bias(layer, table, hidden.shape[1], stock)}
        if stack == "decoder":
            call["encoder_hidden_states"] = encoder_out
        try:
            out = functional_call(module, local, args=(hidden,), kwargs=call, strict=False)[0]
        finally:
            for handle in handles:
                handle.remove()
        if self.last_of_stack(layer):
            norm = f"{stack}.{self.layout.final_norm}."
            out = base.dropout(functional_call(module_at(base, self.layout.final_norm),
                                               {n[len(norm):]: weights[n] for n in self.final_norms[stack]},
                                               args=(out,), strict=False))
        names = list(self.block_axes(layer))
        return dict(zip(names, (out, box.get("attn"), box.get("cross")), strict=False))

    def head(self, chunk: dict[str, torch.Tensor], whole: dict[str, torch.Tensor], normed: torch.Tensor,
             stock: bool = False, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The logits of the vocabulary rows in `chunk` on the decoder's normed output (scaled first where the
        stock forward scales it); `whole` is empty (T5's head has no other parameter), `ids` unread (every decoder
        token has its logits)."""
        if self.scale_output:
            normed = normed * (self.config.d_model ** -0.5)
        return {trace_names.LOGITS: functional_call(self._head_module(stock), {"weight": chunk[self.head_name]},
                                                 args=(normed,), strict=False)}

    def _head_module(self, stock: bool = False) -> torch.nn.Module:
        return module_at(self.stock if stock else self.model, self.layout.head)

    def _first_block(self, stack: str, stock: bool = False) -> torch.nn.Module:
        return module_at(self._stack(stack, stock), self.layout.blocks)[0]

