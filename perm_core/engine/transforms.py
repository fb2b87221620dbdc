"""The two kinds of group element that act on one axis, and chains of them.

Both act the same way on every axis, input or output: new[..., i, ...] = sum_j M[i, j] old[..., j, ...].
For an orthogonal M that is W' = M W on an output axis and W' = W M^T on an input axis, which is
exactly what keeps a layer's function; a permutation is the special case M[i, j] = [j == index[i]],
done as a gather (O(n) per slice instead of a matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange


@dataclass(frozen=True)
class Permutation:
    index: torch.Tensor  # [n] long: new position i holds old position index[i]

    @property
    def size(self) -> int:
        return self.index.numel()

    def apply(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        # Each torch call gives up the GIL and must win it back: under thirty sessions a no-op .to() costs
        # milliseconds, so only a tensor on another device moves its index.
        index = self.index if self.index.device == tensor.device else self.index.to(tensor.device)
        if tensor.dim() >= 2 and axis in (-1, tensor.dim() - 1) and tensor.is_contiguous():
            # The last axis (a weight's input channels, an activation's channels or key tokens): gather is
            # 1.6-5x faster here than index_select's last-axis path (float32 and float64, 768 to 30522 rows);
            # the same values, contiguous.
            return torch.gather(tensor, -1, index.expand(tensor.shape))
        if tensor.dim() < 2 or tensor.is_contiguous():
            return tensor.index_select(axis, index)
        # A gather across a strided view (a rotated weight's movedim) is several times slower than one on
        # the contiguous storage beneath it; index_select returns a contiguous tensor either way, and so do we.
        order = sorted(range(tensor.dim()), key=lambda d: -tensor.stride(d))
        storage_view = tensor.permute(order)
        if not storage_view.is_contiguous():
            return tensor.index_select(axis, index)
        gathered = storage_view.index_select(order.index(axis), index)
        return gathered.permute(sorted(range(tensor.dim()), key=order.__getitem__)).contiguous()

    def inverse(self) -> Permutation:
        return Permutation(torch.argsort(self.index))

    def matrix(self) -> torch.Tensor:
        return torch.eye(self.size, dtype=torch.float64)[self.index]


@dataclass(frozen=True)
class BlockOrthogonal:
    blocks: torch.Tensor  # [n_blocks, b, b] float64, block-diagonal orthogonal map on n_blocks * b channels

    @property
    def size(self) -> int:
        return self.blocks.shape[0] * self.blocks.shape[1]

    def apply(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        blocks = self.blocks
        if blocks.device != tensor.device or blocks.dtype != tensor.dtype:
            blocks = blocks.to(device=tensor.device, dtype=tensor.dtype)
        n, b = blocks.shape[0], blocks.shape[1]
        axis %= tensor.dim()
        before, after = tensor.shape[:axis].numel(), tensor.shape[axis + 1:].numel()
        # One batched matmul over the blocks, straight on the storage: a weight's first axis (q/k/v outputs) is
        # [n, b, rest] as it lies, 6x faster than moving the axis last for einsum and copying back (and equal to
        # it to the last bit on this machine's CPU); the result is contiguous.
        if before == 1:
            return torch.matmul(blocks, tensor.reshape(n, b, after)).view(tensor.shape)
        if after == 1:
            return (torch.matmul(tensor.reshape(before, n, b).transpose(0, 1), blocks.transpose(1, 2))
                    .transpose(0, 1).reshape(tensor.shape))
        moved = rearrange(tensor.movedim(axis, -1), "... (n b) -> ... n b", n=n)
        rotated = torch.einsum("...nj,nij->...ni", moved, blocks)
        return rearrange(rotated, "... n b -> ... (n b)").movedim(-1, axis)

    def inverse(self) -> BlockOrthogonal:
        return BlockOrthogonal(self.blocks.transpose(-1, -2))

    def matrix(self) -> torch.Tensor:
        return torch.block_diag(*self.blocks)


@dataclass(frozen=True)
class Translation:
    """A continuous element that adds instead of gathering or rotating: a router's weight [E, H] gets rows[e] * v
    added to its row e (W' = W + rows v^T), its bias [E] rows[e] * offset. With every rows[e] = 1 (the router_shift
    symmetry) every expert's logit of a token x moves by the same v.x + offset, which a softmax over the experts and
    a top k of them both ignore; with rows one-hot (its negative control) one expert's logit moves alone.

    It acts on a parameter's values, on no axis: a space holding it (("router_shift", layer)) is named by a rule's
    `shift`, never by its axes, so activations and gradients never see it. The routing is unchanged, so the
    scrambled run's activations are the original's; and L(W + rows v^T) = L(W) for every W makes the gradient at W'
    the gradient at W (only the permutations act on it)."""

    rows: torch.Tensor  # [E] float64
    vector: torch.Tensor  # [H] float64
    offset: torch.Tensor  # [] float64

    @property
    def size(self) -> int:
        return self.rows.numel()

    def add_to(self, tensor: torch.Tensor) -> torch.Tensor:
        """The router weight [E, H] or bias [E] translated (in its own dtype and device)."""
        step = torch.outer(self.rows, self.vector) if tensor.dim() == 2 else self.rows * self.offset
        if tuple(step.shape) != tuple(tensor.shape):
            raise ValueError(f"a router translation of shape {tuple(step.shape)} cannot act on a tensor of shape "
                             f"{tuple(tensor.shape)}")
        return tensor + step.to(device=tensor.device, dtype=tensor.dtype)

    def inverse(self) -> Translation:
        return Translation(self.rows, -self.vector, -self.offset)


AxisTransform = Permutation | BlockOrthogonal


def composed(chain: tuple[AxisTransform, ...]) -> tuple[AxisTransform, ...]:
    """The same chain with each run of permutations merged into one: a gather of a gather is one gather,
    exactly, so the tensor is read once per run. Rotations are arithmetic and stay as they are."""
    merged: list[AxisTransform] = []
    for transform in chain:
        if merged and isinstance(transform, Permutation) and isinstance(merged[-1], Permutation):
            merged[-1] = Permutation(merged[-1].index[transform.index])
        else:
            merged.append(transform)
    return tuple(merged)


def apply_chain(chain: tuple[AxisTransform, ...], tensor: torch.Tensor, axis: int) -> torch.Tensor:
    for transform in composed(chain):
        tensor = transform.apply(tensor, axis)
    return tensor


def invert_chain(chain: tuple[AxisTransform, ...]) -> tuple[AxisTransform, ...]:
    return tuple(t.inverse() for t in reversed(chain))
