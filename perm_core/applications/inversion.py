"""The attacker's side of split learning: black-box model inversion (Xu et al., CVPR 2024, 5.2).

Threat model (what the honest-but-curious server knows):
- the architecture and the client's embedding weights (worst case: a public pretrained embedding;
  here the shipped digits-vit's embedding layer) and auxiliary images from the same distribution
  (the 1,437 training digits). So it can compute the features it would receive for any image.
- which protection the client uses (Kerckhoffs), but not the client's secrets: the channel key
  (one fixed permutation of the 64 channels) and the token orders (a fresh random order of the 16
  patch tokens for every sample, drawn by the client; [CLS] stays first).
- the protected features of the victims (the 360 held-out digits), never their images.

Two attackers:
- "decoder" (the paper's black-box attack): train a decoder features -> image on auxiliary
  features as the attacker would see them without the secrets (plain channels, since any guessed key
  is as good as any other; tokens shuffled by its own random orders when the client shuffles), then
  decode the victims' features.
- "adaptive": first undo what can be undone without the key, then use the plain decoder. Channels:
  match each received channel to an auxiliary channel by its value distribution (19 quantiles,
  Hungarian assignment). Tokens: each patch token is W·patch + b + pos_i with W known and only 4
  pixels per patch, so the position i is the one whose residual outside W's column space is smallest
  (Hungarian assignment per sample).

Scores: SSIM and PSNR (skimage, data_range=1) between de-normalized 0..1 images, averaged over
victims; baselines: a blank (all-background) image and the mean training image for every victim.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from perm_core.applications.split_learning import (
    DEFAULT_KEY,
    DEFAULT_SEED,
    Progress,
    channel_permutation,
    shuffle_patch_tokens,
)
from perm_core.engine import keys
from perm_core.models.digits import PIXEL_MEAN, PIXEL_STD, digits_split
from perm_core.run.threads import torch_threads

PROTECTIONS = ("none", "tokens", "channels", "both")
PROTECTION_LABELS = {
    "none": "no protection",
    "tokens": "tokens shuffled (fresh order per sample)",
    "channels": "channels permuted (secret key)",
    "both": "tokens shuffled + channels permuted",
}
DEFAULT_EPOCHS = 15
QUANTILES = torch.linspace(0.05, 0.95, 19)


@dataclass
class AttackRow:
    protection: str
    attacker: str  # "decoder" | "adaptive"
    ssim: float
    psnr: float
    channels_recovered: int | None = None  # adaptive attacker: correctly matched channels (of 64)
    token_orders_recovered: float | None = None  # adaptive attacker: fraction of victims fully re-ordered


@dataclass
class AttackResult:
    seed: int
    key: int
    epochs: int
    n_victims: int
    rows: list[AttackRow]
    baselines: list[dict]  # {"name": "blank" | "mean training image", "ssim", "psnr"}
    originals: np.ndarray  # [n_show, 8, 8] in 0..1
    reconstructions: dict = field(default_factory=dict)  # "protection/attacker" -> [n_show, 8, 8]
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"seed": self.seed, "key": self.key, "epochs": self.epochs, "n_victims": self.n_victims,
                "rows": [asdict(r) for r in self.rows], "baselines": self.baselines, "seconds": self.seconds}


def to_unit_images(normalized: torch.Tensor) -> np.ndarray:
    """Model inputs [N, 1, 8, 8] or [N, 64] -> de-normalized pixels in 0..1, [N, 8, 8]."""
    pixels = normalized.detach().reshape(-1, 8, 8).double() * PIXEL_STD + PIXEL_MEAN
    return pixels.clamp(0, 1).numpy()


def image_scores(originals: np.ndarray, images: np.ndarray) -> tuple[float, float]:
    """Mean SSIM and mean PSNR (dB, capped at 99 for a perfect image) over pairs of 0..1 images."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    ssim = [structural_similarity(o, r, data_range=1.0) for o, r in zip(originals, images, strict=True)]
    psnr = [min(99.0, peak_signal_noise_ratio(o, r, data_range=1.0)) if np.any(o != r) else 99.0
            for o, r in zip(originals, images, strict=True)]
    return float(np.mean(ssim)), float(np.mean(psnr))


def make_decoder(n_tokens: int, d_model: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(n_tokens * d_model, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 64))


def train_decoder(decoder, features_fn, targets, epochs, seed, tick) -> torch.nn.Module:
    """Fit decoder(features) -> image (MSE on normalized pixels); features_fn(idx) gives a batch."""
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(targets), generator=generator)
        for start in range(0, len(order), 64):
            idx = order[start : start + 64]
            loss = F.mse_loss(decoder(features_fn(idx)), targets[idx].flatten(1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            tick()
    return decoder.eval()


def recover_channels(received: torch.Tensor, auxiliary: torch.Tensor) -> torch.Tensor:
    """Guess `perm` with received = plain[..., perm] by matching per-channel value distributions."""
    from scipy.optimize import linear_sum_assignment

    def signature(features):  # [N, T, d] -> [d, 19]; patch tokens only, so token order does not matter
        return torch.quantile(features[:, 1:].reshape(-1, features.shape[-1]).double(), QUANTILES.double(), dim=0).T

    cost = torch.cdist(signature(received), signature(auxiliary))  # [received channel, plain channel]
    _, matched = linear_sum_assignment(cost.numpy())
    return torch.as_tensor(matched, dtype=torch.long)


def recover_token_order(received: torch.Tensor, embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """Put each sample's patch tokens back at their positions; returns (re-ordered features, positions)."""
    from scipy.optimize import linear_sum_assignment

    weight = embeddings.patch_embeddings.projection.weight.detach().flatten(1).double()  # [d, 4]
    bias = embeddings.patch_embeddings.projection.bias.detach().double()
    positions = embeddings.position_embeddings.detach()[0, 1:].double()  # [16, d]
    outside = torch.eye(weight.shape[0], dtype=torch.float64) - weight @ torch.linalg.pinv(weight)
    tokens = (received[:, 1:].double() - bias) @ outside.T  # what W·patch cannot explain
    cost = torch.cdist(tokens, (positions @ outside.T).expand(len(tokens), -1, -1))  # [N, token, position]
    placed = torch.empty(len(tokens), tokens.shape[1], dtype=torch.long)
    for n in range(len(tokens)):
        placed[n] = torch.as_tensor(linear_sum_assignment(cost[n].numpy())[1])
    restored = received.clone()
    batch = torch.arange(len(tokens))[:, None]
    restored[batch, placed + 1] = received[:, 1:]
    return restored, placed


def run_attack(seed: int = DEFAULT_SEED, key: int = DEFAULT_KEY, epochs: int = DEFAULT_EPOCHS,
               n_victims: int = 360, n_show: int = 8, adaptive: bool = True, progress: Progress | None = None,
               show_bar: bool = False) -> AttackResult:
    """Train the attacker's decoders and score their reconstructions for every protection.

    Deterministic for (seed, key, epochs, n_victims): the seed drives the decoders' init and batch
    order and the attacker's own token shuffles; the key drives the client's secrets.
    """
    from tqdm.auto import tqdm

    from perm_core.models.registry import load_model
    from perm_core.models.zoo import SPLIT_LEARNING, serving

    if epochs < 1 or not 1 <= n_victims <= 360 or n_show < 0:
        raise ValueError("epochs must be at least 1 and the number of victims between 1 and 360")
    key = keys.validate_key(key)
    started = time.perf_counter()
    with torch_threads(1), torch.no_grad():  # tiny models: one thread is fastest on a shared machine
        (public_model,) = serving(SPLIT_LEARNING)
        embeddings = load_model(public_model).model.vit.embeddings.eval()
        train_x, _, test_x, _ = digits_split()
        victims_x = test_x[:n_victims]
        auxiliary = embeddings(train_x)  # [1437, 17, 64]: what the attacker computes itself
        plain_victims = embeddings(victims_x)
        client_channels = channel_permutation(key, auxiliary.shape[-1])
        client_tokens = torch.Generator().manual_seed(key % 2**63)
        received = {  # what the server receives from the client under each protection
            "none": plain_victims,
            "tokens": shuffle_patch_tokens(plain_victims, client_tokens),
            "channels": plain_victims[..., client_channels],
        }
        received["both"] = shuffle_patch_tokens(plain_victims, client_tokens)[..., client_channels]

    steps = 2 * epochs * -(-len(train_x) // 64)
    bar = tqdm(total=steps, desc="training inversion decoders", disable=not show_bar)
    done = [0]

    def tick():
        done[0] += 1
        bar.update(1)
        if progress is not None:
            progress(done[0] / steps, f"inversion decoder step {done[0]}/{steps}")

    attacker_tokens = torch.Generator().manual_seed(seed)
    t, d = auxiliary.shape[1:]
    with torch_threads(1):
        plain_decoder = train_decoder(make_decoder(t, d, seed), lambda idx: auxiliary[idx], train_x, epochs, seed, tick)
        shuffle_decoder = train_decoder(make_decoder(t, d, seed + 1),
                                        lambda idx: shuffle_patch_tokens(auxiliary[idx], attacker_tokens),
                                        train_x, epochs, seed + 1, tick)
    bar.close()

    originals = to_unit_images(victims_x)
    rows, images = [], {}

    def score(protection, attacker, decoder, features, **extra):
        with torch.no_grad():
            reconstruction = to_unit_images(decoder(features.float()))
        rows.append(AttackRow(protection, attacker, *image_scores(originals, reconstruction), **extra))
        images[f"{protection}/{attacker}"] = reconstruction[:n_show]

    for protection in PROTECTIONS:
        shuffled = protection in ("tokens", "both")
        score(protection, "decoder", shuffle_decoder if shuffled else plain_decoder, received[protection])
    if adaptive:
        with torch.no_grad():
            restored, _ = recover_token_order(received["tokens"], embeddings)
            score("tokens", "adaptive", plain_decoder, restored, token_orders_recovered=_fraction_same(
                restored, plain_victims))
            for protection in ("channels", "both"):
                guess = recover_channels(received[protection], auxiliary)
                features = received[protection][..., torch.argsort(guess)]
                extra = {"channels_recovered": int((guess == client_channels).sum())}
                if protection == "both":
                    features, _ = recover_token_order(features, embeddings)
                    extra["token_orders_recovered"] = _fraction_same(features, plain_victims)
                score(protection, "adaptive", plain_decoder, features, **extra)

    mean_image = to_unit_images(train_x).mean(0)
    baselines = []
    for name, image in (("blank", np.zeros((8, 8))), ("mean training image", mean_image)):
        ssim, psnr = image_scores(originals, np.broadcast_to(image, originals.shape))
        baselines.append({"name": name, "ssim": ssim, "psnr": psnr})
    return AttackResult(seed, key, epochs, n_victims, rows, baselines, originals[:n_show], images,
                        round(time.perf_counter() - started, 2))


def _fraction_same(features: torch.Tensor, reference: torch.Tensor) -> float:
    per_sample = (features - reference).abs().flatten(1).amax(1)
    return float((per_sample < 1e-4).float().mean())
