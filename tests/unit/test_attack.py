"""The attacker of model authorization: the key comes back exactly from the base and locked checkpoints, a wrong
recovery is caught by the attacker's own check, and the defender's fine-tuning sweep is measured."""


import pytest
import torch

from perm_core.__main__ import main
from perm_core.applications import attack as atk
from perm_core.applications.authorization import Lock, digits_accuracy
from perm_core.models.registry import load_model
from tests.unit.json_schema import each_required_field_is_named, validated

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = 0xC0FFEE


@pytest.fixture(scope="module")
def digits():
    return load_model("digits-vit")


@pytest.fixture(scope="module")
def lock(digits):
    return Lock(digits.model, KEY)


def test_the_key_comes_back_exactly_from_an_untouched_lock(lock):
    recovery = atk.recover_key(lock, lock.subject.params, lock.published)
    assert torch.equal(recovery.permutation, lock.key_permutation())
    found = recovery.recovered
    # every other permutation of the recovered element is the identity, as the key's element has none
    for index in [*found.q_heads.values(), *found.groups.values(), *found.mlp.values()]:
        assert torch.equal(index, torch.arange(len(index)))
    assert all(m.permutation is not None and torch.equal(m.permutation, torch.arange(len(m.permutation)))
               for m in found.in_head.values())
    assert atk.matches_key(recovery, lock.key_permutation())
    assert recovery.weights_residual == 0.0 and recovery.verified


def test_a_planted_wrong_recovery_is_caught(lock):
    planted = lock.key_permutation().clone()
    planted[[3, 40]] = planted[[40, 3]]  # two channels swapped: off in 2 of 64 places
    residual = atk.weights_residual(lock, lock.subject.params, lock.published, atk.residual_element(planted))
    assert residual > 1e-2  # the attacker's own check, without the key, sees it
    wrong = atk.Recovery(planted, atk.recover_key(lock, lock.subject.params, lock.published).recovered, residual, 0.0)
    assert not wrong.verified and not atk.matches_key(wrong, lock.key_permutation())
    assert atk.share_recovered(planted, lock.key_permutation()) == pytest.approx(62 / 64)
    # and the model it unlocks is not the key holder's
    assert not torch.equal(lock.client_params(atk.residual_element(planted))["vit.embeddings.cls_token"],
                           lock.params_for(KEY)["vit.embeddings.cls_token"])


def test_the_attack_unlocks_to_the_right_key_accuracy_and_sweeps_fine_tuning(digits, lock):
    result = atk.attack(digits, KEY, "digits-vit", steps=(0, 4))
    right = digits_accuracy(lock, lock.params_for(KEY))
    assert result.recovered_exactly and result.verified and result.share_recovered == 1.0
    assert result.unlocked == result.right_key == right > 0.95
    assert result.no_key < 0.3 and result.channels == 64
    sweep = result.fine_tune
    assert sweep.steps == [0, 4] and sweep.learning_rate == 1e-3
    assert sweep.share_recovered[0] == 1.0 and sweep.owner[0] == sweep.attacker[0] == right
    assert sweep.verified[0] and not sweep.verified[1]  # fine-tuned weights are no gather of the base any more
    assert all(0 <= s <= 1 for s in sweep.share_recovered) and len(sweep.owner) == 2


def test_fine_tuning_moves_only_the_backbone(lock):
    (_, first, _), (_, published, owner) = atk.fine_tuned_checkpoints(lock, (0, 2), 1e-3)
    embed = "vit.embeddings.patch_embeddings.projection.weight"
    assert torch.equal(published[embed], lock.published[embed])  # the public embedding layer
    assert torch.equal(owner[embed], lock.params_for(KEY)[embed])  # the key holder's client
    block = "vit.layers.0.mlp.fc1.weight"
    assert not torch.equal(published[block], lock.published[block]) and torch.equal(published[block], owner[block])


def test_cli_attack_json(capsys):
    assert main(["authorize", "digits-vit", "--key", "5", "--wrong", "2", "--attack", "--steps", "0,3",
                 "--json"]) == 0
    data = validated("authorize", capsys.readouterr().out)
    each_required_field_is_named("authorize", data)
    assert list(data)[:7] == ["schema_version", "model", "metric", "right_key", "no_key", "wrong_keys", "chance"]
    attack = data["attack"]
    assert attack["recovered_exactly"] and attack["verified"] and attack["unlocked"] == data["right_key"]
    assert attack["fine_tune"]["steps"] == [0, 3] and attack["fine_tune"]["share_recovered"][0] == 1.0


def test_cli_attack_text_without_the_sweep(capsys):
    assert main(["authorize", "digits-vit", "--key", "5", "--wrong", "1", "--attack", "--steps", "none"]) == 0
    out = capsys.readouterr().out
    assert "key recovered exactly   yes (100.0% of the 64 channel positions)" in out
    assert "fine-tunes" not in out


@pytest.mark.parametrize("argv,message", [
    (["authorize", "digits-vit", "--attack", "--steps", "a,b"], "--steps"),
    (["authorize", "digits-vit", "--attack", "--steps", "-1"], "--steps"),
    (["authorize", "digits-vit", "--attack", "--lr", "0"], "--lr"),
])
def test_cli_bad_attack_input_exits_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
