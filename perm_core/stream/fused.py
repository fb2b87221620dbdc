"""Parameters that transformers assembles from several stored tensors when it loads a checkpoint, read and written by
the streamed check and scramble with transformers' own conversion (its conversion mapping's WeightConverter).

transformers 5.23 stores a mixture of experts' experts fused, one tensor per layer (`mlp.experts.gate_up_proj`
[E, 2I, H], `down_proj` [E, H, I]), but saves and reads them one tensor per expert as the original checkpoints hold
them (Mixtral's `block_sparse_moe.experts.N.w1|w3|w2.weight`, Qwen's and OLMoE's `mlp.experts.N.{gate,up,down}_proj`):
loading stacks the experts (MergeModulelist) and concatenates gate and up (Concatenate), saving undoes both. A
streamed stage reads a fused parameter by reading its pieces and running that converter on them, so the parameter is
exactly the one a loaded model holds; the streamed scramble transforms the fused parameter and splits it back into
the stored pieces with transformers' own reverse conversion (the one save_pretrained runs), so each stored tensor is
written under its own name, in its own shard, where the original has it.

Only converters made of pure rearrangements (stacking, concatenating, chunking, interleaving, transposing) are
read this way: each assembled value is a stored value, so the parameter's bytes are the checkpoint's. Any other
conversion (a dequantization, a permutation for RoPE) is refused in one line.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from perm_core.stream.shards import Fused
from perm_core.stream.stages import StreamingUnsupportedError

# The conversion steps that only move stored values (transformers.core_model_loading): a parameter built by them
# holds the stored values themselves, and the reverse steps give the stored tensors back bit for bit.
REARRANGING = ("MergeModulelist", "SplitModulelist", "Concatenate", "Chunk", "Interleave", "Transpose")


def fused_parameters(model, groups: dict[str, list[tuple[str, str]]], converters, stored_dtype: Callable
                     ) -> dict[str, Fused]:
    """Each parameter of `model` (on the meta device) that loading assembles: groups maps its name to its stored
    pieces, (stored name, the converter's source pattern that matched it); converters are the class's
    WeightConverters; stored_dtype(stored name) is a piece's dtype."""
    from transformers.core_model_loading import dot_natural_key

    parameters = dict(model.named_parameters())
    fused = {}
    for name, pieces in groups.items():
        # loading collects the pieces in the checkpoint's natural key order (expert 0, 1, ..., 10): the experts'
        # order along the stacked axis
        pieces = sorted(pieces, key=lambda piece: dot_natural_key(piece[0]))
        converter = next(c for c in converters if pieces[0][1] in c.source_patterns)
        steps = [type(op).__name__ for op in converter.operations]
        dtypes = {stored_dtype(stored) for stored, _ in pieces}
        if name not in parameters or any(step not in REARRANGING for step in steps) or len(dtypes) != 1:
            raise StreamingUnsupportedError(
                f"{pieces[0][0]} is converted when transformers loads it ({', '.join(steps)} into {name}), not "
                "only renamed or rearranged: streaming reads each tensor as it is stored")
        shape = tuple(parameters[name].shape)
        fused[name] = Fused(tuple(stored for stored, _ in pieces), dtypes.pop(), shape,
                            _assembler(model, converter, name, pieces, shape))
    return fused


def _assembler(model, converter, name: str, pieces: list[tuple[str, str]], shape: tuple[int, ...]):
    def assemble(read: Callable[[str], torch.Tensor]) -> torch.Tensor:
        own = copy.deepcopy(converter)  # a converter collects the tensors it is given: each read gets its own
        for stored, pattern in pieces:
            own.add_tensor(name, stored, pattern, read(stored))
        out = own.convert(name, model=model, config=model.config)
        if list(out) != [name] or tuple(out[name].shape) != shape:
            raise StreamingUnsupportedError(f"assembling {name} from {pieces[0][0]} and its siblings gives "
                                            f"{', '.join(out)}, not the parameter")
        return out[name].contiguous()
    return assemble


def stored_pieces(model, name: str, tensor: torch.Tensor, pieces: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """A fused parameter's value split back into the checkpoint's stored tensors, by transformers' reverse conversion
    (save_pretrained's): their stored names -> tensors, exactly `pieces`."""
    from transformers.core_model_loading import revert_weight_conversion

    out = revert_weight_conversion(model, {name: tensor})
    if set(out) != set(pieces):
        extra = sorted(set(out) ^ set(pieces))
        raise StreamingUnsupportedError(f"transformers saves {name} as other tensors than the checkpoint stores "
                                        f"({extra[0]}): the scramble would not write the checkpoint's own layout")
    return {piece: out[piece].contiguous() for piece in pieces}
