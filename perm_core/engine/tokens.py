"""Inter-token permutation of model inputs: ids, position ids, token types, masks, image patches.

Positions travel with their tokens (position ids for text, counted from Geometry.position_offset as
the model itself counts them; for ViT the learned position table is permuted by the spec's "positions"
role), so the model sees the same set of (token, position) pairs.
Causal models get the causal mask as an additive float 4D mask built from the permuted positions:
query i may attend key j iff position[j] <= position[i]. (A bool 4D mask is silently wrong in eager.)
Models with sliding-window layers (Gemma 3) get a dict of two such masks, one per layer type, the window
also measured in positions: key j is in query i's window iff position[i] - window < position[j].
(A single 4D mask would be used as-is by every layer, silently dropping the window.) Mistral builds one
mask for all its layers, all sliding: it gets a single mask with the window built in.
Encoder-decoders (T5, input_kind "seq2seq-text") move only the encoder's tokens (ids and mask); the decoder's
stay in order. T5 has no position ids to move along: its relative position bias reads sequence order, so
tokens is no symmetry there (Geometry.not_holding). Moving the encoder input alone isolates that cause:
cross-attention has no position bias and sums over encoder tokens in any order, so without the encoder's
bias the decoder would not notice, and every change measured comes from that bias.
"""

from __future__ import annotations

import torch

from perm_core.engine.patches import shuffle_patches
from perm_core.engine.spec import Scramble
from perm_core.families.base import Geometry, UnsupportedModelError

# A Scramble skip tag for a negative control: the sliding window stays in sequence order (where the
# tokens now stand) instead of moving with the tokens' positions.
WINDOW_NOT_MOVED = "sliding_window_mask"


def n_tokens(inputs: dict, g: Geometry) -> int:
    """The tokens of the sequence the model runs (of each choice, for a multiple-choice head). An image whose
    patches do not fill the model's position table exactly is refused (UnsupportedModelError: a CLI usage error):
    the table's rows would not be the tokens that move."""
    if g.input_kind == "image":
        pixels = inputs["pixel_values"]
        count = (pixels.shape[-2] // g.patch_size) * (pixels.shape[-1] // g.patch_size) + g.fixed_tokens
        if g.image_tokens is not None and count != g.image_tokens:
            raise UnsupportedModelError(
                f"an image of {pixels.shape[-2]}x{pixels.shape[-1]} pixels gives {count - g.fixed_tokens} patches of "
                f"{g.patch_size} and {g.fixed_tokens} fixed token(s), but the model's position table holds "
                f"{g.image_tokens} tokens: the image must have the size the config names")
        return count
    return inputs["input_ids"].shape[-1]


def model_inputs(inputs: dict, g: Geometry, scramble: Scramble, dtype: torch.dtype) -> dict:
    """The keyword arguments for the stock model, with the scramble's token permutation applied."""
    tokens = scramble.tokens
    if g.input_kind == "image":
        pixels = inputs["pixel_values"]
        pixels = pixels if pixels.dtype == dtype else pixels.to(dtype)  # a call even when a no-op: a GIL wait
        return {"pixel_values": shuffle_patches(pixels, tokens, g.patch_size) if tokens is not None else pixels}
    ids, mask, token_types = inputs["input_ids"], inputs.get("attention_mask"), inputs.get("token_type_ids")
    if g.multiple_choice and ids.dim() == 2:  # [batch, tokens]: one choice each
        ids, mask, token_types = (None if t is None else t[:, None] for t in (ids, mask, token_types))
    length = ids.shape[-1]
    mask = torch.ones_like(ids) if mask is None else mask
    positions = (torch.arange(length, device=ids.device) + g.position_offset).expand(ids.shape)
    if g.position_offset:  # RoBERTa: padding tokens sit at position padding_idx and do not count, as in its forward
        padding_idx = g.position_offset - 1
        real = ids != padding_idx
        positions = torch.where(real, torch.cumsum(real, dim=-1) + padding_idx, padding_idx)
    if tokens is not None:  # the last axis is the tokens' (of each choice, for a multiple-choice head)
        order = tokens.index.to(ids.device)
        ids, mask = ids[..., order], mask[..., order]
        token_types = token_types[..., order] if token_types is not None else None
        if scramble.positions_follow_tokens:
            positions = positions[..., order]
    if ids.dim() == 3:  # [batch, choices, tokens]: the heads flatten ids to [batch * choices, tokens], and
        positions = positions.reshape(-1, length)  # DistilBERT's does not flatten position ids: given so
    if g.input_kind == "seq2seq-text":  # T5 takes no position ids: its positions are the sequence order
        return {"input_ids": ids, "attention_mask": mask, **_decoder_inputs(inputs, g)}
    kwargs = {"input_ids": ids, "position_ids": positions}
    if g.input_kind == "bidirectional-text":
        kwargs["attention_mask"] = mask
        if token_types is not None:
            kwargs["token_type_ids"] = token_types
    elif g.sliding_window:
        window_positions = positions
        if WINDOW_NOT_MOVED in scramble.skip_tags:
            window_positions = torch.arange(length, device=ids.device).expand(ids.shape)
        sliding = causal_float_mask(positions, mask, dtype, g.sliding_window, window_positions)
        kwargs["attention_mask"] = sliding if g.window_in_every_layer else {
            "full_attention": causal_float_mask(positions, mask, dtype), "sliding_attention": sliding}
    else:
        kwargs["attention_mask"] = causal_float_mask(positions, mask, dtype)
    return kwargs


def _decoder_inputs(inputs: dict, g: Geometry) -> dict:
    """An encoder-decoder's decoder tokens, never moved (see the module docstring). Given text alone (the
    sidebar's), the decoder reads that same text in its original order."""
    if not g.n_decoder_layers:
        return {}
    if inputs.get("decoder_input_ids") is None:
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    else:
        ids, mask = inputs["decoder_input_ids"], inputs.get("decoder_attention_mask")
    return {"decoder_input_ids": ids} if mask is None else {"decoder_input_ids": ids, "decoder_attention_mask": mask}


def causal_float_mask(positions: torch.Tensor, padding_mask: torch.Tensor, dtype: torch.dtype,
                      window: int | None = None, window_positions: torch.Tensor | None = None) -> torch.Tensor:
    """[B, 1, query, key]: 0 where allowed, finfo.min elsewhere. With a window, key j must also satisfy
    window_positions[i] - window < window_positions[j] (window_positions: the positions by default)."""
    allowed = positions[:, None, :] <= positions[:, :, None]  # [B, query, key]
    if window is not None:
        at = positions if window_positions is None else window_positions
        allowed = allowed & (at[:, None, :] > at[:, :, None] - window)
    allowed = allowed & padding_mask[:, None, :].bool()
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]  # [B, 1, query, key]
