"""Many gathers, and many un-scramble-and-compare steps, each batch in one torch call.

Why: a key change gathers a few hundred tensors (the scrambled weights, then the un-scrambled activations).
Each torch call made from Python lets the GIL go and must win it back, which beside a classroom's sessions
drawing charts costs milliseconds per call. A TorchScript function runs the whole batch in C++. It returns the
lists it was given too: a tensor that Python owns costs a GIL round trip when C++ drops the last reference
to it, and handed back, those references are dropped in Python instead. (They keep the process's intra-op
thread count: changing it changes MKL's too, and with it the last bits of later float64 matmuls.)

The values are those of perm_core.engine.transforms.Permutation.apply, exactly: a gather copies, it never rounds.
"""

from __future__ import annotations

import warnings

import torch

from perm_core.engine.transforms import Permutation

Tensor = torch.Tensor

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # TorchScript's deprecation notice: the pinned torch runs it

    @torch.jit.script
    def _gather(tensor: Tensor, axis: int, index: Tensor) -> Tensor:
        if tensor.dim() >= 2 and axis == tensor.dim() - 1 and tensor.is_contiguous():
            return torch.gather(tensor, -1, index.expand(tensor.shape))  # as Permutation.apply: faster here
        return tensor.index_select(axis, index)

    @torch.jit.script
    def _gather_all(tensors: list[Tensor], axes: list[list[int]], indices: list[list[Tensor]]
                    ) -> tuple[list[Tensor], list[Tensor], list[list[Tensor]]]:
        out: list[Tensor] = []
        for i in range(len(tensors)):
            tensor = tensors[i]
            for j in range(len(axes[i])):
                tensor = _gather(tensor, axes[i][j], indices[i][j])
            out.append(tensor)
        return out, tensors, indices

    @torch.jit.script
    def _gathered_differences(tensors: list[Tensor], references: list[Tensor], axes: list[list[int]],
                              indices: list[list[Tensor]]
                              ) -> tuple[Tensor, list[Tensor], list[Tensor], list[list[Tensor]]]:
        """max |reference - gathered tensor| per pair, as float64 (exact for float32 values); NaN propagates."""
        found: list[Tensor] = []
        for i in range(len(tensors)):
            tensor = tensors[i]
            for j in range(len(axes[i])):
                tensor = _gather(tensor, axes[i][j], indices[i][j])
            if tensor.numel() == 0:
                found.append(torch.zeros((), dtype=torch.float64))
            else:
                found.append(torch.sub(references[i], tensor).abs_().max().to(torch.float64))
        return torch.stack(found), tensors, references, indices

    @torch.jit.script
    def _gathered_difference_by_rows(tensor: Tensor, reference: Tensor, axes: list[int], indices: list[Tensor],
                                     rows: int) -> Tensor:
        """max |reference - tensor gathered along axes| of one large pair, `rows` rows of the gathered tensor at a
        time: each slice is gathered from the tensor (its rows first, by their slice of the axis-0 index), compared
        with the reference's same rows and dropped while it is still in cache; no whole gathered copy is made."""
        maxima: list[Tensor] = []
        for start in range(0, reference.shape[0], rows):
            count = min(rows, reference.shape[0] - start)
            piece = tensor.narrow(0, start, count)
            for j in range(len(axes)):
                if axes[j] == 0:
                    piece = tensor.index_select(0, indices[j].narrow(0, start, count))
            for j in range(len(axes)):
                if axes[j] != 0:
                    piece = _gather(piece, axes[j], indices[j])
            maxima.append(torch.sub(reference.narrow(0, start, count), piece).abs_().max())
        return torch.stack(maxima).max().to(torch.float64)


Step = tuple[int, torch.Tensor]  # (axis, index): new[..., i, ...] = old[..., index[i], ...] along that axis


def _plans(steps_per_tensor: list[list[Step]]) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    return ([[axis for axis, _ in steps] for steps in steps_per_tensor],
            [[index for _, index in steps] for steps in steps_per_tensor])


def steps_of(indices: tuple) -> list[Step]:
    """The gathers of param_cache.gather_indices' per-axis indices (None: nothing acts on that axis)."""
    return [(axis, index) for axis, index in enumerate(indices) if index is not None]


def on_cpu(tensors, steps_per_tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors) and all(
        index.device.type == "cpu" for steps in steps_per_tensor for _, index in steps)


def gather_many(tensors: list[torch.Tensor], steps_per_tensor: list[list[Step]]) -> list[torch.Tensor]:
    """Each tensor gathered along its steps' axes (non-negative), in one call; a tensor with no steps is
    returned as it is. Off the CPU, one Permutation.apply per step."""
    if not tensors:
        return []
    if not on_cpu(tensors, steps_per_tensor):
        return [_one_by_one(tensor, steps) for tensor, steps in zip(tensors, steps_per_tensor, strict=True)]
    axes, indices = _plans(steps_per_tensor)
    with torch.no_grad():
        gathered, _, _ = _gather_all(list(tensors), axes, indices)
    return gathered


def _one_by_one(tensor: torch.Tensor, steps: list[Step]) -> torch.Tensor:
    for axis, index in steps:
        tensor = Permutation(index).apply(tensor, axis)
    return tensor


def gathered_differences(tensors: list[torch.Tensor], references: list[torch.Tensor],
                         steps_per_tensor: list[list[Step]]) -> list[float]:
    """max |reference - tensor gathered along its steps| per pair, each gathered tensor made and dropped in C++:
    the numbers tolerances.relative_differences takes one pair at a time."""
    if not tensors:
        return []
    axes, indices = _plans(steps_per_tensor)
    with torch.no_grad():
        found, _, _, _ = _gathered_differences(list(tensors), list(references), axes, indices)
    return found.tolist()


def gathered_difference_by_rows(tensor: torch.Tensor, reference: torch.Tensor, steps: list[Step],
                                slice_elements: int) -> float:
    """max |reference - tensor gathered along its steps| of one large pair, compared about `slice_elements` at a
    time (whole rows of axis 0): the same number as gathering the whole tensor and then comparing, since a gather
    copies and max is exact, without the gathered copies (two of a weight's size for a weight gathered on both axes).
    NaN propagates. The tensors must be non-empty, on the CPU, of one dtype and shape (after the gathers)."""
    row = max(1, reference.numel() // reference.shape[0])
    axes, indices = _plans([steps])
    with torch.no_grad():
        return _gathered_difference_by_rows(tensor, reference, axes[0], indices[0],
                                            max(1, slice_elements // row)).item()
