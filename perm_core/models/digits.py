"""digits-vit: a tiny ViT trained on scikit-learn's bundled 8x8 digits.

It is the project's always-available image model: it ships in perm_core/data/models/, loads in
milliseconds and is accurate enough (>= 95 % held-out) that scrambling it visibly matters.

Data: sklearn.datasets.load_digits, 1,797 gray 8x8 images with integer pixels 0..16,
light strokes on a dark background. Split: stratified 80/20 with
`train_test_split(..., test_size=0.2, stratify=y, random_state=0)` -> 1,437 train / 360 test.
The split never depends on the training seed, so every digits model is measured on the
same 360 held-out images.

Preprocessing (identical in training, evaluation and the app's image pipeline):
    x = (pixel / 16 - PIXEL_MEAN) / PIXEL_STD
with PIXEL_MEAN, PIXEL_STD the training split's statistics (0.3054, 0.3761), rounded.
They are also stored in config.json under "digits_preprocessing".

Training from the command line:
    python -m perm_core train-digits --seed 0 --out perm_core/data/models/digits-vit
    python -m perm_core train-digits --seed 1 --out perm_core/data/models/digits-vit-b
writes model.safetensors + config.json (save_pretrained, safetensors) and metrics.json.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from perm_core.run.threads import torch_threads

PIXEL_SCALE = 16.0  # digits pixels are counts of "on" pixels in a 4x4 block: 0..16
PIXEL_MEAN = 0.305
PIXEL_STD = 0.376
SPLIT_SEED = 0
TEST_FRACTION = 0.2
SPLIT_DESCRIPTION = (
    "sklearn.datasets.load_digits; sklearn.model_selection.train_test_split(test_size=0.2, "
    "stratify=target, random_state=0): 1437 train / 360 test"
)
LABELS = [str(d) for d in range(10)]
DEFAULT_EPOCHS = 60


def digits_vit_config():
    """The architecture of digits-vit / digits-vit-b: 2x2 patches -> 16 patch tokens + [CLS]."""
    from transformers import ViTConfig

    return ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=10,
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
        digits_preprocessing={"scale": PIXEL_SCALE, "mean": PIXEL_MEAN, "std": PIXEL_STD},
    )


def normalize_pixels(raw: torch.Tensor) -> torch.Tensor:
    """Raw digits pixels (0..16) -> model input. Works on any shape."""
    return (raw / PIXEL_SCALE - PIXEL_MEAN) / PIXEL_STD


@functools.cache
def _load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(raw images [1797, 1, 8, 8] 0..16, targets), read once per process: the app draws a digit on every
    rerun, and reading the bundled file costs 15 ms of the server's one GIL. Callers only index it (a copy)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return torch.tensor(data.images, dtype=torch.float32).unsqueeze(1), torch.tensor(data.target, dtype=torch.long)


@functools.cache
def _split_indices() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    target = _load_digits()[1].numpy()
    return tuple(train_test_split(np.arange(len(target)), test_size=TEST_FRACTION, stratify=target,
                                  random_state=SPLIT_SEED))


def split_indices() -> tuple[np.ndarray, np.ndarray]:
    """Indices into load_digits() of the fixed train and test split."""
    return tuple(indices.copy() for indices in _split_indices())


def digits_split(raw: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x, train_y, test_x, test_y); x is float32 [N, 1, 8, 8], normalized unless raw=True."""
    images, target = _load_digits()
    train_idx, test_idx = _split_indices()
    if not raw:
        images = normalize_pixels(images)
    return images[train_idx], target[train_idx], images[test_idx], target[test_idx]


@torch.no_grad()
def evaluate_digits(model: torch.nn.Module, batch_size: int = 512) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of a digits classifier on the 360 held-out images."""
    _, _, test_x, test_y = digits_split()
    param = next(model.parameters())
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(test_y), batch_size):
        x = test_x[start : start + batch_size].to(param.device, param.dtype)
        y = test_y[start : start + batch_size].to(param.device)
        logits = model(pixel_values=x).logits.float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
    model.train(was_training)
    return correct / len(test_y), loss_sum / len(test_y)


def random_shift(
    x: torch.Tensor, generator: torch.Generator, max_shift: int = 1, prob: float = 1.0
) -> torch.Tensor:
    """Shift each image (with probability prob) by up to max_shift pixels in x and y.

    Vacated pixels get the background value. Digits are centred but not perfectly;
    one-pixel shifts are the only augmentation that makes sense on an 8x8 grid, and even
    they cost a stroke at the border, so training shifts only half of the images.
    """
    n, _, h, w = x.shape
    background = normalize_pixels(torch.tensor(0.0))
    padded = F.pad(x, (max_shift,) * 4, value=background.item())
    offsets = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=generator)
    rows = offsets[:, 0, None] + torch.arange(h)  # [n, h]
    cols = offsets[:, 1, None] + torch.arange(w)  # [n, w]
    batch = torch.arange(n)[:, None, None]
    shifted = padded[batch, 0, rows[:, :, None], cols[:, None, :]].unsqueeze(1)
    keep = torch.rand(n, generator=generator) < prob
    return torch.where(keep[:, None, None, None], shifted, x)


def train_digits(
    seed: int,
    out_dir: str | os.PathLike,
    epochs: int = DEFAULT_EPOCHS,
    progress: bool = True,
    batch_size: int = 64,
    lr: float = 1e-3,
    shift_prob: float = 0.5,
) -> dict:
    """Train digits-vit from scratch, save it to out_dir and return its metrics.

    Deterministic for a given seed (initialization, shuffling and augmentation all draw
    from generators seeded here). Takes well under a minute on 2 CPU cores.
    Usage: python -m perm_core train-digits --seed 0 --out perm_core/data/models/digits-vit
    """
    from tqdm.auto import tqdm
    from transformers import ViTForImageClassification

    out_dir = Path(out_dir)
    started = time.perf_counter()
    with torch_threads(min(2, os.cpu_count() or 1)):
        torch.manual_seed(seed)  # HF's init draws from the global generator
        model = ViTForImageClassification(digits_vit_config()).train()
        train_x, train_y, _, _ = digits_split()
        generator = torch.Generator().manual_seed(seed)

        steps_per_epoch = math.ceil(len(train_y) / batch_size)
        total_steps = epochs * steps_per_epoch
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
        warmup = steps_per_epoch * 2
        # Linear warm-up then cosine decay: a tiny ViT from scratch is unstable at full lr.
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: (
                min(1.0, (step + 1) / warmup)
                * 0.5
                * (1 + math.cos(math.pi * min(step, total_steps) / total_steps))
            ),
        )
        bar = tqdm(total=total_steps, desc=f"train digits-vit seed {seed}", disable=not progress)
        for _ in range(epochs):
            order = torch.randperm(len(train_y), generator=generator)
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                x = random_shift(train_x[idx], generator, prob=shift_prob)
                loss = F.cross_entropy(model(pixel_values=x).logits, train_y[idx], label_smoothing=0.05)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        bar.close()
        model.eval()
        accuracy, test_loss = evaluate_digits(model)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    metrics = {
        "test_accuracy": accuracy,
        "test_loss": test_loss,
        "seed": seed,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "augmentation": f"random 1-pixel shift of {shift_prob:.0%} of the images",
        "train_seconds": round(time.perf_counter() - started, 1),
        "command": f"python -m perm_core train-digits --seed {seed} --out {out_dir.as_posix()}",
        "split": SPLIT_DESCRIPTION,
        "preprocessing": f"(pixel / {PIXEL_SCALE:g} - {PIXEL_MEAN}) / {PIXEL_STD}",
        "n_params": sum(p.numel() for p in model.parameters()),
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics
