"""The attacker of model authorization: the public base checkpoint and the locked one give the key back.

The lock (authorization.Lock) publishes the embedding layer unchanged and the backbone moved by the key's
residual-channel permutation P. Whoever also holds the base checkpoint the model was locked from (the usual case:
the owner fine-tunes and locks a public model) runs the project's own recovery (perm_core.verify.recover, what
`compare` runs) on the two backbones, reads P off the recovered element, and runs the locked backbone behind the
embedding layer moved by it: the key holder's client, without the key.

The attacker checks the recovery without the key: the base backbone moved by the recovered element must be the
locked backbone (`weights_residual`, exactly 0 for an untouched lock, since a lock is a gather). A recovery that
is wrong anywhere leaves a residual, so a wrong recovery is caught (`verified` False).

The defender's move: fine-tune the locked model for k steps after locking (the owner holds the key; the embedding
layer stays the public one) and publish that. The sweep reports, for each k, the share of P's entries recovered,
the attacker's unlocked metric and the owner's own metric (what the fine-tuning cost).

The literature says the same of permutation-based protection: "Hidden No More" (ICML 2025) reconstructs inputs
from permuted hidden states; "On the (In-)Security of the Shuffling Defense" (ACL 2026) aligns shuffled
activations and recovers weights of Pythia-70m and GPT-2.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from perm_core.applications.authorization import Lock, is_user_side, measurer, metric_for
from perm_core.engine.spec import Scramble, transform_params
from perm_core.engine.transforms import Permutation
from perm_core.run.stateless import functional_call
from perm_core.run.threads import one_thread
from perm_core.verify.recover import Recovered, recover
from perm_core.verify.tolerances import TOLERANCE

FINE_TUNE_STEPS = (0, 10, 30, 100, 300, 1000)
FINE_TUNE_RATES = (1e-3, 1e-2)  # the digits models' own training rate, and ten times it
FINE_TUNE_BATCH = 64
Progress = Callable[[float, str], None] | None


@dataclass
class Recovery:
    """What the attacker got from (base, locked): P and the check they can run without the key."""

    permutation: torch.Tensor  # the recovered residual-channel permutation (new channel i holds base's index[i])
    recovered: Recovered
    weights_residual: float  # worst over backbone tensors of max |base moved by it - locked| / max |locked|
    seconds: float

    @property
    def verified(self) -> bool:
        return self.weights_residual <= TOLERANCE[torch.float64]


def backbone(params: dict) -> dict:
    """The parameters the lock moves: everything after the embedding layer."""
    return {n: p for n, p in params.items() if not is_user_side(n)}


def residual_element(permutation: torch.Tensor) -> Scramble:
    return Scramble({("resid", None): (Permutation(permutation),)})


def weights_residual(lock: Lock, base: dict, locked: dict, element: Scramble) -> float:
    """How far the base backbone moved by `element` is from the locked backbone, each tensor on its own scale."""
    moved = transform_params(backbone(base), lock.subject.spec, element, lock.subject.claims)
    worst = 0.0
    for name, tensor in moved.items():
        scale = locked[name].abs().max().item() or 1.0
        worst = max(worst, (tensor.double() - locked[name].double()).abs().max().item() / scale)
    return worst


def recover_key(lock: Lock, base: dict, locked: dict) -> Recovery:
    """Recover P from the base and locked backbones with perm_core.verify.recover, and check it."""
    started = time.perf_counter()
    s = lock.subject
    found = recover(backbone(base), backbone(locked), s.spec, s.claims, s.geometry)
    residual = weights_residual(lock, base, locked, found.element)
    return Recovery(found.resid, found, residual, time.perf_counter() - started)


def matches_key(recovery: Recovery, key_permutation: torch.Tensor) -> bool:
    """Every permutation of the recovered element equal to the key's: P itself, and nothing else moved."""
    moved = recovery.recovered.summary()
    others = (moved["heads"]["moved"], moved["heads"]["groups_moved"], moved["head_channels"]["moved"],
              moved["mlp"]["moved"], moved["rotation"]["rotated"])
    return torch.equal(recovery.permutation, key_permutation) and not any(others)


def share_recovered(permutation: torch.Tensor, key_permutation: torch.Tensor) -> float:
    return (permutation == key_permutation).double().mean().item()


@dataclass
class FineTuneSweep:
    """The defender fine-tunes the locked model (with the key) for k steps, then publishes; per k:"""

    learning_rate: float
    batch_size: int
    steps: list[int] = field(default_factory=list)
    share_recovered: list[float] = field(default_factory=list)  # of P's entries, by the attacker
    attacker: list[float] = field(default_factory=list)  # the attacker's unlocked metric
    owner: list[float] = field(default_factory=list)  # the key holder's metric of the fine-tuned model
    weights_residual: list[float] = field(default_factory=list)  # the attacker's own check
    verified: list[bool] = field(default_factory=list)


@dataclass
class AttackResult:
    model: str
    metric: str
    channels: int  # d_model: the entries of P
    recovered_exactly: bool  # every permutation of the recovered element equal to the key's
    share_recovered: float
    weights_residual: float
    verified: bool  # the attacker's check, without the key: base moved by the recovery is the locked model
    unlocked: float  # the attacker's metric with the recovered permutation
    right_key: float
    no_key: float
    seconds: float  # recovering and checking (the attacker's whole work before running the model)
    fine_tune: FineTuneSweep | None

    def to_json(self) -> dict:
        return asdict(self)


def fine_tuned_checkpoints(lock: Lock, steps, learning_rate: float, progress: Progress = None):
    """Yield (k, the locked backbone after k steps, the key holder's parameters) for each k in `steps`.
    The key holder trains the backbone on the digits training split; the embedding layer stays the public one."""
    from perm_core.models.digits import digits_split

    train_x, train_y, _, _ = digits_split()
    dtype = lock.subject.dtype
    params = {n: p.detach().clone().requires_grad_(not is_user_side(n)) for n, p in lock.params_for(lock.key).items()}
    optimizer = torch.optim.AdamW([p for p in params.values() if p.requires_grad], lr=learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    done, last = 0, max(steps)
    for k in sorted(steps):
        while done < k:
            batch = torch.randint(0, len(train_y), (FINE_TUNE_BATCH,), generator=generator)
            logits = functional_call(lock.subject.model, params, args=(),
                                     kwargs={"pixel_values": train_x[batch].to(dtype)}).logits
            loss = F.cross_entropy(logits.float(), train_y[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
            if progress and done % 10 == 0:
                progress(done / max(last, 1), f"the owner fine-tunes: step {done}/{last}")
        owner = {n: p.detach() for n, p in params.items()}
        yield k, {**lock.published, **backbone(owner)}, owner


def attack(loaded, key: int, model_name: str | None = None, learning_rate: float = FINE_TUNE_RATES[0],
           steps=FINE_TUNE_STEPS, progress: Progress = None) -> AttackResult:
    """Lock `loaded.model` with `key`, recover the key from (base, locked), unlock; on digits also the sweep."""
    with one_thread():  # tiny models on a shared 2-core machine
        return _attack(loaded, key, model_name, learning_rate, steps, progress)


def _attack(loaded, key, model_name, learning_rate, steps, progress) -> AttackResult:
    metric = metric_for(loaded.model)
    lock = Lock(loaded.model, key)
    measure, _ = measurer(lock, loaded, metric)
    base, key_permutation = lock.subject.params, lock.key_permutation()
    recovery = recover_key(lock, base, lock.published)
    unlocked = measure(lock.client_params(residual_element(recovery.permutation)))
    right_key, no_key = measure(lock.params_for(lock.key)), measure(lock.params_for(None))
    sweep = None
    if metric == "accuracy" and steps:
        sweep = FineTuneSweep(learning_rate, FINE_TUNE_BATCH)
        for k, published, owner in fine_tuned_checkpoints(lock, steps, learning_rate, progress):
            found = recover_key(lock, base, published)
            sweep.steps.append(k)
            sweep.share_recovered.append(share_recovered(found.permutation, key_permutation))
            sweep.attacker.append(measure(lock.client_params(residual_element(found.permutation), published)))
            sweep.owner.append(measure(owner))
            sweep.weights_residual.append(found.weights_residual)
            sweep.verified.append(found.verified)
    if progress:
        progress(1.0, "done")
    return AttackResult(model_name or loaded.info.name, metric, len(key_permutation),
                        matches_key(recovery, key_permutation), share_recovered(recovery.permutation, key_permutation),
                        recovery.weights_residual, recovery.verified, unlocked, right_key, no_key, recovery.seconds,
                        sweep)
