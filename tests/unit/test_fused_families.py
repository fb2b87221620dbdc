"""GPT-NeoX (Pythia) and Phi-3: fused projections, partial RoPE, every symmetry exact, every near miss broken.

random:gpt_neox: head_dim 12, rotary_pct 0.5 (3 rotary planes, 6 channels RoPE leaves alone), a parallel
residual, biases in every layer, an untied output head. random:phi3: two key/value groups of two query heads,
head_dim 12, partial_rotary_factor 0.5, a sliding window of 4 on every layer, fused qkv_proj and gate_up_proj.
Both far from Hugging Face's init.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import transformers as hf

from perm_core import keys, symmetries
from perm_core.__main__ import main
from perm_core.apps import rotation
from perm_core.families import family_of, gpt_neox, phi3
from perm_core.numerics import use_exact_numerics
from perm_core.random_models import build_random_model, random_config, random_inputs, randomize_
from perm_core.spec import Concat, FamilySpec, Rule, Scramble
from perm_core.tokens import causal_float_mask, model_inputs
from perm_core.transforms import BlockOrthogonal
from perm_core.verify import Subject, check
from tests.unit.scrambled_checkpoints import save_and_scramble

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ("gpt_neox", "phi3")
CLASSES = {"gpt_neox": ("GPTNeoXModel", "GPTNeoXForTokenClassification"),
           "phi3": ("Phi3Model", "Phi3ForTokenClassification")}
KEYS = (12345, 7)
EXACT = 1e-9  # float64
BROKEN = 1e-2
_reports = {}


def report_for(family, dtype, key):
    if (family, dtype, key) not in _reports:
        model, _ = build_random_model(family, dtype=dtype, seed=3)
        _reports[family, dtype, key] = check(model, random_inputs(family, model, seed=3), key=key)
    return _reports[family, dtype, key]


def subject_of(family, seed=3, dtype=torch.float64) -> Subject:
    model, _ = build_random_model(family, dtype=dtype, seed=seed)
    return Subject(model, random_inputs(family, model, seed=seed))


def worst_after_undo(subject: Subject, scramble: Scramble, original=None) -> float:
    """Largest relative error (per tensor, against its own scale) after un-scrambling one forward run."""
    original = original or subject.trace()
    restored = subject.unscramble(subject.trace(scramble), scramble)
    return max((t - original[n].tensor).abs().max().item() / (original[n].tensor.abs().max().item() or 1.0)
               for n, t in restored.items())


def with_rule(subject: Subject, name_pattern: str, replacement: Rule) -> Subject:
    """The subject with one rule of its spec replaced (a planted bug)."""
    rules = tuple(replacement if rule.pattern == name_pattern else rule for rule in subject.spec.rules)
    assert rules != subject.spec.rules
    subject.spec = FamilySpec(f"{subject.spec.family}-with-bug", rules)
    subject.claims = subject.spec.claim_all(subject.params)
    return subject


def test_random_models_exercise_what_the_families_add():
    neox, phi = subject_of("gpt_neox"), subject_of("phi3")
    g = neox.geometry
    assert (g.head_dim, g.rotary_channels, g.rope, g.partial_rotary) == (12, 6, True, True)
    assert neox.model.config.use_parallel_residual and not neox.model.config.tie_word_embeddings
    g = phi.geometry
    assert (g.n_heads, g.n_kv_heads, g.head_dim, g.rotary_channels, g.d_mlp) == (4, 2, 12, 6, 64)
    for subject in (neox, phi):
        for name, p in subject.params.items():
            if p.dim() == 1 and name.endswith("weight"):
                assert p.std() > 0.1, name  # gains far from uniform
            elif p.dim() == 1:
                assert p.abs().mean() > 0.1, name  # biases far from zero
        assert not subject.spec.unclaimed(subject.params)
    assert any(name.endswith("query_key_value.bias") for name in neox.params)


def test_neox_fused_axis_is_laid_out_per_head_as_transformers_splits_it():
    subject = subject_of("gpt_neox")
    g = subject.geometry
    attention = subject.model.gpt_neox.layers[0].attention
    x = torch.randn(5, g.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fused = attention.query_key_value(x).view(5, g.n_heads, 3 * g.head_dim)
    stock_q, stock_k, stock_v = (part.reshape(5, -1) for part in fused.chunk(3, dim=-1))
    concat = subject.claims["gpt_neox.layers.0.attention.query_key_value.weight"].rule.axes[0]
    weights = concat.split(attention.query_key_value.weight, 0)
    biases = concat.split(attention.query_key_value.bias, 0)
    for stock, w, b in zip((stock_q, stock_k, stock_v), weights, biases, strict=True):
        assert torch.allclose(x @ w.T + b, stock, atol=1e-12)
    tensor = torch.randn(3, 2 * 7 * 2, 4)
    grouped = Concat((("q", 2), ("k", 5)), groups=4)
    assert torch.equal(grouped.join(grouped.split(tensor, 1), 1), tensor)
    plain = Concat((("q", 10), ("k", 18)))
    assert all(torch.equal(a, b) for a, b in zip(plain.split(tensor, 1), tensor.split([10, 18], 1), strict=True))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("key", KEYS)
def test_every_symmetry_holds_forward_and_backward_and_every_control_breaks(family, dtype, key):
    report = report_for(family, dtype, key)
    assert report.family == family
    assert {(c.symmetry, c.direction) for c in report.checks} == {
        (s, d) for s in (*symmetries.SYMMETRIES, "all") for d in ("forward", "backward")}
    failing = [(c.symmetry, c.direction, c.max_rel_error, c.note) for c in report.checks if not c.passed]
    assert not failing
    if dtype == torch.float64:
        assert max(c.max_rel_error for c in report.checks) <= EXACT
    assert min(c.moved for c in report.checks) >= 0.1
    assert all(c.max_rel_error > BROKEN for c in report.controls), [(c.name, c.max_rel_error) for c in report.controls]
    names = {c.name for c in report.controls}
    assert {"rotary_channels_moved", "planes_across_the_whole_head", "general_rotation_with_rope",
            "qk_channels_with_rope", "keys_moved_wrongly", "norms_not_permuted"} <= names
    assert ("window_not_moved" in names) == (family == "phi3")
    assert set(report.restricted) == {"head_channels", "rotation"}
    assert report.passed


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key", KEYS)
def test_every_space_moves_for_every_test_key(family, key):
    subject = subject_of(family)
    g = subject.geometry
    for name in symmetries.SYMMETRIES:
        element = subject.build({name: key})
        for space, chain in element.spaces.items():
            probe = torch.eye(chain[0].size, dtype=torch.float64)
            for transform in chain:
                probe = transform.apply(probe, 0)
            assert not torch.allclose(probe, torch.eye(len(probe), dtype=torch.float64)), (name, space)
    head_channels = subject.build({"head_channels": key})
    for layer in range(g.n_layers):  # the rotary Q/K channels stay, the others move among themselves
        index = head_channels.spaces[("k", layer)][0].index.view(g.n_kv_heads, g.head_dim) % g.head_dim
        assert torch.equal(index[:, :g.rotary_channels], torch.arange(g.rotary_channels).expand(g.n_kv_heads, -1))
        assert not torch.equal(index[:, g.rotary_channels:], torch.arange(g.rotary_channels, g.head_dim).expand(
            g.n_kv_heads, -1))


@pytest.mark.parametrize("family", FAMILIES)
def test_qk_rotation_is_planes_in_the_rotary_slice_and_general_outside(family):
    g = subject_of(family).geometry
    r, half = g.rotary_channels, g.rotary_channels // 2
    blocks = symmetries.rotation(12345, g).spaces[("k", 0)][0].blocks
    assert blocks[:, :r, r:].abs().max() == 0 and blocks[:, r:, :r].abs().max() == 0
    rotary = blocks[:, :r, :r]
    planes = torch.zeros(r, r, dtype=torch.bool)
    for i in range(half):  # each plane (i, i + r/2) turned by a 2-D rotation [[c, -s], [s, c]], nothing across
        plane = [i, i + half]
        planes[torch.tensor(plane)[:, None], torch.tensor(plane)] = True
        block = rotary[:, plane][:, :, plane]  # [kv heads, 2, 2]
        c, s = block[:, 0, 0], block[:, 1, 0]
        assert torch.allclose(block[:, 1, 1], c) and torch.allclose(block[:, 0, 1], -s)
        assert torch.allclose(c**2 + s**2, torch.ones(g.n_kv_heads, dtype=torch.float64))
    assert rotary[:, ~planes].abs().max() == 0
    rest = blocks[:, r:, r:]
    assert torch.allclose(rest @ rest.transpose(1, 2), torch.eye(g.head_dim - r, dtype=torch.float64).expand_as(rest))
    assert (rest - torch.diag_embed(rest.diagonal(dim1=1, dim2=2))).abs().max() > 0.3  # it mixes channels
    bits = symmetries.key_space_bits("head_channels", g)
    assert bits == g.n_layers * g.n_kv_heads * (keys.permutation_bits(12) + keys.permutation_bits(6))


@pytest.mark.parametrize("family", FAMILIES)
def test_rotary_split_ignored_either_way_fails(family):
    """Rotating the non-rotary channels as if RoPE rotated the whole head, or the rotary ones as if RoPE
    rotated none of them, breaks the model; the right split is exact."""
    subject = subject_of(family)
    g, original = subject.geometry, subject.trace()
    assert worst_after_undo(subject, symmetries.rotation(7, g), original) <= EXACT
    as_if_whole_head = symmetries.rotation(7, replace(g, rotary_dim=None))
    assert worst_after_undo(subject, as_if_whole_head, original) > BROKEN
    assert worst_after_undo(subject, symmetries.rotation(7, g, whole_head_rotary=True), original) > BROKEN
    correct = symmetries.rotation(7, g)
    general_rotary = {}
    for space, (transform,) in correct.spaces.items():
        blocks = transform.blocks.clone()
        if space[0] in "qk":
            general = keys.orthogonal(7, len(blocks), g.rotary_channels, f"bug/{space}")
            blocks[:, :g.rotary_channels, :g.rotary_channels] = general
        general_rotary[space] = (BlockOrthogonal(blocks),)
    assert worst_after_undo(subject, Scramble(general_rotary), original) > BROKEN
    assert worst_after_undo(subject, symmetries.rotation(7, replace(g, rope=False)), original) > BROKEN
    assert worst_after_undo(subject, symmetries.head_channels(7, replace(g, rope=False)), original) > BROKEN


def test_neox_qkv_read_as_one_block_of_q_then_k_then_v_fails():
    subject = subject_of("gpt_neox")
    g, original = subject.geometry, subject.trace()
    blockwise = Concat((("q", g.d_model), ("k", g.d_model), ("v", g.d_model)))
    for suffix, axes in (("weight", (blockwise, "resid")), ("bias", (blockwise,))):
        pattern = gpt_neox.L + rf"attention\.query_key_value\.{suffix}"
        subject = with_rule(subject, pattern, Rule(pattern, axes, "attn.qkv"))
    for name in ("heads", "head_channels", "rotation"):
        assert worst_after_undo(subject, subject.build({name: 7}), original) > BROKEN, name
    assert worst_after_undo(subject, subject.build({"channels": 7}), original) <= EXACT  # it only touches heads


@pytest.mark.parametrize("half", ["gate", "up"])
def test_phi3_gate_up_with_one_half_left_in_place_fails(half):
    subject = subject_of("phi3")
    g, original = subject.geometry, subject.trace()
    parts = (("mlp", g.d_mlp), ("unmoved", g.d_mlp)) if half == "up" else (("unmoved", g.d_mlp), ("mlp", g.d_mlp))
    pattern = phi3.L + r"mlp\.gate_up_proj\.weight"
    subject = with_rule(subject, pattern, Rule(pattern, (Concat(parts), "resid"), "mlp.in"))
    assert worst_after_undo(subject, subject.build({"mlp": 7}), original) > BROKEN


@pytest.mark.parametrize("family", FAMILIES)
def test_other_classes_and_sequential_residual(family):
    for cls in CLASSES[family]:
        model, _ = build_random_model(family, model_class=cls, dtype=torch.float64, seed=5)
        report = check(model, random_inputs(family, model, seed=5), key=12345, include_combined=False)
        assert family_of(model).name == family and report.passed, cls
        assert max(c.max_rel_error for c in report.checks) <= EXACT
    if family == "gpt_neox":
        config = random_config("gpt_neox")
        config.use_parallel_residual = False
        torch.manual_seed(5)
        model = randomize_(hf.GPTNeoXForCausalLM(config).to(torch.float64), 5)
        use_exact_numerics(model)
        report = check(model.eval(), random_inputs(family, model, seed=5), key=7, include_combined=False)
        assert report.passed and max(c.max_rel_error for c in report.checks) <= EXACT


@pytest.mark.parametrize("family", FAMILIES)
def test_scrambled_checkpoint_reloaded_by_plain_transformers_gives_the_same_logits(tmp_path, family):
    cls = {"gpt_neox": "GPTNeoXForCausalLM", "phi3": "Phi3ForCausalLM"}[family]
    model, _ = build_random_model(family, dtype=torch.float64, seed=4)
    assert save_and_scramble(model, tmp_path)["family"] == family

    def plain(directory):
        return getattr(hf, cls).from_pretrained(directory, dtype=torch.float64, attn_implementation="sdpa").eval()

    original, scrambled = plain(tmp_path / "original"), plain(tmp_path / "scrambled")
    inputs = random_inputs(family, model, seed=4)
    with torch.no_grad():
        want, got = original(**inputs).logits, scrambled(**inputs).logits
    error = ((got - want).abs().max() / want.abs().max()).item()
    assert error < (1e-5 if family == "phi3" else 1e-12), error  # stock RMSNorm normalizes in float32
    moved = max(((a - b).abs().max() / a.abs().max()).item()
                for (name, a), b in zip(original.named_parameters(), scrambled.parameters(), strict=True)
                if "norm" not in name)
    assert moved > 0.1
    norm = {"gpt_neox": "gpt_neox.layers.0.input_layernorm.weight",
            "phi3": "model.layers.0.input_layernorm.weight"}[family]
    with torch.no_grad():  # negative control: one gain left in the original channel order
        dict(scrambled.named_parameters())[norm].copy_(dict(original.named_parameters())[norm])
        broken = scrambled(**inputs).logits
    assert ((broken - want).abs().max() / want.abs().max()).item() > BROKEN


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_check_of_the_random_model_exits_0(family, capsys):
    assert main(["check", f"random:{family}", "--dtype", "float64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == family and report["passed"]


def test_phi3_window_masks_match_the_stock_model_and_the_window_matters():
    """Phi-3 slides in every layer from one mask: the one built here from the positions, window included."""
    subject = subject_of("phi3")
    g = subject.geometry
    assert (g.sliding_window, g.window_in_every_layer) == (4, True) and subject.n_tokens > g.sliding_window
    kwargs = model_inputs(subject.inputs, g, Scramble(), torch.float64)
    valid = subject.inputs["attention_mask"][0].bool()
    no_window = causal_float_mask(kwargs["position_ids"], subject.inputs["attention_mask"], torch.float64)
    with torch.no_grad():
        ours = subject.model(**kwargs).logits
        stock = subject.model(input_ids=subject.inputs["input_ids"],
                              attention_mask=subject.inputs["attention_mask"]).logits
        windowless = subject.model(**{**kwargs, "attention_mask": no_window}).logits
    assert torch.equal(ours[:, valid], stock[:, valid])
    assert (windowless - stock)[:, valid].abs().max() > BROKEN


@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_app_reads_the_fused_projections_as_the_spec_splits_them(family):
    subject = subject_of(family)
    demo = rotation.rotation_demo(subject.model, subject.inputs, 7)
    assert demo.passed and demo.control_broken
    moving = [q for q in demo.quantities if not q.invariant]
    assert {q.name for q in moving} >= {"queries", "keys", "values"}
    assert min(q.changed for q in moving) > 0.1 and max(q.restored for q in demo.quantities) <= EXACT
    kind = rotation.norm_commutation(subject, 7)["kind"]
    assert kind == ({"LayerNorm": 1.0} if family == "gpt_neox" else {"RMSNorm": 1.0})
