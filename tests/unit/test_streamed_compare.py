"""A check compares its un-scrambled tensors as they are built, holding at most a small batch of them (each
large one built, compared and dropped alone), and keeps no transformed parameter set through the comparison: a
float64 smollm2-135m check held 1 GB of un-scrambled gradients and 1 GB of transformed weights beside the
original's gradients. The verdicts are the same."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Mapping

import torch

from perm_core.engine.spec import transform_params
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify import check, tolerances
from perm_core.verify.subject import Subject, TransformedOnDemand


def world(family="llama", keys=None):
    model, _ = build_random_model(family, seed=3)
    subject = Subject(model, random_inputs(family, model, seed=3))
    original = subject.trace(backward=True)
    scramble = subject.build(keys or {"channels": 2, "mlp": 5})
    return subject, original, scramble, subject.trace(scramble, backward=True)


class Watched(Mapping):
    """A lazy mapping that records how often each tensor is built and how many built tensors are alive."""

    def __init__(self, inner: Mapping, held=()):
        self.inner, self.built, self.alive_at_build, self._alive = inner, {}, [], []
        self.alive_bytes_at_build = []
        self._held = {id(t) for t in held}  # tensors someone else keeps anyway (a record nothing moved)

    def __getitem__(self, name):
        gc.collect()
        self._alive = [ref for ref in self._alive if ref() is not None]
        self.alive_at_build.append(len(self._alive))
        self.alive_bytes_at_build.append(sum(ref().numel() * ref().element_size() for ref in self._alive))
        tensor = self.inner[name]
        if id(tensor) not in self._held:
            self._alive.append(weakref.ref(tensor))
        self.built[name] = self.built.get(name, 0) + 1
        return tensor

    def __contains__(self, name):
        return name in self.inner

    def __iter__(self):
        return iter(self.inner)

    def __len__(self):
        return len(self.inner)


def watched_errors():
    subject, original, scramble, scrambled = world()
    watched = Watched(subject.unscramble_lazily(scrambled, scramble), [r.tensor for r in scrambled.values()])
    errors = subject.errors(original, watched, scramble)
    assert len(errors) == len(original) > 20 and all(e.passed for e in errors)
    assert set(watched.built) == set(original) and set(watched.built.values()) == {1}
    watched.largest = max(r.tensor.numel() * r.tensor.element_size() for r in original.values())
    return watched


def test_large_restored_tensors_are_built_once_and_dropped_before_the_next(monkeypatch):
    monkeypatch.setattr(tolerances, "BATCH_ELEMENTS", 0)  # every tensor counts as large here
    assert max(watched_errors().alive_at_build) == 0  # the one compared before is gone when the next is built


def test_small_restored_tensors_are_held_a_bounded_batch_at_a_time(monkeypatch):
    monkeypatch.setattr(tolerances, "BATCH_BYTES", 4096)
    watched = watched_errors()
    assert 0 < max(watched.alive_bytes_at_build) < 4096 + watched.largest
    assert max(watched.alive_at_build) < len(watched.built) // 2  # batches, not the whole set


def test_lazy_and_whole_comparisons_give_the_same_errors():
    for family, keys in (("llama", {"channels": 2, "mlp": 5}), ("bert", {"heads": 4, "tokens": 1}),
                         ("vit", {"rotation": 6, "head_channels": 2})):
        subject, original, scramble, scrambled = world(family, keys)
        lazy = subject.errors(original, subject.unscramble_lazily(scrambled, scramble), scramble)
        whole = subject.errors(original, subject.unscramble(scrambled, scramble), scramble)
        assert [(e.name, e.max_abs_error, e.tolerance) for e in lazy] == \
               [(e.name, e.max_abs_error, e.tolerance) for e in whole], family


def test_a_broken_restore_still_fails_when_compared_lazily():
    subject, original, scramble, scrambled = world()
    wrong = subject.unscramble_lazily(scrambled, subject.build({"channels": 3, "mlp": 5}))  # another key's inverse
    errors = subject.errors(original, wrong, scramble)
    assert not all(e.passed for e in errors)
    assert max(e.max_rel_error for e in errors if e.name.endswith(".hidden")) > 0.1


def test_parameters_built_on_demand_equal_the_whole_set_and_stop_at_the_first_moved():
    subject, _, scramble, _ = world()
    whole = transform_params(subject.params, subject.spec, scramble, subject.claims)
    on_demand = TransformedOnDemand(subject, scramble)
    assert list(on_demand) == list(whole)
    for name, tensor in whole.items():
        built = on_demand[name]
        assert torch.equal(built, tensor) and ((built is subject.params[name]) == (tensor is subject.params[name]))
    watched = Watched(on_demand)
    moved = subject.weight_movement(watched)
    assert moved == subject.weight_movement(whole) and max(moved.values()) >= tolerances.MOVED_AT
    assert len(watched.built) < len(whole) / 4  # smallest first, up to the first weight that moved


def test_check_scramble_keeps_no_transformed_set(monkeypatch):
    """While the check compares, the transformed parameters of its run are already freed."""
    subject, original, scramble, _ = world()
    built = []
    real = Subject.transformed_params

    def tracked(self, s):
        params = real(self, s)
        built.extend(weakref.ref(p) for n, p in params.items() if p is not self.params[n])
        return params

    alive_while_comparing = []
    real_errors = Subject.errors

    def errors(self, *args, **kwargs):
        gc.collect()
        alive_while_comparing.append(sum(ref() is not None for ref in built))
        return real_errors(self, *args, **kwargs)

    monkeypatch.setattr(Subject, "transformed_params", tracked)
    monkeypatch.setattr(Subject, "errors", errors)
    results = check.check_scramble(subject, scramble, "channels+mlp", original)
    assert built and alive_while_comparing == [0]
    assert [r.direction for r in results] == ["forward", "backward"] and all(r.passed for r in results)
