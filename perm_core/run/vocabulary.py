"""The rows of a text model's input embedding table that one input reads, and the input renumbered to them.

A forward reads one row of the vocabulary table per token: 128 of gemma3-270m's 262,144. A run that transforms
the table only to read it (the early measure of a negative control, stopped at block 1) can cut it to those rows
first: a transform that leaves the vocabulary axis alone acts on each row by itself, so transforming the cut
table gives exactly the rows the whole transformed table would have given, and the lookup of renumbered ids in
it the same embeddings, bit for bit.
"""

from __future__ import annotations

import torch

# Where the token ids' values mean more than rows of the table, renumbering them would change the run: RoBERTa's
# position ids count non-padding tokens (Geometry.position_offset), and an encoder-decoder embeds decoder ids too.
TEXT_KINDS = ("causal-text", "bidirectional-text")


def input_table(model: torch.nn.Module) -> tuple[str | None, torch.nn.Module | None]:
    """(the parameter name of the model's input embedding table, its module), or (None, None)."""
    try:
        table = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    for name, module in model.named_modules():
        if module is table:
            return (f"{name}.weight" if name else "weight"), table
    return None, None


def cut_to_rows_read(model: torch.nn.Module, geometry, inputs: dict, params: dict[str, torch.Tensor],
                     claims: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """(params, inputs) with the input table cut to the rows `inputs` read and the ids renumbered to match;
    both unchanged where the cut does not apply or would not be smaller."""
    if geometry.input_kind not in TEXT_KINDS or geometry.position_offset or not inputs or "input_ids" not in inputs:
        return params, inputs
    name, module = input_table(model)
    if name not in params or claims[name].rule.axes[0] is not None:  # a transform acting on rows: no cut
        return params, inputs
    table = params[name]
    rows, renumbered = torch.unique(inputs["input_ids"], return_inverse=True)
    padding = getattr(module, "padding_idx", None)
    if padding is not None and padding >= len(rows):  # the lookup requires padding_idx to be a row of the table
        rows = torch.cat([rows, rows.new_zeros(padding + 1 - len(rows))])
    if len(rows) >= table.shape[0]:
        return params, inputs
    return {**params, name: table.index_select(0, rows.to(table.device))}, {**inputs, "input_ids": renumbered}
