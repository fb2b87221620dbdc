"""Text models without a tokenizer (random:*, weights-only directories) run on token ids from their vocabulary."""

from __future__ import annotations

import pytest
import torch

from perm_core.__main__ import main
from perm_core.models import inputs, registry
from perm_core.models.defaults import default_inputs
from perm_core.models.inputs import InputError
from perm_core.models.random_models import build_random_model
from tests.unit.json_schema import validated

TEXT_FAMILIES = ("bert", "gpt2", "llama")


@pytest.fixture(scope="module")
def random_text_models():
    return {family: registry.load_model(f"random:{family}") for family in TEXT_FAMILIES}


@pytest.fixture(scope="module")
def digits_vit():
    return registry.load_model("digits-vit")


def test_random_text_models_have_no_tokenizer_but_take_text(random_text_models):
    for loaded in random_text_models.values():
        assert loaded.tokenizer is None and inputs.takes_text(loaded)


def test_token_ids_are_reproducible_and_from_the_vocabulary(random_text_models):
    loaded = random_text_models["gpt2"]
    first = inputs.token_ids(loaded, 20, seed=3)
    assert torch.equal(first["input_ids"], inputs.token_ids(loaded, 20, seed=3)["input_ids"])
    assert not torch.equal(first["input_ids"], inputs.token_ids(loaded, 20, seed=4)["input_ids"])
    assert first["input_ids"].shape == (1, 20) and first["attention_mask"].tolist() == [[1] * 20]
    ids = first["input_ids"]
    assert ids.dtype == torch.long and 0 <= ids.min() and ids.max() < loaded.model.config.vocab_size
    assert inputs.token_ids(loaded, 1)["input_ids"].shape == (1, 1)


@pytest.mark.parametrize("n_tokens", [0, -3, 2.5, True, "12"])
def test_never_zero_tokens(n_tokens, random_text_models):
    with pytest.raises(InputError, match="at least 1"):
        inputs.token_ids(random_text_models["llama"], n_tokens)


def test_token_ids_respect_the_window_and_the_modality(random_text_models, digits_vit):
    window = inputs.model_window(random_text_models["bert"])
    assert window == 64
    with pytest.raises(InputError, match="window of 64"):
        inputs.token_ids(random_text_models["bert"], 65)
    with pytest.raises(InputError, match="seed"):
        inputs.token_ids(random_text_models["bert"], 5, seed=-1)
    with pytest.raises(InputError, match="takes images"):
        inputs.token_ids(digits_vit, 5)
    with pytest.raises(InputError, match="takes images"):
        inputs.prepare_text("hello", digits_vit)


def test_text_without_tokenizer_hashes_each_word(random_text_models):
    loaded = random_text_models["llama"]
    encoding, notice = inputs.prepare_text("the cat saw the dog", loaded)
    ids = encoding["input_ids"][0].tolist()
    assert notice is None and len(ids) == 5 and ids[0] == ids[3] and len(set(ids)) == 4
    again, _ = inputs.prepare_text("the cat saw the dog", loaded)
    assert torch.equal(again["input_ids"], encoding["input_ids"])
    other = random_text_models["gpt2"]  # the same vocabulary size: the same ids, tokenizer or not
    assert inputs.prepare_text("the cat saw the dog", other)[0]["input_ids"][0].tolist() == ids
    with pytest.raises(InputError, match="empty"):
        inputs.prepare_text("   ", loaded)
    long_encoding, notice = inputs.prepare_text(" ".join(f"w{i}" for i in range(100)), loaded, max_tokens=30)
    assert long_encoding["input_ids"].shape == (1, 30) and notice.startswith("Text truncated to 30 tokens")


def test_labels_are_id_chips_without_a_tokenizer(random_text_models):
    loaded = random_text_models["bert"]
    assert inputs.token_labels(loaded, torch.tensor([[17, 3]])) == ["#17", "#3"]
    assert inputs.token_labels(loaded, [0]) == ["#0"]


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_check_on_random_text_models_passes(family, one_thread, capsys):
    assert main(["check", f"random:{family}", "--symmetry", "tokens", "--symmetry", "heads", "--json"]) == 0
    report = validated("check", capsys.readouterr().out)
    assert report["passed"] and {c["symmetry"] for c in report["checks"]} == {"tokens", "heads", "all"}


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_weights_only_directory_runs_on_token_ids(family, tmp_path, one_thread, capsys):
    """A save_pretrained directory without tokenizer files: GPT-2 used to crash on zero tokens, Llama was
    refused; now every page and command gets 12 ids drawn from the vocabulary."""
    model, _ = build_random_model(family, seed=2)
    model.config._attn_implementation = "eager"
    model.save_pretrained(tmp_path)
    loaded = registry.load_model(str(tmp_path))
    assert loaded.tokenizer is None and loaded.image_size is None
    encoding = default_inputs(loaded)
    assert encoding["input_ids"].shape == (1, inputs.DEFAULT_N_TOKENS)
    assert torch.equal(encoding["input_ids"], default_inputs(loaded)["input_ids"])
    assert not torch.equal(encoding["input_ids"], default_inputs(loaded, seed=1)["input_ids"])
    assert main(["check", str(tmp_path), "--symmetry", "tokens", "--symmetry", "mlp", "--json"]) == 0
    assert validated("check", capsys.readouterr().out)["passed"]
