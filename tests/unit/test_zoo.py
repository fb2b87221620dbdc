"""The model zoo, with HF_HUB_OFFLINE=1: offline models work, hub models fail fast and clearly."""


import pytest
import torch
from safetensors.torch import save_file

from perm_core.families import geometry_of
from perm_core.models import inputs, registry
from perm_core.models.registry import ModelLoadError
from perm_core.models.zoo import SMOLLM2
from perm_core.run.numerics import EXACT_EAGER

# --- listing ---


def test_list_models_rows():
    rows = {info.name: info for info in registry.list_models()}
    for name in ("digits-vit", "digits-vit-b", "minilm", "smollm2-135m", "gpt2", "distilgpt2",
                 "bert-base-uncased", "google/vit-base-patch16-224", "facebook/deit-tiny-patch16-224",
                 "HuggingFaceTB/SmolLM2-135M", "random:vit", "random:llama"):  # fmt: skip
        assert name in rows, name
    assert rows[registry.DEFAULT_IMAGE_MODEL].task == "image-classification"
    assert rows[registry.DEFAULT_TEXT_MODEL].task == "sentence-embedding"
    for name in ("digits-vit", "digits-vit-b", "minilm", "smollm2-135m"):
        assert rows[name].offline, name
    assert all(rows[n].source == "hub" and not rows[n].offline for n in zoo_hub_names())
    assert {info.family for info in rows.values()} <= set(registry.FAMILIES)
    # published parameter counts, here computed from configs on the meta device
    expected = {
        "minilm": 22_713_216,
        "smollm2-135m": 134_515_008,
        "gpt2": 124_439_808,
        "distilgpt2": 81_912_576,
        "google/vit-base-patch16-224": 86_567_656,
        "facebook/deit-tiny-patch16-224": 5_717_416,
        "HuggingFaceTB/SmolLM2-135M": 134_515_008,
    }
    for name, count in expected.items():
        assert rows[name].n_params == count, name
    assert rows["bert-base-uncased"].n_params == 109_514_298  # BertForMaskedLM, tied decoder
    assert rows["digits-vit"].n_params == sum(
        p.numel() for p in registry.load_model("digits-vit").model.parameters()
    )
    assert rows["minilm"].license == rows["smollm2-135m"].license == "Apache-2.0"
    assert rows["gpt2"].license == "MIT"


def zoo_hub_names():
    from perm_core.models import hub

    return list(hub.HUB_MODELS)


# --- hub offline ---


@pytest.mark.parametrize("name", ["gpt2", "google/vit-base-patch16-224"])
def test_hub_model_offline_fails_fast_naming_offline_models(name, monkeypatch):
    """Fast because nothing waits on the network: not one connection is attempted."""
    import socket

    attempts = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: attempts.append(address))
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: attempts.append(address))
    with pytest.raises(ModelLoadError) as caught:
        registry.load_model(name)
    assert attempts == []
    message = str(caught.value)
    assert "\n" not in message and "offline" in message
    assert name in message and "digits-vit" in message and "minilm" in message


def test_unknown_names_and_bad_directories(tmp_path):
    with pytest.raises(ModelLoadError, match="Unknown model 'no-such-model'"):
        registry.load_model("no-such-model")
    with pytest.raises(ModelLoadError, match="No such model directory"):
        registry.load_model(str(tmp_path / "absent"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        registry.load_model(str(tmp_path))


def test_pickle_checkpoints_are_refused(tmp_path):
    model = registry.load_model("digits-vit").model
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle"):
        registry.load_model(str(tmp_path))


def test_local_directory_round_trip(tmp_path):
    original = registry.load_model("digits-vit")
    original.model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = registry.load_model(str(tmp_path), dtype=torch.float64)
    assert loaded.info.family == "vit" and loaded.info.task == "image-classification"
    assert loaded.model.dtype == torch.float64 and not loaded.model.training
    assert loaded.model.config._attn_implementation == EXACT_EAGER
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        reloaded = loaded.model(pixel_values=x.double()).logits
        expected = original.model(pixel_values=x).logits
    assert torch.allclose(reloaded.float(), expected, atol=1e-5)


def test_local_rgb_vit_uses_its_image_processor_or_the_default(tmp_path):
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, num_labels=3)  # fmt: skip
    ViTForImageClassification(config).save_pretrained(tmp_path)
    # A processor with unusual statistics, so using it (or not) shows in the pixels.
    ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0, 0, 0], image_std=[1, 1, 1]
    ).save_pretrained(tmp_path)
    white, black = Image.new("RGB", (50, 40), (255, 255, 255)), Image.new("RGB", (50, 40))
    with_processor = registry.load_model(str(tmp_path))
    assert with_processor.image_processor is not None
    assert with_processor.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    pixels = inputs.image_to_pixels(black, with_processor)  # its mean 0 / std 1: black stays 0
    assert pixels.shape == (1, 3, 32, 32) and torch.equal(pixels, torch.zeros_like(pixels))
    (tmp_path / "preprocessor_config.json").unlink()
    bare = registry.load_model(str(tmp_path))
    assert bare.image_processor is None
    pixels = inputs.image_to_pixels(white, bare)  # default (x - 0.5) / 0.5: white -> 1, black -> -1
    assert pixels.shape == (1, 3, 32, 32) and torch.allclose(pixels, torch.ones_like(pixels))
    pixels = inputs.image_to_pixels(black, bare)
    assert torch.allclose(pixels, -torch.ones_like(pixels))


def test_unsupported_local_architecture(tmp_path):
    from transformers import FNetConfig  # (T5, the example here before, is supported now)

    FNetConfig().save_pretrained(tmp_path)
    save_file({"x": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="not supported"):
        registry.load_model(str(tmp_path))


# --- offline models ---


def test_digits_vit_loaded_fields():
    loaded = registry.load_model("digits-vit", dtype=torch.float64)
    assert loaded.model.dtype == torch.float64 and not loaded.model.training
    assert loaded.model.config._attn_implementation == EXACT_EAGER
    assert (loaded.image_size, loaded.image_channels, loaded.tokenizer) == (8, 1, None)
    assert loaded.labels == [str(d) for d in range(10)]
    out = loaded.model(pixel_values=torch.zeros(1, 1, 8, 8, dtype=torch.float64), output_attentions=True)
    assert len(out.attentions) == loaded.model.config.num_hidden_layers
    assert out.attentions[0].shape == (1, 4, 17, 17)


def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(registry.mean_pool(hidden, mask), torch.tensor([[2.0, 3.0]]))


def test_minilm_paraphrase_beats_unrelated():
    loaded = registry.load_model("minilm")
    assert loaded.info.family == "bert" and type(loaded.model).__name__ == "BertModel"
    assert loaded.model.config._attn_implementation == EXACT_EAGER and not loaded.model.training
    texts = [
        "A man is playing a guitar.",
        "Someone plays the guitar.",
        "The stock market fell sharply today.",
    ]
    embeddings = []
    with torch.no_grad():
        for text in texts:
            encoding, _ = inputs.prepare_text(text, loaded)
            hidden = loaded.model(**encoding).last_hidden_state
            embeddings.append(registry.mean_pool(hidden, encoding["attention_mask"])[0])
    cos = torch.nn.functional.cosine_similarity
    paraphrase, unrelated = cos(embeddings[0], embeddings[1], dim=0), cos(embeddings[0], embeddings[2], dim=0)
    assert paraphrase > 0.6 and unrelated < 0.2 and paraphrase > unrelated + 0.4


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smollm):
    loaded, calls, _, _ = smollm
    assert loaded.info.family == "llama" and type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.model.config._attn_implementation == EXACT_EAGER and not loaded.model.training
    assert sum(p.numel() for p in loaded.model.parameters()) == 134_515_008
    assert calls[0][0] == 0.0 and calls[-1][0] == 1.0  # the one-time conversion reported progress
    assert inputs.model_window(loaded) == 8192
    encoding, notice = inputs.prepare_text("The capital of France is", loaded)
    assert notice is None
    with torch.no_grad():
        out = loaded.model.generate(**encoding, max_new_tokens=8, do_sample=False)
    continuation = loaded.tokenizer.decode(out[0, encoding["input_ids"].shape[1] :])
    assert "Paris" in continuation


@pytest.mark.slow
def test_smollm2_cache_is_complete_and_reloads_without_converting(smollm, monkeypatch):
    first, _, _, cache = smollm
    monkeypatch.setenv("TRANSFORMER_SYMMETRY_CACHE", str(cache))
    directory = SMOLLM2.loader.cache_dir(SMOLLM2.loader.gguf_files())
    assert str(directory).startswith(str(cache))
    assert (directory / "complete.json").is_file()
    assert not [p for p in directory.parent.iterdir() if p.name.startswith(".smollm2-")]  # no temp left over
    steps = []
    again = registry.load_model("smollm2-135m", dtype=torch.bfloat16, progress=lambda f, m: steps.append(m))
    assert steps == []  # loaded from the cache: no conversion step reported
    assert again.model.dtype == torch.bfloat16
    name = "model.layers.3.self_attn.q_proj.weight"
    assert torch.equal(again.model.state_dict()[name], first.model.state_dict()[name].bfloat16())


@pytest.mark.slow
def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_SYMMETRY_CACHE", str(tmp_path))
    files = SMOLLM2.loader.gguf_files()

    def crash(fraction, message):
        if fraction >= 0.3:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        SMOLLM2.loader.convert(SMOLLM2.name, files, SMOLLM2.loader.cache_dir(files), progress=crash)
    assert list(tmp_path.iterdir()) == []


def test_random_models_when_available():
    random_models = pytest.importorskip("perm_core.models.random_models")
    image_families = set()
    for family in registry.FAMILIES:
        loaded = registry.load_model(f"random:{family}", dtype=torch.float64)
        assert loaded.info.source == "random" and loaded.info.family == family
        assert loaded.model.dtype == torch.float64 and not loaded.model.training
        assert loaded.model.config._attn_implementation == EXACT_EAGER
        # Whatever the family: an image model (by its geometry) gets an image size, a text model does not.
        assert (loaded.image_size is not None) == (geometry_of(loaded.model).input_kind == "image"), family
        image_families |= {family} if loaded.image_size is not None else set()
    assert image_families == {"vit", "dinov2", "deit"}
    assert "tiny" in random_models.RANDOM_SIZES
    with pytest.raises(ModelLoadError, match="Unknown random family"):
        registry.load_model("random:resnet")
