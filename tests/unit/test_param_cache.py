"""The per-tensor parameter cache: same tensors as a full rebuild, one key change rebuilds only what it
reaches, bounded by bytes."""

from __future__ import annotations

import pytest
import torch

from perm_core.explore.exploration import Exploration
from perm_core.fast import param_cache
from perm_core.models.random_models import build_random_model, random_inputs

pytestmark = pytest.mark.usefixtures("one_thread")
ALL = {"tokens": 3, "channels": 4, "heads": 5, "head_channels": 6, "mlp": 7, "rotation": 8}


@pytest.fixture
def explorer():
    param_cache.TENSORS.clear()
    model, _ = build_random_model("vit", dtype=torch.float64, seed=2)
    return Exploration(model, random_inputs("vit", model, seed=2))


def test_cached_tensors_equal_a_full_rebuild(explorer):
    for keys in (ALL, {**ALL, "mlp": 9}, {"channels": 1}, {**ALL, "tokens": 11}):
        scramble, _ = explorer.scramble_for(keys)
        cached, _ = explorer.params_for(scramble, keys, None)
        full = explorer.subject.transformed_params(scramble)
        assert cached.keys() == full.keys()
        assert all(torch.equal(cached[n], full[n]) for n in full)


def test_one_key_change_rebuilds_only_the_tensors_it_reaches(explorer):
    explorer.run(ALL)
    claims = explorer.subject.claims
    reached = {"mlp": [n for n in claims if "mlp" in param_cache.roles_of(claims[n].rule.axes)],
               "tokens": [n for n in claims if "positions" in param_cache.roles_of(claims[n].rule.axes)]}
    assert len(reached["mlp"]) == 6 and reached["tokens"] == ["vit.embeddings.position_embeddings"]
    for symmetry, names in reached.items():
        before = param_cache.TENSORS.misses
        result = explorer.run({**ALL, symmetry: 99})
        assert param_cache.TENSORS.misses - before == len(names), symmetry
        assert result.passed
    before = param_cache.TENSORS.misses
    explorer.run({**ALL, "channels": 99})  # the residual stream reaches nearly every tensor
    assert param_cache.TENSORS.misses - before > len(explorer.subject.params) // 2


def test_a_control_of_a_switched_off_symmetry_still_acts(explorer):
    result = explorer.run({"tokens": 3}, control="mlp/output_not_permuted")
    assert result.worst_rel > 1e-3 and not result.passed


def test_the_cache_is_bounded_by_bytes():
    cache = param_cache.TensorCache(max_bytes=1000)
    for i in range(10):
        cache.put(i, torch.zeros(50, dtype=torch.float32))  # 200 bytes each
    assert cache.bytes <= 1000 and cache.get(9) is not None and cache.get(0) is None
    cache.put("huge", torch.zeros(1000))  # larger than the bound: computed, never kept
    assert cache.get("huge") is None and cache.bytes <= 1000


def test_tensor_bytes_counts_each_storage_once_and_not_the_models_parameters():
    model = torch.nn.Linear(10, 10)
    shared = torch.zeros(100)
    held = {"a": shared, "b": [shared, shared[:10]], "c": torch.ones(5, dtype=torch.float64),
            "params": dict(model.named_parameters())}
    assert param_cache.tensor_bytes(held) == 100 * 4 + 5 * 8


def test_tensor_bytes_counts_numpy_arrays_and_their_views_once():
    import numpy as np

    image = np.zeros((10, 10), dtype=np.float32)
    assert param_cache.tensor_bytes({"image": image, "crop": image[:5], "curve": [np.ones(3)]}) == 400 + 24


def test_a_cache_of_results_is_bounded_by_the_bytes_they_hold():
    cache = param_cache.TensorCache(max_bytes=1000)
    for i in range(10):
        cache.put(i, {"trace": torch.zeros(50), "note": "x"})  # 200 bytes each
    assert len(cache) == 5 and cache.bytes == 1000
    assert cache.get(0) is None and cache.get(9) is not None  # the least recently used went first
    calls = []
    assert cache.get_or_compute(9, lambda: calls.append(1)) is not None and not calls


def test_asking_whether_a_key_is_kept_is_not_a_use():
    cache = param_cache.TensorCache(max_bytes=400)  # two tensors of 200 bytes
    cache.put("a", torch.zeros(50))
    cache.put("b", torch.zeros(50))
    assert "a" in cache and "missing" not in cache and cache.hits == 0
    cache.put("c", torch.zeros(50))  # "a" is still the least recently used: asking did not move it
    assert "a" not in cache and "b" in cache and "c" in cache
    cache.get("b")  # the control: a use moves "b" up, so "c" goes next
    cache.put("d", torch.zeros(50))
    assert "b" in cache and "c" not in cache and cache.hits == 1


def test_make_room_evicts_the_oldest_until_the_incoming_bytes_fit():
    cache = param_cache.TensorCache(max_bytes=1000)
    for i in range(5):
        cache.put(i, torch.zeros(50))  # 200 bytes each: full
    cache.make_room(300)
    assert cache.bytes == 600 and cache.get(0) is None and cache.get(1) is None and cache.get(2) is not None
    cache.make_room(5000)  # never fits: everything goes
    assert cache.bytes == 0 and len(cache) == 0


def test_a_set_about_to_be_built_first_makes_room_in_a_full_cache(explorer):
    subject = explorer.subject
    model_bytes = sum(t.numel() * t.element_size() for t in subject.params.values())
    cache = param_cache.TensorCache(max_bytes=2 * model_bytes)
    for i in range(12):
        cache.put(("another model", i), torch.zeros(model_bytes // 32))  # float32: an eighth of the model each
    assert cache.bytes > 1.4 * model_bytes
    built_on = []
    original_make_room = cache.make_room
    cache.make_room = lambda incoming: (original_make_room(incoming), built_on.append(cache.bytes + incoming))
    scramble, _ = explorer.scramble_for(ALL)
    params = param_cache.transformed_params(subject, scramble, ALL, ("this model",), cache)
    assert built_on and built_on[0] <= cache.max_bytes  # what was kept plus what was built fit the bound
    assert cache.bytes <= cache.max_bytes
    assert all(torch.equal(params[n], t) for n, t in subject.transformed_params(scramble).items())


def test_one_weight_asked_for_is_the_only_one_built_and_equals_the_full_set(explorer):
    """The Explore page's weight panel shows one matrix: it must not rebuild the model's whole set."""
    from perm_core.explore.exploration import weight_names, weight_view

    scramble, _ = explorer.scramble_for(ALL)
    full = explorer.subject.transformed_params(scramble)
    name = weight_names(explorer, 1)[0]
    param_cache.TENSORS.clear()
    one, _ = explorer.params_for(scramble, ALL, None, names={name})
    assert list(one) == [name] and torch.equal(one[name], full[name])
    assert not torch.equal(one[name], explorer.subject.params[name])
    assert param_cache.TENSORS.bytes <= 3 * one[name].numel() * one[name].element_size()  # it and intermediates
    result = explorer.run(ALL)
    original, scrambled, back = weight_view(explorer, result, ALL, None, name)
    assert torch.equal(scrambled, full[name]) and torch.allclose(back, original, rtol=0, atol=1e-12)


def test_a_kept_result_holds_the_scrambled_trace_once_and_restores_each_tensor_when_asked(explorer):
    """Thirty sessions rendering their results held every un-scrambled copy as well: now a result costs the
    scrambled trace (plus its element), and each un-scrambled tensor is the one the eager inverse gives."""
    result = explorer.run(ALL)
    trace_bytes = param_cache.tensor_bytes(result.scrambled)
    assert trace_bytes <= param_cache.tensor_bytes(result) <= 1.25 * trace_bytes + 2**20
    eager = explorer.subject.unscramble(result.scrambled, result.scramble)
    assert list(result.restored) == list(eager) and len(result.restored) == len(eager) >= 6
    assert all(torch.equal(result.restored[name], eager[name]) for name in eager)
    assert result.passed and not torch.equal(result.restored["embed"], result.scrambled["embed"].tensor)


def test_of_a_set_larger_than_the_bound_the_smaller_tensors_are_kept_and_the_largest_rebuilt(explorer, monkeypatch):
    """gemma3-270m's set (1.07 GiB) is over the 640 MiB bound: keeping nothing rebuilt all of it at every key
    change. Its smaller tensors are kept within the bound, the largest left out; a key change then builds the
    left-out tensors and the ones its key reaches, nothing else."""
    subject = explorer.subject
    scramble, _ = explorer.scramble_for(ALL)
    full = subject.transformed_params(scramble)
    moved = {n: t.numel() * t.element_size() for n, t in full.items() if t is not subject.params[n]}
    largest = max(moved, key=moved.get)
    bound = sum(moved.values()) - moved[largest] // 2
    cache = param_cache.TensorCache(max_bytes=bound)
    params = param_cache.transformed_params(subject, scramble, ALL, ("this model",), cache)
    assert all(torch.equal(params[n], t) for n, t in full.items())
    left_out = set(moved) - {key[1] for key in cache._items}
    assert len(left_out) == 1 and moved[left_out.pop()] == moved[largest] and 0 < cache.bytes <= bound
    built = []
    engine = param_cache.apply_axes
    monkeypatch.setattr(param_cache, "apply_axes",
                        lambda t, axes, s, layer: built.append(axes) or engine(t, axes, s, layer))
    for symmetry, reached_role in (("tokens", "positions"), ("mlp", "mlp")):
        keys = {**ALL, symmetry: 99}
        other, _ = explorer.scramble_for(keys)
        built[:] = []
        params = param_cache.transformed_params(subject, other, keys, ("this model",), cache)
        assert all(torch.equal(params[n], t) for n, t in subject.transformed_params(other).items())
        reached = [n for n in moved if reached_role in param_cache.roles_of(subject.claims[n].rule.axes)]
        assert reached and len(built) <= 1 + len(reached), symmetry  # the left-out tensor, and what the key reaches
        assert cache.bytes <= bound and len(set(moved) - {key[1] for key in cache._items}) == 1
    # Within the bound, the whole set is kept, as before.
    whole = param_cache.TensorCache(max_bytes=4 * sum(moved.values()))
    param_cache.transformed_params(subject, scramble, ALL, ("this model",), whole)
    assert len(whole) == len(moved)


def test_holds_more_than_agrees_with_tensor_bytes_and_stops_walking_once_over():
    import numpy as np

    class Untouchable:
        @property
        def __dict__(self):
            raise AssertionError("walked past the limit")

    big, small = torch.zeros(1000), torch.zeros(10)  # 4000 and 40 bytes
    for value, limit in [({"a": big, "b": [small, small]}, 4039), ({"a": big, "b": [small]}, 4040), ([], 0),
                         ({"view": big[:5], "again": big}, 3999), (np.ones(3), 23)]:
        assert param_cache.holds_more_than(value, limit) == (param_cache.tensor_bytes(value) > limit), value
    assert param_cache.holds_more_than([big, Untouchable()], 3999)  # over after the first: the second is not walked
