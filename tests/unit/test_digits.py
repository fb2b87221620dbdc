"""digits-vit: the fixed split, the preprocessing and the two shipped models."""

import json

import pytest
import torch

from perm_core.models import digits, registry


def test_split_is_fixed_stratified_and_disjoint():
    train_idx, test_idx = digits.split_indices()
    assert len(train_idx) == 1437 and len(test_idx) == 360
    assert set(train_idx).isdisjoint(test_idx)
    again_train, again_test = digits.split_indices()
    assert (again_train == train_idx).all() and (again_test == test_idx).all()
    train_x, train_y, test_x, test_y = digits.digits_split()
    assert train_x.shape == (1437, 1, 8, 8) and test_x.shape == (360, 1, 8, 8)
    assert train_x.dtype == torch.float32
    # stratified: every class has 35..37 of the 360 test images
    counts = torch.bincount(test_y, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    assert len(train_y) == 1437


def test_preprocessing_matches_documented_constants():
    _, _, raw_test, _ = digits.digits_split(raw=True)
    _, _, test_x, _ = digits.digits_split()
    assert raw_test.min() == 0 and raw_test.max() == 16
    expected = (raw_test / 16 - 0.305) / 0.376
    assert torch.allclose(test_x, expected)
    train_x, _, _, _ = digits.digits_split()
    # the normalization was fitted on the training split: close to zero mean, unit std
    assert abs(train_x.mean().item()) < 0.01 and abs(train_x.std().item() - 1) < 0.01


def test_random_shift_moves_images_by_at_most_one_pixel():
    x = torch.arange(2 * 64, dtype=torch.float32).reshape(2, 1, 8, 8)
    shifted = digits.random_shift(x, torch.Generator().manual_seed(3))
    background = digits.normalize_pixels(torch.tensor(0.0)).item()
    for original, moved in zip(x, shifted, strict=True):
        candidates = []
        padded = torch.nn.functional.pad(original, (1, 1, 1, 1), value=background)
        for dy in range(3):
            for dx in range(3):
                candidates.append(padded[:, dy : dy + 8, dx : dx + 8])
        assert any(torch.equal(moved, c) for c in candidates)


@pytest.mark.parametrize("name", ["digits-vit", "digits-vit-b"])
def test_shipped_model_accuracy_matches_metrics(name):
    loaded = registry.load_model(name)
    accuracy, loss = digits.evaluate_digits(loaded.model)
    metrics = json.loads((registry.shipped_dir(name) / "metrics.json").read_text())
    assert accuracy >= 0.95
    assert abs(accuracy - metrics["test_accuracy"]) <= 0.005
    assert abs(loss - metrics["test_loss"]) < 1e-3
    assert metrics["seed"] == {"digits-vit": 0, "digits-vit-b": 1}[name]
    assert "test_size=0.2" in metrics["split"]


def test_the_pair_shares_architecture_but_not_weights():
    a = registry.load_model("digits-vit").model.state_dict()
    b = registry.load_model("digits-vit-b").model.state_dict()
    assert a.keys() == b.keys()
    assert all(a[k].shape == b[k].shape for k in a)
    assert sum(not torch.equal(a[k], b[k]) for k in a) == len(a)  # every tensor differs


def test_shipped_weights_are_small():
    for name in ("digits-vit", "digits-vit-b"):
        assert (registry.shipped_dir(name) / "model.safetensors").stat().st_size < 5 * 2**20


def test_training_is_deterministic_from_the_seed(tmp_path):
    # One epoch is enough to tell whether the seed fixes everything (init, order, shifts).
    first = digits.train_digits(5, tmp_path / "a", epochs=1, progress=False)
    second = digits.train_digits(5, tmp_path / "b", epochs=1, progress=False)
    assert first["test_loss"] == second["test_loss"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["seed"] == 5 and metrics["epochs"] == 1
    assert metrics["command"].startswith("python -m perm_core train-digits --seed 5 --out ")
    reloaded = registry.load_model(str(tmp_path / "a"))
    assert reloaded.info.source == "local" and reloaded.image_size == 8
    assert digits.evaluate_digits(reloaded.model)[1] == pytest.approx(first["test_loss"], abs=1e-5)
