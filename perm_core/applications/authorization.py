"""Model authorization (Xu et al., CVPR 2024): publish a locked model that only works with the key.

The scheme, concretely:
  * The key draws a permutation P of the residual channels ("channels" symmetry).
  * Locking: every parameter *after* the embedding layer (all blocks, their norms, the final norm
    and the head) is transformed by P, exactly as the channels symmetry prescribes. The embedding
    layer (patch or token embeddings, [CLS], positions, BERT's embedding LayerNorm) is published
    unchanged. The published model is the locked backbone plus the plain embedding layer.
  * A key holder applies P to the features the embedding layer produces (features[..., P]). The
    embedding layer is linear and per-channel, so that is the same as using the embedding layer
    with its output channels gathered by P, which is how it is computed here (an exact gather).
    The model is then exactly the channels-scrambled original: outputs are identical (classifier
    logits) or channel-permuted (hidden states, whose cosine similarities are unchanged).
    A causal LM with a tied head shares its embedding matrix with the head, so the key holder's
    client also un-permutes the final features before the head; the same gather does both.
  * No key: plain features into the locked backbone. Wrong key: features permuted by Q != P. The
    backbone then sees its residual channels in the wrong order, which is a different network.
The key is a whole number of up to 256 bits, usually written in hex (at most 2^256 guesses); it draws one of
the d_model! orderings of the permutation group (symmetries.key_space_bits("channels"): 296 bits for
d_model = 64), so a key reaches at most min(2^256, d_model!) of them.
What this does not claim: security against an attacker who can fine-tune or who fits the
permutation from data; it shows what the permutation symmetry makes possible, as in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from perm_core.data import shipped_json
from perm_core.engine import keys, symmetries
from perm_core.engine.spec import Scramble, apply_axes
from perm_core.engine.tokens import model_inputs
from perm_core.models.registry import mean_pool
from perm_core.run.stateless import functional_call
from perm_core.verify.subject import Subject

PARAPHRASES = ("samples", "paraphrases.json")  # in perm_core.data
PERPLEXITY_TEXT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp, and the ships "
                   "that passed the rocky coast at night were guided safely into the harbour.")
METRICS = {"accuracy": "test accuracy (360 held-out digits)", "retrieval": "paraphrase retrieval top-1",
           "perplexity": "perplexity of a text (lower is better)"}


def is_user_side(name: str) -> bool:
    """The embedding layer: what the key holder's client runs before the locked backbone."""
    return ".embeddings." in f".{name}" or "embed_tokens" in name


def metric_for(model) -> str:
    from perm_core.families import family_of

    g = family_of(model).geometry(model.config)
    if g.input_kind == "image":
        if getattr(model.config, "num_labels", 0) != 10 or getattr(model.config, "image_size", 0) != 8:
            raise ValueError("authorization on images needs a digits classifier (digits-vit, digits-vit-b)")
        return "accuracy"
    if g.input_kind == "causal-text":
        return "perplexity"
    return "retrieval"


class Lock:
    """A model locked with a key; `params_for(key)` is what a client holding `key` (or None) runs."""

    def __init__(self, model, key: int):
        self.key = keys.parse_long_key(key)
        self.subject = Subject(model, {})
        full = self._scrambled(self.key)
        self.published = {n: (p if is_user_side(n) else full[n]) for n, p in self.subject.params.items()}

    def _scrambled(self, key: int) -> dict[str, torch.Tensor]:
        return self.subject.transformed_params(symmetries.channels(key, self.subject.geometry))

    def params_for(self, key: int | None) -> dict[str, torch.Tensor]:
        if key is None:
            return self.published
        return self.client_params(symmetries.channels(keys.parse_long_key(key), self.subject.geometry))

    def client_params(self, element: Scramble, published: dict | None = None) -> dict[str, torch.Tensor]:
        """What a client runs that moves the embedding layer's channels by `element` in front of `published`
        (this lock's backbone unless given): the key holder's element, or one an attacker recovered."""
        client = {n: apply_axes(p, self.subject.claims[n].rule.axes, element, self.subject.claims[n].layer)
                  for n, p in self.subject.params.items() if is_user_side(n)}
        return {**(self.published if published is None else published), **client}

    def key_permutation(self) -> torch.Tensor:
        """The residual-channel permutation the key draws: new channel i holds the original's channel index[i]."""
        return symmetries.channels(self.key, self.subject.geometry).spaces[("resid", None)][0].index

    def key_space_bits(self) -> float:
        return symmetries.key_space_bits("channels", self.subject.geometry)


def _forward(lock: Lock, params: dict, inputs: dict):
    kwargs = model_inputs(inputs, lock.subject.geometry, Scramble(), lock.subject.dtype)
    with torch.no_grad():
        return functional_call(lock.subject.model, params, args=(), kwargs={**kwargs, "output_hidden_states": True},
                               strict=False)


def digits_accuracy(lock: Lock, params: dict) -> float:
    from perm_core.models.digits import digits_split

    _, _, test_x, test_y = digits_split()
    logits = _forward(lock, params, {"pixel_values": test_x.to(lock.subject.dtype)}).logits
    return (logits.argmax(-1) == test_y).float().mean().item()


def paraphrase_pairs() -> list[tuple[str, str]]:
    return [tuple(pair) for pair in shipped_json(*PARAPHRASES)["pairs"]]


def retrieval_top1(lock: Lock, params: dict, tokenizer, pairs) -> float:
    """Share of first sentences whose nearest second sentence (cosine) is their own paraphrase."""
    embeddings = []
    for side in (0, 1):
        batch = dict(tokenizer([p[side] for p in pairs], padding=True, return_tensors="pt"))
        out = _forward(lock, params, batch)
        embeddings.append(F.normalize(mean_pool(out.hidden_states[-1], batch["attention_mask"]), dim=-1))
    nearest = (embeddings[0] @ embeddings[1].T).argmax(-1)
    return (nearest == torch.arange(len(pairs))).float().mean().item()


def perplexity(lock: Lock, params: dict, tokenizer, text: str = PERPLEXITY_TEXT) -> float:
    batch = dict(tokenizer(text, return_tensors="pt"))
    logits = _forward(lock, params, batch).logits
    loss = F.cross_entropy(logits[0, :-1].float(), batch["input_ids"][0, 1:])
    return math.exp(min(loss.item(), 700.0))


def wrong_keys(key: int, count: int) -> list[int]:
    """`count` reproducible keys that all differ from `key`."""
    found, candidate = [], key
    while len(found) < count:
        candidate = (candidate * 6364136223846793005 + 1442695040888963407) % (keys.MAX_KEY + 1)
        if candidate != key and candidate not in found:
            found.append(candidate)
    return found


def measurer(lock: Lock, loaded, metric: str) -> tuple[Callable[[dict], float], float]:
    """(the metric of a parameter set for `lock`'s model, its chance level)."""
    if metric == "accuracy":
        return (lambda params: digits_accuracy(lock, params)), 1 / 10
    if metric == "retrieval":
        pairs = paraphrase_pairs()
        return (lambda params: retrieval_top1(lock, params, loaded.tokenizer, pairs)), 1 / len(pairs)
    # perplexity: chance is a uniform guess over the vocabulary
    return (lambda params: perplexity(lock, params, loaded.tokenizer)), float(loaded.model.config.vocab_size)


@dataclass
class AuthorizationResult:
    model: str
    metric: str
    right_key: float
    no_key: float
    wrong_keys: list[float]
    chance: float
    key: int
    wrong_key_values: list[int]
    key_space_bits: float
    original: float  # the unlocked model's own figure

    def to_json(self) -> dict:
        """The CLI's contract: exactly these six fields."""
        data = asdict(self)
        return {k: data[k] for k in ("model", "metric", "right_key", "no_key", "wrong_keys", "chance")}


def authorize(loaded, key: int, n_wrong: int = 20, model_name: str | None = None,
              progress=None) -> AuthorizationResult:
    """Lock `loaded.model` with `key` and measure the right key, no key and `n_wrong` wrong keys."""
    key = keys.parse_long_key(key)
    metric = metric_for(loaded.model)
    lock = Lock(loaded.model, key)
    measure, chance = measurer(lock, loaded, metric)
    candidates = wrong_keys(key, n_wrong)
    total = n_wrong + 3
    figures = []
    for i, params in enumerate([lock.subject.params, lock.params_for(key), lock.params_for(None)]):
        figures.append(measure(params))
        if progress:
            progress((i + 1) / total, ("original", "right key", "no key")[i])
    wrong = []
    for i, other in enumerate(candidates):
        wrong.append(measure(lock.params_for(other)))
        if progress:
            progress((i + 4) / total, f"wrong key {i + 1}/{n_wrong}")
    return AuthorizationResult(model_name or loaded.info.name, metric, figures[1], figures[2], wrong, chance, key,
                               candidates, lock.key_space_bits(), figures[0])
