"""The fusion experiment's pairs: digits ViTs wider than digits-vit, trained here from two seeds each.

Data: the digits training split (perm_core.models.digits) less HELD_OUT images, drawn once with a fixed seed and
never trained on: activation matching reads the models' activations on them. Accuracy and loss are measured
on the 360 test digits, as for every digits model.
Architecture: patches of 4x4 pixels (four tokens and [CLS], so a wide model trains in seconds), `width`
residual channels, `heads` heads, MLP of 2 x width, no dropout. Training: AdamW (learning rate 2e-3, weight
decay 0.05), batches of 64, one warm-up epoch then cosine decay, in float32; the trained model is handed over
in float64, where an aligned model's proof reaches round-off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HELD_OUT = 200  # training images kept out of training, for activation matching
SPLIT_SEED = 0
BATCH = 64
LEARNING_RATE = 2e-3


@dataclass(frozen=True)
class PairSettings:
    """What every pair of the experiment is; the pair's seeds are (2 i, 2 i + 1) for pair i."""

    width: int = 128
    layers: int = 2
    heads: int = 4
    epochs: int = 15
    patch: int = 4

    def config(self):
        from transformers import ViTConfig

        return ViTConfig(image_size=8, patch_size=self.patch, num_channels=1, hidden_size=self.width,
                         num_hidden_layers=self.layers, num_attention_heads=self.heads,
                         intermediate_size=2 * self.width, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, num_labels=10, attn_implementation="eager")


def held_out_split() -> tuple[torch.Tensor, torch.Tensor]:
    """(indices into the training split the pairs train on, indices held out for activation matching)."""
    from perm_core.models.digits import digits_split

    n = len(digits_split()[1])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    return order[:-HELD_OUT], order[-HELD_OUT:]


def train_member(settings: PairSettings, seed: int, progress=None):
    """One model of a pair, trained from `seed` (initialization and batches), returned in float64, eval mode."""
    from transformers import ViTForImageClassification

    from perm_core.models.digits import digits_split

    train_x, train_y, _, _ = digits_split()
    fit, _ = held_out_split()
    torch.manual_seed(seed)  # Hugging Face's initialization draws from the global generator
    model = ViTForImageClassification(settings.config()).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.05)
    generator = torch.Generator().manual_seed(seed)
    per_epoch = math.ceil(len(fit) / BATCH)
    total = settings.epochs * per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / per_epoch) * 0.5 * (1 + math.cos(math.pi * step / total)))
    for epoch in range(settings.epochs):
        order = fit[torch.randperm(len(fit), generator=generator)]
        for start in range(0, len(order), BATCH):
            batch = order[start:start + BATCH]
            loss = F.cross_entropy(model(pixel_values=train_x[batch]).logits, train_y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if progress:
            progress((epoch + 1) / settings.epochs)
    return model.eval().double()
