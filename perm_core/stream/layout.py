"""A checkpoint's model as stages that run one at a time: the embedding, each decoder block, the output head.

The architecture is instantiated once on the meta device (no memory), with the same exact numerics a loaded model
gets (perm_core.run.numerics); a stage runs its stock module through functional_call with weights read for it
alone. What a block takes besides its hidden state (rotary position embeddings, the attention mask of its layer
type) is found by a dry run of the stock base model's own forward, whose blocks only record what they are given:
the masks and positions are then built by transformers itself from the same inputs the whole-model check passes.
The last block ends with the final norm, as the whole-model trace records it ("blocks.{L-1}.hidden" is normed).
"""

from __future__ import annotations

import contextlib
import copy
import json

import torch

from perm_core.engine.spec import UnclaimedParameterError
from perm_core.families import Family, family_by_name
from perm_core.run.numerics import use_exact_numerics
from perm_core.run.stateless import functional_call
from perm_core.stream.shards import CheckpointError, ShardReader

# Families whose causal LM is embed_tokens -> layers -> norm -> lm_head, each block taking (hidden, **kwargs).
STREAMED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")


class StreamingUnsupportedError(CheckpointError):
    """A checkpoint of an architecture the streamed check does not run."""


def family_for(config: dict) -> tuple[Family, type]:
    """The family and the transformers class of a checkpoint's config (a *ForCausalLM of a streamed family)."""
    import transformers

    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    name = architectures[0] if architectures and isinstance(architectures[0], str) else ""
    family = next((family_by_name(f) for f in STREAMED_FAMILIES if model_type in family_by_name(f).model_types),
                  None)
    if not name and family is not None:  # a config written without architectures (the zoo's converted caches)
        name = next(c for c in family.classes if c.endswith("ForCausalLM"))
    cls = getattr(transformers, name, None) if name.isidentifier() else None
    if family is None or not name.endswith("ForCausalLM") or name not in family.classes or cls is None:
        raise StreamingUnsupportedError(
            f"streaming supports the causal language models of {', '.join(STREAMED_FAMILIES)}; this checkpoint "
            f"is {name or 'an unnamed class'} (model_type {model_type!r})")
    return family.for_class(name), cls


class _Recorder(torch.nn.Module):
    """Stands in for a decoder block in a dry run: keeps the keyword arguments it is called with."""

    def __init__(self, sink: list, index: int, attention_type: str | None):
        super().__init__()
        self.sink, self.index = sink, index
        if attention_type is not None:
            self.attention_type = attention_type

    def forward(self, hidden_states, *args, **kwargs):
        self.sink[self.index] = {**kwargs, "past_key_values": None, "use_cache": False}
        return hidden_states


class StreamedModel:
    """One checkpoint directory's architecture on the meta device, and its parameters grouped into stages."""

    def __init__(self, directory, dtype: torch.dtype, reader: ShardReader | None = None):
        from transformers import AutoConfig

        self.reader = reader or ShardReader(directory)
        try:
            raw = json.loads((self.reader.directory / "config.json").read_text())
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{self.reader.directory}/config.json is not readable JSON ({error})") from None
        self.family, cls = family_for(raw)
        self.config = AutoConfig.from_pretrained(self.reader.directory, local_files_only=True)
        if getattr(self.config, "final_logit_softcapping", None) is not None:
            raise StreamingUnsupportedError("streaming does not run heads with logit soft-capping")
        self.dtype, self.cls_name = dtype, cls.__name__
        self.geometry = self.family.geometry(self.config)
        self.spec = self.family.spec(self.config)
        with torch.device("meta"):
            self.model = cls(self.config).to(dtype).eval()
            self.stock = cls(copy.deepcopy(self.config)).to(dtype).eval()  # its own attention setting
        use_exact_numerics(self.model)
        try:
            self.stock.set_attn_implementation("sdpa")
            self.stock_attention = "sdpa"
        except (ValueError, ImportError):
            self.stock.set_attn_implementation("eager")
            self.stock_attention = "eager"
        for meta in (self.model, self.stock):  # buffers computed at construction (rotary frequencies) must be real
            meta.model.rotary_emb = type(meta.model.rotary_emb)(config=meta.config)
        self.prefix = "model."
        self.names = [name for name, _ in self.model.named_parameters()]
        self._check_names()
        try:
            self.claims = self.spec.claim_all(self.names)
        except UnclaimedParameterError as error:
            raise CheckpointError(str(error)) from None
        self.n_layers = self.geometry.n_layers
        self.embed_name = f"{self.prefix}embed_tokens.weight"
        self.norm_name = f"{self.prefix}norm.weight"
        self.head_name = "lm_head.weight" if "lm_head.weight" in self.names else self.embed_name
        self.tied = self.head_name == self.embed_name

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

    def block_names(self, layer: int) -> list[str]:
        own = [n for n in self.names if n.startswith(f"{self.prefix}layers.{layer}.")]
        return own + ([self.norm_name] if layer == self.n_layers - 1 else [])

    def read(self, names) -> dict[str, torch.Tensor]:
        """The named tensors in the checked dtype."""
        return {name: self.reader.read(name, self.dtype) for name in names}

    def bytes_of(self, names, dtype: torch.dtype | None = None) -> int:
        itemsize = (dtype or self.dtype).itemsize
        return sum(self.reader.entries[n].numel * itemsize for n in names)

    # --- what the blocks are given ---

    def layer_kwargs(self, kwargs: dict, stock: bool = False) -> list[dict]:
        """Each block's keyword arguments when the base model's forward runs on `kwargs` (the whole-model check's
        model inputs, or the raw ones for the stock model): a dry run in which every block only records."""
        meta = self.stock if stock else self.model
        base = meta.model
        ids = kwargs["input_ids"]
        sink: list = [None] * self.n_layers
        recorders = torch.nn.ModuleList(_Recorder(sink, i, getattr(layer, "attention_type", None))
                                        for i, layer in enumerate(base.layers))
        embeds = torch.zeros((*ids.shape, self.geometry.d_model), dtype=self.dtype)
        rest = {k: v for k, v in kwargs.items() if k != "input_ids"}
        with self._swapped(base, recorders):
            functional_call(base, {"norm.weight": torch.ones(self.geometry.d_model, dtype=self.dtype)}, args=(),
                            kwargs={**rest, "inputs_embeds": embeds, "use_cache": False}, strict=False)
        return sink

    @staticmethod
    @contextlib.contextmanager
    def _swapped(base, recorders):
        layers = base.layers
        base.layers = recorders
        try:
            yield
        finally:
            base.layers = layers

    # --- running the stages ---

    def embed(self, rows: torch.Tensor, looked_up: list[int], ids: torch.Tensor, stock: bool = False):
        """The embedding module on the looked-up rows of its table only: ids are renumbered into `rows`."""
        module = copy.deepcopy((self.stock if stock else self.model).model.embed_tokens)  # meta: costs nothing
        position = {token: i for i, token in enumerate(looked_up)}
        module.num_embeddings = len(looked_up)
        pad = module.padding_idx
        module.padding_idx = position.get(pad) if pad is not None else None
        local = ids.clone().apply_(position.__getitem__)
        given = {"weight": rows}
        if hasattr(module, "scalar_embed_scale"):  # Gemma 3 scales its embeddings by a buffer
            given["embed_scale"] = torch.tensor(module.scalar_embed_scale)
        return functional_call(module, given, args=(local,), strict=False)

    def block(self, layer: int, weights: dict[str, torch.Tensor], hidden: torch.Tensor, kwargs: dict,
              stock: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the block's output, normed when it is the last; its attention probabilities, None for the stock)."""
        base = (self.stock if stock else self.model).model
        module = base.layers[layer]
        prefix = f"{self.prefix}layers.{layer}."
        local = {n[len(prefix):]: w for n, w in weights.items() if n.startswith(prefix)}
        box: dict = {}
        attention = module.self_attn
        handle = attention.register_forward_hook(lambda m, a, out: box.__setitem__("attn", out[1]))
        try:
            out = functional_call(module, local, args=(hidden,), kwargs=kwargs, strict=False)
        finally:
            handle.remove()
        out = out[0] if isinstance(out, tuple) else out
        if layer == self.n_layers - 1:
            out = functional_call(base.norm, {"weight": weights[self.norm_name]}, args=(out,), strict=False)
        return out, box.get("attn")

    def head(self, weight_rows: torch.Tensor, normed: torch.Tensor, stock: bool = False) -> torch.Tensor:
        """Logits of the vocabulary rows given (a chunk of the output head)."""
        meta = self.stock if stock else self.model
        return functional_call(meta.lm_head, {"weight": weight_rows}, args=(normed,), strict=False)

    def head_chunks(self, largest_block_bytes: int) -> list[tuple[int, int]]:
        """Vocabulary row ranges of the head, each no larger than the largest block: the head never sets the
        memory bound."""
        vocab, width = self.reader.entries[self.head_name].shape
        rows = max(1, largest_block_bytes // (width * self.dtype.itemsize))
        return [(start, min(start + rows, vocab)) for start in range(0, vocab, rows)]
