"""Split learning: the scrambled split trains like the plain one; the inversion attack is a real one."""


import pytest
import torch

from perm_core.__main__ import main
from perm_core.applications import inversion, split_learning
from perm_core.models.digits import digits_vit_config
from tests.unit.json_schema import each_required_field_is_named, validated


def test_scrambled_split_training_matches_plain():
    # float64 so the lock-step is visible to round-off; 3 epochs keep the test short.
    result = split_learning.train_split(seed=0, key=7, epochs=3, dtype=torch.float64)
    assert result.final_plain_accuracy > 0.3  # it really learned (chance is 0.1)
    assert abs(result.final_scrambled_accuracy - result.final_plain_accuracy) <= 0.02
    assert result.max_weight_difference < 1e-8
    assert result.plain_loss[0] > result.plain_loss[-1]


def test_server_in_permuted_basis_is_the_permuted_server_with_negative_control():
    from transformers import ViTForImageClassification

    torch.manual_seed(3)
    model = ViTForImageClassification(digits_vit_config()).eval()
    with torch.no_grad():
        for p in model.parameters():  # HF's init leaves LayerNorms at 1/0; randomize so a slip shows
            p.add_(0.1 * torch.randn_like(p))
    features = torch.randn(4, 17, 64)
    perm = split_learning.channel_permutation(11)
    wrong = split_learning.channel_permutation(12)
    with torch.no_grad():
        plain = split_learning.server_forward(model, features)
        scrambled = split_learning.server_forward(split_learning.permuted_copy(model, perm), features[..., perm])
        mismatched = split_learning.server_forward(split_learning.permuted_copy(model, wrong), features[..., perm])
    assert (scrambled - plain).abs().max() < 1e-4
    assert (mismatched - plain).abs().max() > 1e-2


def test_token_shuffle_keeps_cls_and_is_a_fresh_permutation_per_sample():
    one = torch.arange(17 * 3, dtype=torch.float32).reshape(1, 17, 3)
    features = torch.cat([one, one])  # two identical samples
    shuffled = split_learning.shuffle_patch_tokens(features, torch.Generator().manual_seed(0))
    assert torch.equal(shuffled[:, 0], features[:, 0])
    assert torch.equal(shuffled[0].sort(0).values, features[0].sort(0).values)
    assert not torch.equal(shuffled[0], shuffled[1])


@pytest.fixture(scope="module")
def attack():
    return inversion.run_attack(seed=0, key=2024, epochs=4, n_victims=60, n_show=3)


def test_attack_has_a_row_per_protection_and_beats_baselines_unprotected(attack):
    decoder_rows = {r.protection: r for r in attack.rows if r.attacker == "decoder"}
    assert set(decoder_rows) == set(inversion.PROTECTIONS)
    assert {r.protection for r in attack.rows if r.attacker == "adaptive"} == {"tokens", "channels", "both"}
    baselines = {b["name"]: b for b in attack.baselines}
    assert set(baselines) == {"blank", "mean training image"}
    none = decoder_rows["none"]
    assert none.ssim > baselines["mean training image"]["ssim"] + 0.15
    assert none.ssim > baselines["blank"]["ssim"] + 0.5
    assert none.psnr > baselines["mean training image"]["psnr"] + 2
    assert attack.originals.shape == (3, 8, 8) and 0 <= attack.originals.min() and attack.originals.max() <= 1
    assert attack.reconstructions["channels/decoder"].shape == (3, 8, 8)


def test_image_scores_are_perfect_for_identical_images_and_not_otherwise():
    images = inversion.to_unit_images(torch.randn(3, 1, 8, 8))
    assert inversion.image_scores(images, images) == (1.0, 99.0)
    ssim, psnr = inversion.image_scores(images, 1 - images)
    assert ssim < 0.5 and psnr < 20


def test_cli_json_shape_and_bad_key(capsys):
    assert main(["split-attack", "--json", "--epochs", "1", "--victims", "10"]) == 0
    report = validated("split_attack", capsys.readouterr().out)
    each_required_field_is_named("split_attack", report)
    assert {"seed", "key", "epochs", "n_victims", "rows", "baselines", "seconds"} <= set(report)
    assert len(report["rows"]) == 7 and {r["protection"] for r in report["rows"]} == set(inversion.PROTECTIONS)
    assert all({"protection", "attacker", "ssim", "psnr"} <= set(r) for r in report["rows"])
    assert [b["name"] for b in report["baselines"]] == ["blank", "mean training image"]
    again = inversion.run_attack(seed=0, key=2024, epochs=1, n_victims=10, n_show=0)
    assert [r.ssim for r in again.rows] == [r["ssim"] for r in report["rows"]]  # reproducible from the seed
    assert main(["split-attack", "--key", "-1"]) == 2
    assert "key" in capsys.readouterr().err
