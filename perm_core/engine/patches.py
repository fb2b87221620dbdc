"""Image patches as tokens: a token permutation of a ViT-style model, applied to the pixels themselves."""

from __future__ import annotations

import torch
from einops import rearrange

from perm_core.engine.transforms import Permutation


def shuffle_patches(pixels: torch.Tensor, tokens: Permutation, patch_size: int) -> torch.Tensor:
    """Rearrange an image batch [B, C, H, W] as a mosaic. The tokens beyond the patches lead the sequence
    (ViT's class token; DeiT's class and distillation tokens): they are no pixels, so they must stay put.
    Rows and columns past the last whole patch (an image size that is no multiple of the patch size) are read by
    no patch, as the patch embedding's strided convolution drops them: they stay where they are."""
    height, width = pixels.shape[-2] // patch_size, pixels.shape[-1] // patch_size
    leading = len(tokens.index) - height * width
    if leading < 0 or not torch.equal(tokens.index[:leading], torch.arange(leading)):
        raise ValueError(f"a permutation of {len(tokens.index)} tokens cannot shuffle {height * width} patches "
                         "while keeping the leading non-patch tokens in place")
    patch_order = tokens.index[leading:] - leading
    tiled = pixels[..., :height * patch_size, :width * patch_size]
    patches = rearrange(tiled, "b c (h p1) (w p2) -> b (h w) c p1 p2", p1=patch_size, p2=patch_size)
    patches = patches[:, patch_order.to(pixels.device)]
    shuffled = rearrange(patches, "b (h w) c p1 p2 -> b c (h p1) (w p2)", h=height)
    if shuffled.shape == pixels.shape:
        return shuffled
    result = pixels.clone()
    result[..., :height * patch_size, :width * patch_size] = shuffled
    return result
