"""A checkpoint's model as stages that run one at a time: the embedding, each block, the output head.

Each streamed family declares where its class keeps these stages (perm_core.stream.stages: the base model, its token
embedding, its list of blocks, its final norm, the head); everything else is the stock modules of transformers.
The architecture is instantiated once on the meta device (no memory), with the same exact numerics a loaded model
gets (perm_core.run.numerics); a stage runs its stock module through functional_call with weights read for it
alone. The embedding stage is the base model's own forward up to its first block (token rows looked up, position
embeddings added, as the stock code does; an image model's on its pixels, every embedding parameter read whole:
patch projection, [CLS] token, position table), stopped there. What a block takes besides its hidden state (rotary
position embeddings, the attention mask of its layer type) is found by a dry run of the stock base model's own
forward, whose blocks only record what they are given: the masks and positions are then built by transformers
itself from the same inputs the whole-model check passes. The last block ends with the final norm where the
whole-model trace records it so ("blocks.{L-1}.hidden" is normed); where it does not (ViT), the norm opens the head.
The head stage itself is stream.head_modules' (OneStackHead).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json

import torch

from perm_core.engine.spec import UnclaimedParameterError
from perm_core.families.stages import StageLayout
from perm_core.run import trace_names
from perm_core.run.numerics import use_exact_numerics
from perm_core.run.stateless import functional_call
from perm_core.run.trace import TOKEN_RESID
from perm_core.stream.head_modules import OneStackHead, module_at
from perm_core.stream.shards import CheckpointError, ShardReader
from perm_core.stream.stages import StreamingUnsupportedError, family_for


class StopAtBlock(Exception):
    """Ends a dry run or an embedding stage at the block it has what it needs of."""


class BlockRecorder(torch.nn.Module):
    """Stands in for a block in a dry run: keeps what it is given besides its hidden state (positional arguments
    named as the block's own forward names them), and the hidden state itself; stops the run where told."""

    def __init__(self, sink: list, index: int, block: torch.nn.Module, stop: bool = False):
        super().__init__()
        self.sink, self.index, self.stop = sink, index, stop
        self.signature = inspect.signature(type(block).forward)
        if getattr(block, "attention_type", None) is not None:
            self.attention_type = block.attention_type

    def forward(self, hidden_states, *args, **kwargs):
        bound = self.signature.bind(None, hidden_states, *args, **kwargs).arguments
        names = list(self.signature.parameters)
        given = {k: v for k, v in bound.items() if k not in names[:2]
                 and self.signature.parameters[k].kind != inspect.Parameter.VAR_KEYWORD}
        extra = next((bound[k] for k, p in self.signature.parameters.items()
                      if p.kind == inspect.Parameter.VAR_KEYWORD and k in bound), {})
        recorded = {**given, **extra}
        for name, value in (("past_key_values", None), ("use_cache", False)):
            if name in recorded or name in self.signature.parameters:
                recorded[name] = value
        self.sink[self.index] = recorded
        self.hidden = hidden_states
        if self.stop:
            raise StopAtBlock
        return hidden_states


class StreamedModel(OneStackHead):
    """One checkpoint directory's architecture on the meta device, and its parameters grouped into stages."""

    def __init__(self, directory, dtype: torch.dtype, reader: ShardReader | None = None):
        from transformers import AutoConfig

        raw = self._read_config(directory, reader)
        self.family, cls, self.layout = family_for(raw, StageLayout)
        self.config = AutoConfig.from_pretrained(self.reader.directory, local_files_only=True)
        if getattr(self.config, "final_logit_softcapping", None) is not None:
            raise StreamingUnsupportedError("streaming does not run heads with logit soft-capping")
        self._instantiate(cls, dtype)
        for meta in (self.model, self.stock):  # buffers computed at construction must be real
            for path in self.layout.built:
                module = module_at(module_at(meta, self.layout.base), path)
                config = copy.deepcopy(meta.config)
                if hasattr(config, "vocab_size"):  # its parameters are the checkpoint's: only the buffers are wanted
                    config.vocab_size = (getattr(config, "pad_token_id", None) or 0) + 1  # (RoBERTa's padding row)
                real = type(module)(config)
                for name, buffer in real.named_buffers():
                    owner, _, leaf = name.rpartition(".")
                    setattr(module_at(module, owner) if owner else module, leaf, buffer)
        self.prefix = f"{self.layout.base}." if self.layout.base else ""
        self._claim_parameters()
        self.n_layers = self.geometry.n_layers
        table = self.layout.token_embedding
        self.embed_name = f"{self.prefix}{table}.weight" if table is not None else None
        self.pixels = self.embed_name is None  # an image model: its input is pixels, it looks up no rows
        norm = self.layout.final_norm
        norm_names = [n for n in self.names if norm is not None and n.startswith(f"{self.prefix}{norm}.")]
        # the final norm's parameters: at the end of the last block's stage, or at the head's start
        self.norm_names = [] if self.layout.norm_opens_head else norm_names
        self.head_norm_names = norm_names if self.layout.norm_opens_head else []
        blocks = f"{self.prefix}{self.layout.blocks}."
        # the head stage's parameters: each of its modules' (a headless model's pooler's), by the module's path in
        # the class and the parameter's name in it (a tied one under its stored name)
        stored = {id(p): name for name, p in self.model.named_parameters()}
        self.head_params = {path: {local: stored[id(p)] for local, p in module.named_parameters(remove_duplicate=False)}
                            for path, module in self._head_modules().items()}
        head_names = list(dict.fromkeys(n for params in self.head_params.values() for n in params.values()))
        # the embedding stage's parameters: the base's own outside its blocks, final norm and pooler, the token
        # table first
        self.embedding_names = [n for n in [self.embed_name] if n is not None] + [
            n for n in self.names if n.startswith(self.prefix) and not n.startswith(blocks)
            and n not in norm_names and n != self.embed_name and n not in head_names]
        # each head's rows per vocabulary entry (or label): its last module's head_output, weight and bias, read in
        # chunks, the first head's weight first (a headless model has none); the head's other parameters whole
        output = f"{self.layout.head_output}." if self.layout.head_output else ""
        last = [self.head_params[head.modules[-1]] for head in self.layout.heads]
        self.head_name = last[0][f"{output}weight"] if last else None
        self.head_chunked = sorted(dict.fromkeys(
            n for params in last for local, n in params.items()
            if local.startswith(output) and local.count(".") == output.count(".")), key=lambda n: n != self.head_name)
        self.head_whole = self.head_norm_names + [n for n in head_names if n not in self.head_chunked]
        self.tied = self.head_name is not None and self.head_name == self.embed_name
        staged = set(self.embedding_names) | set(norm_names) | set(head_names)
        unstaged = [n for n in self.names if n not in staged and not n.startswith(blocks)]
        vocab = self.reader.entries[self.head_name].shape[0] if self.head_name is not None else 0
        if (unstaged or (table is not None and self.embed_name not in self.names)
                or (norm is not None and not norm_names)
                or any(self.reader.entries[n].shape[0] != vocab for n in self.head_chunked)):
            raise StreamingUnsupportedError(f"{self.cls_name} has {', '.join(unstaged) or 'a layout'} that no "
                                            "stage of a streamed check runs")

    def _read_config(self, directory, reader: ShardReader | None) -> dict:
        """Opens the checkpoint (self.reader) and returns its config.json as read, before any class is chosen."""
        self.reader = reader or ShardReader(directory)
        try:
            return json.loads((self.reader.directory / "config.json").read_text())
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{self.reader.directory}/config.json is not readable JSON ({error})") from None

    def _instantiate(self, cls: type, dtype: torch.dtype) -> None:
        """`cls` on the meta device twice, from self.config and self.family: the traced copy under exact numerics
        (perm_core.run.numerics) and the stock copy with its own attention setting, sdpa where transformers has it
        for the class, else eager (stock_attention says which; the oracle reports it)."""
        self.dtype, self.cls_name = dtype, cls.__name__
        self.geometry = self.family.geometry(self.config)
        self.spec = self.family.spec(self.config)
        with torch.device("meta"):
            self.model = cls(self.config).to(dtype).eval()
            self.stock = cls(copy.deepcopy(self.config)).to(dtype).eval()  # its own attention setting
        use_exact_numerics(self.model)
        if getattr(self.stock.config, "_experts_implementation", None) not in (None, "eager"):
            self.stock.set_experts_implementation("eager")  # as the loaded model's (grouped_mm refuses float64)
        try:
            self.stock.set_attn_implementation("sdpa")
            self.stock_attention = "sdpa"
        except (ValueError, ImportError):
            self.stock.set_attn_implementation("eager")
            self.stock_attention = "eager"

    def _claim_parameters(self) -> None:
        """The class's parameter names (self.names), the checkpoint's tensors renamed to them and checked against
        them, and each one's claim by the family's spec: a parameter no rule claims is a checkpoint error here."""
        self.names = [name for name, _ in self.model.named_parameters()]
        self._rename_stored()
        self._check_names()
        try:
            self.claims = self.spec.claim_all(self.names)
        except UnclaimedParameterError as error:
            raise CheckpointError(str(error)) from None

    # --- the stages as the one driver walks them (stream.forward, stream.reverse): one stack here; an
    # encoder-decoder's two (stream.encoder_decoder) answer the same questions ---

    embedding_axes = {trace_names.EMBED: TOKEN_RESID}  # the embedding stage's outputs, one per stack
    stack_starts = {0: trace_names.EMBED}  # block -> the embedding output it starts its stack from
    encoder_layer: int | None = None  # the block whose output every later block also reads (an encoder's last)
    tokens_move = True  # a token permutation moves every stage's tokens

    def looked_up(self, kwargs: dict) -> list[int]:
        """The token table's rows model inputs `kwargs` read, ascending (an image model: none)."""
        return [] if self.pixels else sorted(set(kwargs["input_ids"].flatten().tolist()))

    def hidden_axes(self, layer: int) -> tuple:
        """Block `layer`'s input and output hidden state."""
        return TOKEN_RESID

    def block_axes(self, layer: int) -> dict[str, tuple]:
        """The forward tensors block `layer` records (its output first), with their axes."""
        heads = ("heads", layer)
        return {trace_names.hidden(layer): TOKEN_RESID, trace_names.attn(layer): (None, heads, "tokens", "tokens")}

    def grad_in(self, layer: int) -> str:
        """The gradient at block `layer`'s input: the embedding output's for block 0 of an image model, the model
        input's for text (its embedding output is the input the whole-model trace differentiates)."""
        if layer:
            return trace_names.grad(trace_names.hidden(layer - 1))
        return trace_names.grad(trace_names.EMBED) if self.pixels else trace_names.GRAD_INPUT

    def summed(self, layer: int) -> list[str]:
        """Parameters block `layer` reads besides its own whose gradients are sums over several blocks."""
        return []

    def stage_names(self, layer: int) -> list[str]:
        """Every parameter block `layer`'s stage reads."""
        return self.block_names(layer) + self.summed(layer)

    def places(self) -> dict:
        """What first_break needs (verify.subject.Subject.places): the blocks, each parameter's block, the embedding's
        parameters, and where a decoder's blocks begin."""
        return {"n_layers": self.n_layers,
                "parameter_layers": {name: claim.layer for name, claim in self.claims.items()},
                "embedding_parameters": frozenset(n for n, c in self.claims.items() if c.rule.tag == "embedding"),
                "first_decoder_layer": None if self.encoder_layer is None else self.encoder_layer + 1}

    def _rename_stored(self) -> None:
        """The checkpoint's tensors under the class's parameter names, as transformers renames them on loading (its
        conversion mapping: ViT's stored encoder.layer.N.attention.attention.query is layers.N.attention.q_proj); a
        parameter that loading assembles from several stored tensors (a mixture of experts' experts, stored one per
        expert) is read as transformers assembles it (stream.fused)."""
        if self.reader.stored or self.reader.fused_into:
            return  # renamed already (a reader shared with another StreamedModel)
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        from perm_core.stream.fused import fused_parameters

        transforms = get_model_conversion_mapping(self.model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        state = self.model.state_dict()
        mapping, groups = {}, {}
        for stored in self.reader.names():
            name, converted = rename_source_key(stored, renamings, converters, self.model.base_model_prefix, state)
            if converted is not None:
                groups.setdefault(name, []).append((stored, converted))
            else:
                mapping[stored] = name
        self.reader.rename(mapping)
        if groups:
            self.reader.fuse(fused_parameters(self.model, groups, converters,
                                              lambda stored: self.reader.entries[stored].dtype))

    def _check_names(self) -> None:
        """Every parameter of the class in the checkpoint, and nothing else but the class's buffers."""
        present = set(self.reader.names())
        missing = [n for n in self.names if n not in present]
        buffers = {name for name, _ in self.model.named_buffers()}
        unknown = sorted(present - set(self.names) - buffers)
        if missing:
            raise CheckpointError(f"{self.reader.directory} lacks parameter {missing[0]} of {self.cls_name}"
                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        if unknown:
            raise CheckpointError(f"{self.reader.directory} holds {unknown[0]}, which is no parameter of "
                                  f"{self.cls_name}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))

    def _base(self, stock: bool = False) -> torch.nn.Module:
        return module_at(self.stock if stock else self.model, self.layout.base)

    def _blocks(self, stock: bool = False) -> torch.nn.ModuleList:
        return module_at(self._base(stock), self.layout.blocks)

    def block_names(self, layer: int) -> list[str]:
        own = [n for n in self.names if n.startswith(f"{self.prefix}{self.layout.blocks}.{layer}.")]
        return own + (self.norm_names if layer == self.n_layers - 1 else [])

    def read(self, names) -> dict[str, torch.Tensor]:
        """The named tensors in the checked dtype."""
        return {name: self.reader.read(name, self.dtype) for name in names}

    def embedding_weights(self, looked_up: list[int]) -> dict[str, torch.Tensor]:
        """The embedding stage's weights: the token table's looked-up rows, its other parameters whole."""
        return {name: self.reader.rows(name, looked_up, self.dtype) if name == self.embed_name
                else self.reader.read(name, self.dtype) for name in self.embedding_names}

    def embedding_bytes(self, looked_up: list[int]) -> int:
        rows = len(looked_up) * self.geometry.d_model * self.dtype.itemsize
        return rows + self.bytes_of([n for n in self.embedding_names if n != self.embed_name])

    def bytes_of(self, names) -> int:
        return sum(self.reader.entries[n].numel * self.dtype.itemsize for n in names)

    # --- what the blocks are given ---

    def layer_kwargs(self, kwargs: dict, stock: bool = False) -> list[dict]:
        """Each block's keyword arguments when the base model's forward runs on `kwargs` (the whole-model check's
        model inputs, or the raw ones for the stock model): a dry run in which every block only records, and the
        last one stops the run (the embedding's other parameters are zeros here: the blocks' arguments never read
        them; an image model's embedding runs on its pixels, with zero weights)."""
        base = self._base(stock)
        sink: list = [None] * self.n_layers
        blocks = self._blocks(stock)
        recorders = torch.nn.ModuleList(BlockRecorder(sink, i, layer, stop=i == self.n_layers - 1)
                                        for i, layer in enumerate(blocks))
        zeros = {self._local(n): torch.zeros(self.reader.entries[n].shape, dtype=self.dtype)
                 for n in self.embedding_names if n != self.embed_name}
        if not self.pixels:
            ids = kwargs["input_ids"]
            embeds = torch.zeros((*ids.shape, self.geometry.d_model), dtype=self.dtype)
            kwargs = {**{k: v for k, v in kwargs.items() if k != "input_ids"}, "inputs_embeds": embeds,
                      "use_cache": False}
        with self._swapped(base, {self.layout.blocks: recorders}), contextlib.suppress(StopAtBlock):
            functional_call(base, zeros, args=(), kwargs=kwargs, strict=False)
        return sink

    def _local(self, name: str) -> str:
        return name[len(self.prefix):]

    @staticmethod
    @contextlib.contextmanager
    def _swapped(base, modules: dict):
        """Each dotted path's module replaced for the duration."""
        places = {path: (module_at(base, path.rpartition(".")[0]) if "." in path else base, path.rpartition(".")[2])
                  for path in modules}
        kept = {path: getattr(parent, name) for path, (parent, name) in places.items()}
        for path, (parent, name) in places.items():
            setattr(parent, name, modules[path])
        try:
            yield
        finally:
            for path, (parent, name) in places.items():
                setattr(parent, name, kept[path])

    # --- running the stages ---

    def embed(self, weights: dict[str, torch.Tensor], looked_up: list[int], kwargs: dict, stock: bool = False):
        """The embedding stage: the base model's own forward on `kwargs` (model inputs) up to its first block, with
        the token table's looked-up rows only (the ids renumbered into `weights`' rows for the table alone) and its
        other embedding parameters whole (an image model: every embedding parameter whole, on its pixels). Returns
        the first block's input, by its trace name."""
        base = self._base(stock)
        sink: list = [None]
        first = BlockRecorder(sink, 0, self._blocks(stock)[0], stop=True)
        if self.pixels:
            given = {self._local(n): w for n, w in weights.items()}
            with self._swapped(base, {self.layout.blocks: torch.nn.ModuleList([first])}), \
                    contextlib.suppress(StopAtBlock):
                functional_call(base, given, args=(), kwargs=kwargs, strict=False)
            return {trace_names.EMBED: first.hidden}
        table = copy.deepcopy(module_at(base, self.layout.token_embedding))  # meta: costs nothing
        position = {token: i for i, token in enumerate(looked_up)}
        table.num_embeddings = len(looked_up)
        pad = getattr(table, "padding_idx", None)
        table.padding_idx = position.get(pad) if pad is not None else None
        # the table alone sees the ids renumbered into its rows: the rest of the base reads the real ones (RoBERTa
        # counts its position ids from the ids that are not its padding id)
        table.register_forward_pre_hook(lambda m, args: (args[0].clone().apply_(position.__getitem__), *args[1:]))
        given = {self._local(n): w for n, w in weights.items()}
        if hasattr(table, "scalar_embed_scale"):  # Gemma 3 scales its embeddings by a buffer
            given[f"{self.layout.token_embedding}.embed_scale"] = torch.tensor(table.scalar_embed_scale)
        swapped = {self.layout.blocks: torch.nn.ModuleList([first]), self.layout.token_embedding: table}
        with self._swapped(base, swapped), contextlib.suppress(StopAtBlock):
            functional_call(base, given, args=(), kwargs={**kwargs, "use_cache": False}, strict=False)
        return {trace_names.EMBED: first.hidden}

    def block(self, layer: int, weights: dict[str, torch.Tensor], hidden: torch.Tensor, kwargs: dict,
              encoder_out: torch.Tensor | None = None, stock: bool = False) -> dict[str, torch.Tensor | None]:
        """block_axes' tensors: the block's output (normed when it is the last), its attention probabilities (None
        for the stock). One stack reads no encoder output."""
        module = self._blocks(stock)[layer]
        prefix = f"{self.prefix}{self.layout.blocks}.{layer}."
        local = {n[len(prefix):]: w for n, w in weights.items() if n.startswith(prefix)}
        box: dict = {}
        attention = module_at(module, self.layout.attention)
        handle = attention.register_forward_hook(lambda m, a, out: box.__setitem__("attn", out[1]))
        try:
            out = functional_call(module, local, args=(hidden,), kwargs=kwargs, strict=False)
        finally:
            handle.remove()
        out = out[0] if isinstance(out, tuple) else out
        if layer == self.n_layers - 1 and self.norm_names:
            out = self._final_norm(weights, self.norm_names, out, stock)
        return {trace_names.hidden(layer): out, trace_names.attn(layer): box.get("attn")}

    def _final_norm(self, weights: dict[str, torch.Tensor], names: list[str], hidden: torch.Tensor,
                    stock: bool = False) -> torch.Tensor:
        """The base's final norm on `hidden`, with its parameters `names` from `weights`."""
        norm = f"{self.prefix}{self.layout.final_norm}."
        return functional_call(module_at(self._base(stock), self.layout.final_norm),
                               {n[len(norm):]: weights[n] for n in names}, args=(hidden,), strict=False)
