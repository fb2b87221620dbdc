"""Privacy-enhancing split learning on digits (Xu et al., CVPR 2024, section 5).

The client keeps the ViT's embedding layer (patch embedding + [CLS] + position embeddings) and a
secret key; it sends the server token features [B, 17, 64], and the server runs the Transformer
blocks, the final LayerNorm and the classifier head. Under protection the client sends
    features[:, token_order, :][..., channel_key]
- channels: one fixed permutation of the 64 feature channels drawn from the key. The server's
  weights live in that permuted basis (it never sees the plain basis).
- tokens: a fresh random order of the 16 patch tokens for every sample ([CLS] stays first, since the
  head reads it; it carries no image content). The blocks are token-equivariant, so the server
  needs no key for this at all.

Why the scrambled world trains exactly like the plain one: the server's model on permuted features
with permuted weights computes the permuted plain activations (forward and backward), and AdamW is
elementwise, so every update is the permuted plain update. We initialize the server with the
permuted plain initialization (a random init is permutation-invariant in distribution anyway) and
use the same batch order, so the two runs are step-for-step comparable: they differ only by
float32 round-off (gathers change the summation order).

`train_split(...)` returns both training curves, the final accuracies and the largest weight
difference between the un-scrambled server and the plain server.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from perm_core.engine import keys
from perm_core.models.digits import digits_split, digits_vit_config
from perm_core.run.threads import torch_threads
from perm_core.verify.tolerances import worst

Progress = Callable[[float, str], None]
DEFAULT_EPOCHS = 10  # a short run; the page and the CLI report the held-out accuracy it reaches
DEFAULT_KEY = 2024
DEFAULT_SEED = 0


def channel_permutation(key: int, d_model: int = 64) -> torch.Tensor:
    """The client's secret channel permutation (the same draw as symmetries.channels(key))."""
    return keys.permutation(key, d_model, "channels")


def shuffle_patch_tokens(features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A fresh random order of the patch tokens of every sample; token 0 ([CLS]) stays first."""
    b, t, _ = features.shape
    order = torch.argsort(torch.rand(b, t - 1, generator=generator), dim=1) + 1
    order = torch.cat([torch.zeros(b, 1, dtype=torch.long), order], dim=1)
    return features.gather(1, order[:, :, None].expand_as(features))


def protect(features: torch.Tensor, channels: torch.Tensor | None, token_generator: torch.Generator | None):
    """What the client sends: features with shuffled tokens and/or permuted channels."""
    if token_generator is not None:
        features = shuffle_patch_tokens(features, token_generator)
    if channels is not None:
        features = features[..., channels]
    return features


def server_forward(model, features: torch.Tensor) -> torch.Tensor:
    """The server's half of a ViTForImageClassification: blocks -> LayerNorm -> head on [CLS]."""
    hidden = features
    for layer in model.vit.layers:
        hidden = layer(hidden, None)
    return model.classifier(model.vit.layernorm(hidden)[:, 0])


def permuted_copy(model, channels: torch.Tensor):
    """A copy of `model` whose weights are the channel-permuted weights (the server's basis)."""
    from perm_core.engine.spec import Scramble
    from perm_core.engine.transforms import Permutation
    from perm_core.verify.subject import Subject

    permuted = Subject(model).transformed_params(Scramble({("resid", None): (Permutation(channels),)}))
    copy = type(model)(model.config).to(next(model.parameters()).dtype)
    copy.load_state_dict({name: tensor.detach().clone() for name, tensor in permuted.items()}, strict=False)
    return copy


@dataclass
class SplitTraining:
    seed: int
    key: int
    epochs: int
    batch_size: int
    lr: float
    plain_accuracy: list[float] = field(default_factory=list)  # test accuracy after each epoch
    scrambled_accuracy: list[float] = field(default_factory=list)
    plain_loss: list[float] = field(default_factory=list)  # mean training loss per epoch
    scrambled_loss: list[float] = field(default_factory=list)
    max_weight_difference: float = 0.0  # max |un-scrambled server weight - plain weight|, end of training
    seconds: float = 0.0

    @property
    def final_plain_accuracy(self) -> float:
        return self.plain_accuracy[-1]

    @property
    def final_scrambled_accuracy(self) -> float:
        return self.scrambled_accuracy[-1]

    def to_json(self) -> dict:
        return {**asdict(self), "final_plain_accuracy": self.final_plain_accuracy,
                "final_scrambled_accuracy": self.final_scrambled_accuracy}


@torch.no_grad()
def _accuracy(embeddings, server, test_x, test_y, channels, token_generator) -> float:
    features = protect(embeddings(test_x), channels, token_generator)
    return (server_forward(server, features).argmax(-1) == test_y).float().mean().item()


def accuracy_gap(training: SplitTraining) -> float:
    """The largest |plain - scrambled| held-out accuracy over the epochs of one run."""
    return worst(abs(a - b) for a, b in zip(training.plain_accuracy, training.scrambled_accuracy, strict=True))


def train_split(seed: int = DEFAULT_SEED, key: int = DEFAULT_KEY, epochs: int = DEFAULT_EPOCHS,
                batch_size: int = 32, lr: float = 2e-3, progress: Progress | None = None,
                show_bar: bool = False, dtype: torch.dtype = torch.float32) -> SplitTraining:
    """Train a fresh digits ViT through the split twice: plain, and scrambled (tokens + channels).

    Deterministic for (seed, key, settings). The two runs differ only by round-off, which training
    amplifies in either precision: `max_weight_difference` and `accuracy_gap` measure how far apart
    they end (float64 ends much closer than float32, but not at float64 round-off).
    """
    from tqdm.auto import tqdm
    from transformers import ViTForImageClassification

    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ValueError("epochs and batch size must be at least 1 and the learning rate positive")
    key = keys.validate_key(key)
    started = time.perf_counter()
    result = SplitTraining(seed, key, epochs, batch_size, lr)
    with torch_threads(1):  # a model this small runs fastest on one thread (2 threads: 10x slower on a busy machine)
        torch.manual_seed(seed)  # HF's init draws from the global generator
        plain = ViTForImageClassification(digits_vit_config()).to(dtype).train()
        channels = channel_permutation(key, plain.config.hidden_size)
        scrambled = permuted_copy(plain, channels).to(dtype).train()
        # The client's embedding layer is its own copy in the plain basis; only the server is permuted.
        scrambled_server_params = [p for n, p in scrambled.named_parameters() if "embeddings" not in n]
        client = ViTForImageClassification(plain.config).to(dtype)
        client.load_state_dict(plain.state_dict())
        client_embeddings = client.vit.embeddings
        runs = {
            "plain": (plain.vit.embeddings, plain, list(plain.parameters()), None, None),
            "scrambled": (client_embeddings, scrambled, [*client_embeddings.parameters(), *scrambled_server_params],
                          channels, torch.Generator().manual_seed(keys.validate_key(key) % 2**63)),
        }
        optimizers = {name: torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
                      for name, (_, _, params, _, _) in runs.items()}
        train_x, train_y, test_x, test_y = digits_split()
        train_x, test_x = train_x.to(dtype), test_x.to(dtype)
        order_generator = torch.Generator().manual_seed(seed)
        steps_per_epoch = math.ceil(len(train_y) / batch_size)
        total = epochs * steps_per_epoch
        bar = tqdm(total=total, desc="split training (plain + scrambled)", disable=not show_bar)
        step = 0
        for epoch in range(epochs):
            order = torch.randperm(len(train_y), generator=order_generator)
            sums = {name: 0.0 for name in runs}
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                # One epoch of linear warm-up, then cosine decay (a tiny ViT from scratch is unstable
                # at full lr); the same schedule for both runs.
                rate = lr * min(1.0, (step + 1) / steps_per_epoch) * 0.5 * (1 + math.cos(math.pi * step / total))
                for optimizer in optimizers.values():
                    for group in optimizer.param_groups:
                        group["lr"] = rate
                for name, (embeddings, server, _, perm, generator) in runs.items():
                    features = protect(embeddings(train_x[idx]), perm, generator)  # the client's message
                    loss = F.cross_entropy(server_forward(server, features), train_y[idx])
                    optimizers[name].zero_grad(set_to_none=True)
                    loss.backward()  # the gradient flows back to the client through the same gather
                    optimizers[name].step()
                    sums[name] += loss.item() * len(idx)
                step += 1
                bar.update(1)
                if progress is not None:
                    progress(step / total, f"epoch {epoch + 1}/{epochs}, step {step}/{total}")
            for name, (embeddings, server, _, perm, generator) in runs.items():
                getattr(result, f"{name}_loss").append(sums[name] / len(train_y))
                getattr(result, f"{name}_accuracy").append(
                    _accuracy(embeddings, server, test_x, test_y, perm, generator))
        bar.close()
        inverse = torch.argsort(channels)
        restored = permuted_copy(scrambled, inverse).state_dict()
        reference = plain.state_dict()
        result.max_weight_difference = worst(  # a NaN anywhere is +inf, never dropped
            (restored[name] - reference[name]).abs().max().item()
            for name in reference if "embeddings" not in name)
    result.seconds = round(time.perf_counter() - started, 2)
    return result
