"""The attacker (perm_core.applications.attack) held to numbers it was not handed: the key of a checkpoint locked
with another key than the attacker's Lock holds, recovered from the weights alone; matches_key turning down a
recovery that is off in one part only; the attacker's residual and its verified threshold on hand-made cases."""

import pytest
import torch

from perm_core.applications import attack as atk
from perm_core.applications.authorization import Lock
from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble, transform_params
from perm_core.models.registry import load_model
from perm_core.verify.recover import InHead, Recovered

pytestmark = pytest.mark.usefixtures("one_thread")
KEY_GIVEN, KEY_TRUE = 0xC0FFEE, 0xBEEF  # the attacker's Lock is built with KEY_GIVEN; the checkpoint with KEY_TRUE


@pytest.fixture(scope="module")
def digits():
    return load_model("digits-vit")


@pytest.fixture(scope="module")
def given(digits):
    return Lock(digits.model, KEY_GIVEN)


@pytest.fixture(scope="module")
def true(digits):
    return Lock(digits.model, KEY_TRUE)


def test_the_key_of_a_checkpoint_locked_with_another_key_is_recovered_from_the_weights(given, true):
    recovery = atk.recover_key(given, given.subject.params, true.published)
    wrong, right = given.key_permutation(), true.key_permutation()
    assert (wrong == right).sum() < 8  # two keys that disagree nearly everywhere (64 channels)
    assert torch.equal(recovery.permutation, right)
    assert recovery.weights_residual == 0.0 and recovery.verified
    assert atk.matches_key(recovery, right) and not atk.matches_key(recovery, wrong)
    # the attacker's client is the true key holder's, parameter for parameter
    unlocked = given.client_params(atk.residual_element(recovery.permutation), true.published)
    held = true.params_for(KEY_TRUE)
    assert unlocked.keys() == held.keys() and all(torch.equal(unlocked[n], held[n]) for n in held)
    # and the wrong candidate, run as the attacker's check, leaves a visible residual
    assert atk.weights_residual(given, given.subject.params, true.published, atk.residual_element(wrong)) > 0.1


def test_a_lock_that_also_swapped_heads_recovers_the_key_but_does_not_match_it(given):
    """Heads moved on top of the key's channels: the recovery is verified (it is a gather of the base) and its
    channel permutation is the key's, but it is not the key's element: matches_key must say no."""
    g = given.subject.geometry
    heads = symmetries.heads(3, g)
    element = Scramble({**symmetries.channels(KEY_GIVEN, g).spaces, **heads.spaces})
    moved = transform_params(atk.backbone(given.subject.params), given.subject.spec, element, given.subject.claims)
    recovery = atk.recover_key(given, given.subject.params, {**given.published, **moved})
    assert torch.equal(recovery.permutation, given.key_permutation()) and recovery.verified
    for layer in range(g.n_layers):
        assert torch.equal(recovery.recovered.q_heads[layer], heads.spaces[("heads", layer)][0].index)
    assert recovery.recovered.summary()["heads"]["moved"] > 0
    assert not atk.matches_key(recovery, given.key_permutation())


def hand_made(permutation, heads=(0, 1, 2, 3), groups=(0, 1, 2, 3), mlp=(0, 1, 2), in_head=None):
    """A recovery of one layer with 4 heads and 3 MLP neurons, moved where told, identity elsewhere."""
    eye = torch.eye(2, dtype=torch.float64)
    maps = {(0, "qk", 0): InHead(eye, torch.arange(2)) if in_head is None else in_head}
    found = Recovered(Scramble(), permutation, {0: torch.tensor(heads)}, {0: torch.tensor(groups)}, maps,
                      {0: torch.tensor(mlp)})
    return atk.Recovery(permutation, found, 0.0, 0.0)


KEY = torch.tensor([2, 0, 3, 1])


@pytest.mark.parametrize("moved", [
    {"heads": (1, 0, 2, 3)},  # only the query heads' order differs (inside a key/value group)
    {"groups": (1, 0, 2, 3)},
    {"mlp": (0, 2, 1)},
    {"in_head": InHead(torch.eye(2, dtype=torch.float64).flip(0), torch.tensor([1, 0]))},  # a head-channel swap
    {"in_head": InHead(torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=torch.float64), None)},  # a rotation
])
def test_matches_key_turns_down_a_recovery_off_in_one_part_only(moved):
    assert atk.matches_key(hand_made(KEY), KEY)  # the same recovery with nothing else moved matches
    assert not atk.matches_key(hand_made(KEY, **moved), KEY)


def test_matches_key_turns_down_a_channel_permutation_one_swap_away():
    assert not atk.matches_key(hand_made(torch.tensor([0, 2, 3, 1])), KEY)


def test_share_recovered_counts_the_positions_that_agree():
    assert atk.share_recovered(torch.tensor([3, 1, 0, 2]), KEY) == 0.0  # KEY is [2, 0, 3, 1]
    assert atk.share_recovered(torch.tensor([2, 1, 0, 3]), KEY) == 0.25  # position 0
    assert atk.share_recovered(torch.tensor([2, 0, 1, 3]), KEY) == 0.5  # positions 0 and 1
    assert atk.share_recovered(KEY, KEY) == 1.0


def test_the_residual_is_the_worst_tensor_on_its_own_scale(given):
    """The locked fc1 doubled: |x - 2x| peaks at max|x|, over its own scale max|2x|: exactly 1/2. A second tensor
    times 3/2 gives (1/2)/(3/2) = 1/3: the worst, 1/2, is what is reported."""
    doubled, other = "vit.layers.0.mlp.fc1.weight", "vit.layers.1.mlp.fc2.weight"
    locked = {**given.published, doubled: 2 * given.published[doubled]}
    key = atk.residual_element(given.key_permutation())
    assert atk.weights_residual(given, given.subject.params, locked, key) == 0.5
    locked[other] = 1.5 * given.published[other]
    assert atk.weights_residual(given, given.subject.params, locked, key) == 0.5
    locked[doubled] = given.published[doubled]  # fc1 put back: fc2's 1/3 is now the worst
    assert atk.weights_residual(given, given.subject.params, locked, key) == pytest.approx(1 / 3, rel=1e-6)


@pytest.mark.parametrize("residual,verified", [(0.0, True), (1e-9, True), (1.001e-9, False), (1e-3, False)])
def test_a_recovery_is_verified_up_to_the_float64_tolerance_and_no_further(residual, verified):
    assert atk.Recovery(KEY, hand_made(KEY).recovered, residual, 0.0).verified is verified
