"""The head stage of one stack, as stream.layout.StreamedModel runs it: each head's modules of the class in order,
on the last hidden state, on one token of it, or pooled after them at each row's last token that is no padding; a
headless model's last hidden state and pooled output. Its rows per vocabulary entry (or label) are read in chunks.
"""

from __future__ import annotations

import torch

from perm_core.families.stages import LAST_NON_PADDING, Function, Head
from perm_core.run import trace_names
from perm_core.run.stateless import functional_call


def module_at(module, *paths: str):
    """The submodule (or attribute) at the dotted paths, in turn; "" is the module itself."""
    for path in paths:
        for part in path.split(".") if path else ():
            module = getattr(module, part)
    return module


def last_non_padding(ids: torch.Tensor | None, pad: int | None) -> torch.Tensor | int:
    """Each row's last token whose id is not `pad`, as transformers' sequence classifiers find it (the rightmost
    non-padding index, whatever the padding side); the last token where there is no pad id (or no ids)."""
    if pad is None or ids is None:
        return -1
    positions = torch.arange(ids.shape[-1], dtype=torch.int32)
    return (positions * (ids != pad).to(torch.int32)).argmax(-1)


class Applied(torch.nn.Module):
    """A Function step of a head as a module without parameters: what the class's forward applies inline."""

    def __init__(self, step: Function):
        super().__init__()
        self.function = getattr(torch.nn.functional, step.name)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.function(hidden)


class OneStackHead:
    """The head stage's methods of StreamedModel (which sets layout, prefix, config, model, stock, head_params,
    head_chunked, head_name, head_norm_names, reader and dtype, and runs _final_norm)."""

    def _head_modules(self, stock: bool = False) -> dict[str | Function, torch.nn.Module]:
        """Every module the head stage runs, by its path in the class (a function applied inline: by itself): the
        heads' (a headless model's pooler)."""
        paths = [path for head in self.layout.heads for path in head.modules]
        if self.layout.pooler is not None:
            paths.append(f"{self.prefix}{self.layout.pooler}")
        model = self.stock if stock else self.model
        return {path: Applied(path) if isinstance(path, Function) else module_at(model, path)
                for path in dict.fromkeys(paths)}

    def head_chunk(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """Vocabulary rows start..stop-1 of the head's output weight and of its bias (none for a headless model)."""
        return {n: self.reader.row_range(n, start, stop, self.dtype) for n in self.head_chunked}

    @property
    def output_axes(self) -> dict[str, tuple]:
        """The head stage's outputs, named as the whole-model trace names them, with their axis roles: each head's
        (a token axis, unless it reads or pools one token), their mean first where it is the logits; a headless
        model's last hidden state and its pooled output (where it has a pooler or pools a token)."""
        if self.layout.heads:
            axes = {trace_names.output(h.output): (None, "tokens", None) if h.per_token else (None, None)
                    for h in self.layout.heads}
            return {trace_names.LOGITS: next(iter(axes.values())), **axes} if self.layout.logits_mean else axes
        pooled = self.layout.pooler is not None or self.layout.pooled_token is not None
        return {trace_names.LAST_HIDDEN: (None, "tokens", "resid"), **({trace_names.POOLER: (None, "resid")} if pooled
                                                                     else {})}

    @property
    def primary(self) -> str:
        """The output the invariant loss reads (trace.primary_output): the logits, else the last hidden state."""
        return next(iter(self.output_axes))

    def head(self, chunk: dict[str, torch.Tensor], whole: dict[str, torch.Tensor], normed: torch.Tensor,
             stock: bool = False, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The head stage's outputs (output_axes): each head's modules run in order, its rows those of `chunk` (a
        head_chunk), its other parameters `whole` (the final norm's among them where it opens the head; then
        `normed` is the last block's own output); a headless model's last hidden state and pooled output (its
        pooler's parameters in `whole`). `ids`: the input's token ids in the run's own frame (a head pooled at the
        last token that is no padding finds it in them, as the class does on the ids it is given)."""
        if self.head_norm_names:
            normed = self._final_norm(whole, self.head_norm_names, normed, stock)
        modules = self._head_modules(stock)

        def run(path: str | Function, hidden: torch.Tensor) -> torch.Tensor:
            given = {local: chunk[n] if n in chunk else whole[n] for local, n in self.head_params[path].items()}
            return functional_call(modules[path], given, args=(hidden,), strict=False)

        if not self.layout.heads:
            outputs = {trace_names.LAST_HIDDEN: normed}
            if self.layout.pooler is not None:  # the pooler reads its token itself
                outputs[trace_names.POOLER] = run(f"{self.prefix}{self.layout.pooler}", normed)
            elif self.layout.pooled_token is not None:
                outputs[trace_names.POOLER] = normed[:, self.layout.pooled_token]
            return outputs
        outputs = {}
        for head in self.layout.heads:
            hidden = normed[:, head.token] if isinstance(head.token, int) else normed
            for path in head.modules:
                hidden = run(path, hidden)
            outputs[trace_names.output(head.output)] = self._pooled(head, hidden, ids)
        if self.layout.logits_mean:  # as the class computes it: (a + b) / 2
            pieces = list(outputs.values())
            outputs = {trace_names.LOGITS: sum(pieces[1:], pieces[0]) / len(pieces), **outputs}
        return outputs

    def _pooled(self, head: Head, out: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """A head's output pooled where it pools after its modules (each row's last token that is no padding)."""
        if head.token != LAST_NON_PADDING:
            return out
        index = last_non_padding(ids, getattr(self.config.get_text_config(), "pad_token_id", None))
        return out[torch.arange(out.shape[0]), index]

    def head_chunks(self, largest_block_bytes: int) -> list[tuple[int, int]]:
        """Vocabulary row ranges of the head, each no larger than the largest block: the head never sets the
        memory bound (a headless model's: one range, empty)."""
        if self.head_name is None:
            return [(0, 0)]
        vocab, width = self.reader.entries[self.head_name].shape
        rows = max(1, largest_block_bytes // (width * self.dtype.itemsize))
        return [(start, min(start + rows, vocab)) for start in range(0, vocab, rows)]
