"""Model authorization: the right key restores the model exactly; no key and wrong keys fall to chance."""


import pytest
import torch

from perm_core.__main__ import main
from perm_core.applications import authorization as auth
from perm_core.models.digits import evaluate_digits
from perm_core.models.registry import load_model
from perm_core.verify.subject import Subject
from tests.unit.json_schema import each_required_field_is_named, validated

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits():
    return load_model("digits-vit")


def test_digits_right_key_exact_no_key_and_wrong_keys_near_chance(digits):
    result = auth.authorize(digits, 12345, n_wrong=20)
    accuracy, _ = evaluate_digits(digits.model)
    assert accuracy > 0.95
    assert abs(result.right_key - accuracy) < 1e-6
    assert abs(result.original - accuracy) < 1e-6
    assert result.no_key < 0.3
    assert len(result.wrong_keys) == 20 and max(result.wrong_keys) < 0.3
    assert result.chance == pytest.approx(0.1)
    assert result.key_space_bits == pytest.approx(295.995, abs=1e-2)  # log2(64!)
    assert len(set(result.wrong_key_values)) == 20 and 12345 not in result.wrong_key_values


def test_locking_leaves_the_embedding_and_permutes_everything_after_it(digits):
    lock = auth.Lock(digits.model, 9)
    params = lock.subject.params
    embed = "vit.embeddings.patch_embeddings.projection.weight"
    assert torch.equal(lock.published[embed], params[embed])
    block = "vit.layers.0.attention.q_proj.weight"
    assert not torch.equal(lock.published[block], params[block])
    # The key holder's features are the plain embedding features with their channels gathered by P.
    from perm_core.engine.symmetries import channels

    perm = channels(9, lock.subject.geometry).spaces[("resid", None)][0].index
    x = torch.randn(2, 1, 8, 8)
    subject = Subject(digits.model, {"pixel_values": x})
    plain = subject.trace()["embed"].tensor
    keyed = subject.trace(params=lock.params_for(9))["embed"].tensor
    assert torch.equal(keyed, plain[..., perm])
    assert not torch.equal(subject.trace(params=lock.params_for(None))["embed"].tensor, keyed)


def test_minilm_retrieval_with_and_without_key():
    loaded = load_model("minilm")
    result = auth.authorize(loaded, 3, n_wrong=2)
    lock = auth.Lock(loaded.model, 3)
    pairs = auth.paraphrase_pairs()
    assert len(pairs) >= 20
    original = auth.retrieval_top1(lock, lock.subject.params, loaded.tokenizer, pairs)
    assert original >= 0.9
    assert result.right_key == pytest.approx(original, abs=1e-9)
    assert result.no_key < original - 0.3
    assert max(result.wrong_keys) < original - 0.2
    assert result.chance == pytest.approx(1 / len(pairs))


def test_non_digits_image_model_is_refused():
    with pytest.raises(ValueError, match="digits classifier"):
        auth.metric_for(load_model("random:vit").model)


def test_cli_json_shape(capsys):
    assert main(["authorize", "digits-vit", "--key", "5", "--wrong", "3", "--json"]) == 0
    data = validated("authorize", capsys.readouterr().out)
    each_required_field_is_named("authorize", data)
    assert list(data) == ["schema_version", "model", "metric", "right_key", "no_key", "wrong_keys", "chance"]
    assert data["model"] == "digits-vit" and data["metric"] == "accuracy"
    assert data["right_key"] > 0.95 and data["no_key"] < 0.3 and len(data["wrong_keys"]) == 3
    assert data["chance"] == pytest.approx(0.1)


@pytest.mark.parametrize("argv,message", [
    (["authorize", "digits-vit", "--key", "-1"], "at most 256 bits"),
    (["authorize", "digits-vit", "--key", "0x1" + "0" * 64], "at most 256 bits"),
    (["authorize", "digits-vit", "--key", "abc"], "whole number"),
    (["authorize", "random:vit", "--key", "1"], "authorize supports"),
    (["authorize", "no-such-model", "--key", "1"], "authorize supports"),
    (["authorize", "digits-vit", "--wrong", "0"], "--wrong"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.slow
def test_smollm2_perplexity_with_and_without_key():
    loaded = load_model("smollm2-135m")
    result = auth.authorize(loaded, 1, n_wrong=2)
    assert result.right_key == pytest.approx(result.original, rel=1e-4)
    assert result.right_key < 100 < result.no_key
    assert min(result.wrong_keys) > 10 * result.right_key


def test_a_256_bit_hex_key_locks_and_unlocks():
    key = 0xC0FFEE << 232 | 0xBADF00D
    result = auth.authorize(load_model("digits-vit"), f"{key:#x}", n_wrong=3)
    assert result.key == key and result.right_key == pytest.approx(result.original, abs=1e-6)
    assert max(result.wrong_keys) < result.original - 0.2  # accuracy collapses without the key
    assert result.no_key < result.original - 0.2
    lock, low_half = auth.Lock(load_model("digits-vit").model, key), key & (2**64 - 1)
    changed = [n for n, p in lock.params_for(low_half).items() if not torch.equal(p, lock.params_for(key)[n])]
    assert changed  # the key's high bits matter: its low 64 bits alone draw another permutation
