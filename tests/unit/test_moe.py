"""Mixtures of experts (issue 48), one table over the five families and their head classes: the experts symmetry
(each layer's routed experts reordered with their router rows and biases) and mlp inside every expert hold with
channels, heads, head channels and rotations, forward and backward, the oracle agreeing, at Hugging Face's init and
far from it, in float64 and float32; every negative control breaks; each planted bug is caught; a scrambled
checkpoint reloaded by plain transformers (eager experts) computes the same logits; a dense family says experts are
not applicable; the streamed check runs them (test_stream_moe.py).

The random:FAMILY models (perm_core.models.random_models) have four experts of 16 neurons, two per token, three
key/value groups of two query heads, and every gain, bias, router bias and sink far from init.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers as hf

from perm_core.__main__ import main
from perm_core.engine import keys, symmetries
from perm_core.engine.spec import Concat, FamilySpec, Gain, Merged, Rule, Scramble, apply_axes
from perm_core.engine.transforms import BlockOrthogonal, Permutation
from perm_core.families import family_by_name, family_of
from perm_core.models.random_models import DEFAULT_CLASSES, build_random_model, random_config, random_inputs, randomize_
from perm_core.run.numerics import use_exact_numerics
from perm_core.verify.check import check
from perm_core.verify.results import VacuousCheckError
from perm_core.verify.subject import Subject
from tests.unit.scrambled_checkpoints import reloaded_in_transformers, save_and_scramble
from tests.unit.symmetry_asserts import assert_every_control_breaks, assert_symmetry_holds

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
MOE_SYMMETRIES = ("experts", "mlp", "channels", "heads")  # what the lighter rows of the table check
# Each family's controls beyond the dense ones: the experts' two, each expert's down projection left behind, and
# gpt-oss's gate|up interleaving ignored; Qwen2-MoE's shared expert keeps the dense MLP's control.
OWN_CONTROLS = {"experts": {"router_not_permuted", "router_alone"}, "mlp": {"expert_down_not_permuted"},
                "router_shift": {"one_row_shifted"}}
EXACT = 1e-12  # float64: every MoE check measured at or below 2e-14
BROKEN = 1e-2


def moe_model(family: str, cls: str | None = None, dtype=torch.float64, far: bool = True, seed: int = 3):
    """The family's random model (far from init), or the same architecture left at Hugging Face's init."""
    if far:
        return build_random_model(family, model_class=cls, dtype=dtype, seed=seed)[0]
    torch.manual_seed(seed)
    model = getattr(hf, cls or DEFAULT_CLASSES[family])(random_config(family)).to(dtype)
    use_exact_numerics(model)
    return model.eval()


_reports = {}


def full_report(family: str):
    """Every symmetry, their composition and every control, float64, far from init, the default class."""
    if family not in _reports:
        model = moe_model(family)
        _reports[family] = check(model, random_inputs(family, model, seed=3), key=12345)
    return _reports[family]


# --- the spec: every class claimed whole, the engine's new axis kinds ---


@pytest.mark.parametrize("family", FAMILIES)
def test_every_head_class_is_claimed_whole(family):
    config = random_config(family)
    classes = family_by_name(family).classes
    assert DEFAULT_CLASSES[family] in classes
    for cls in classes:
        model = getattr(hf, cls)(config)
        assert family_of(model).name == family
        assert family_of(model).spec(config).unclaimed(dict(model.named_parameters())) == [], cls
        assert family_of(model).geometry(config).n_experts == 4


def test_merged_axes_are_one_expert_major_space():
    """[E, 2I, H] with gate|up halves: reordering experts moves whole experts; inverting restores the tensor."""
    e, i, h = 3, 4, 5
    tensor = torch.randn(e, 2 * i, h, dtype=torch.float64)
    axes = (None, Merged(0, Concat((("expert_mlp", i), ("expert_mlp", i)), groups=e)), "resid")
    order = torch.tensor([2, 0, 1])
    moved = Scramble({("expert_mlp", 0): (Permutation((order[:, None] * i + torch.arange(i)).flatten()),)})
    out = apply_axes(tensor, axes, moved, 0)
    assert torch.equal(out, tensor[order])
    within = torch.stack([torch.randperm(i) for _ in range(e)])
    neurons = Scramble({("expert_mlp", 0): (Permutation((torch.arange(e)[:, None] * i + within).flatten()),)})
    out = apply_axes(tensor, axes, neurons, 0)
    assert torch.equal(out[1, :i], tensor[1, within[1]]) and torch.equal(out[1, i:], tensor[1, i + within[1]])
    assert torch.equal(apply_axes(out, axes, neurons.inverse(), 0), tensor)
    interleaved = (None, "resid", Merged(0, Concat((("expert_mlp", 1), ("expert_mlp", 1)), groups=e * i)))
    stored = tensor.transpose(1, 2).contiguous()  # [E, H, 2I]: gate = [..., ::2]
    out = apply_axes(stored, interleaved, neurons, 0)
    assert torch.equal(out[2, :, 0::2], stored[2, :, 0::2][:, within[2]])
    assert torch.equal(out[2, :, 1::2], stored[2, :, 1::2][:, within[2]])


def test_a_gain_ignores_signs_and_gathers_with_permutations():
    gain = torch.randn(6, dtype=torch.float64)
    signs = BlockOrthogonal(torch.diag_embed(torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0]],
                                                          dtype=torch.float64)))
    assert torch.equal(apply_axes(gain, (Gain("q"),), Scramble({("q", 0): (signs,)}), 0), gain)
    assert torch.equal(apply_axes(gain, ("q",), Scramble({("q", 0): (signs,)}), 0).abs(), gain.abs())
    order = Permutation(torch.tensor([3, 4, 5, 0, 1, 2]))
    assert torch.equal(apply_axes(gain, (Gain("q"),), Scramble({("q", 0): (order,)}), 0), gain[order.index])


def test_the_shared_expert_stays_and_each_expert_gets_its_own_neuron_order():
    subject = Subject(moe_model("qwen2_moe"), {})
    g = subject.geometry
    params = subject.transformed_params(subject.build({"experts": 5}))
    for name, tensor in subject.params.items():
        if "shared_expert" in name:
            assert params[name] is tensor, name
    router = "model.layers.0.mlp.gate.weight"
    order = symmetries.build("experts", 5, g).spaces[("experts", 0)][0].index
    assert torch.equal(params[router], subject.params[router][order])
    experts = "model.layers.0.mlp.experts.down_proj"
    assert torch.equal(params[experts], subject.params[experts][order])
    inside = symmetries.build("mlp", 5, g).spaces[("expert_mlp", 0)][0].index.view(g.n_experts, g.d_expert)
    assert len({tuple(row.tolist()) for row in inside % g.d_expert}) == g.n_experts  # four different orders


def test_key_space_bits_and_dense_families_have_no_experts():
    g = family_by_name("mixtral").geometry(random_config("mixtral"))
    assert symmetries.key_space_bits("experts", g) == pytest.approx(2 * math.log2(math.factorial(4) - 1))
    assert symmetries.key_space_bits("mlp", g) == pytest.approx(2 * 4 * keys.permutation_bits(16))
    assert symmetries.key_space_bits("router_shift", g) == math.inf  # continuous, as rotations are
    dense = family_by_name("llama").geometry(random_config("llama"))
    assert symmetries.key_space_bits("experts", dense) == symmetries.key_space_bits("router_shift", dense) == 0.0
    assert "no mixture-of-experts layers" in dense.not_applicable()["experts"]
    assert "no router to translate" in dense.not_applicable()["router_shift"]
    model = build_random_model("llama", dtype=torch.float64, seed=3)[0]
    for name in ("experts", "router_shift"):
        with pytest.raises(VacuousCheckError, match="no mixture-of-experts layers"):
            check(model, random_inputs("llama", model, seed=3), [name])
        assert main(["check", "random:llama", "--symmetry", name, "--dtype", "float64"]) == 2


# --- the check: the full report per family, then the lighter rows of the table ---


@pytest.mark.parametrize("family", FAMILIES)
def test_full_report_every_symmetry_holds_and_every_control_breaks(family):
    report = full_report(family)
    assert report.family == family and report.oracle.passed and not report.not_applicable
    for symmetry in (*symmetries.SYMMETRIES, "all"):
        assert_symmetry_holds(report, symmetry, torch.float64)
    assert max(c.max_rel_error for c in report.checks) < EXACT
    assert_every_control_breaks(report)
    names = {(c.symmetry, c.name) for c in report.controls}
    expected = {(s, n) for s, found in OWN_CONTROLS.items() for n in found}
    expected |= {("mlp", "interleaving_ignored")} if family == "gpt_oss" else set()
    expected |= {("mlp", "output_not_permuted")} if family == "qwen2_moe" else set()
    assert expected <= names
    assert ("mlp", "interleaving_ignored") in names or family != "gpt_oss"
    assert ("mlp", "output_not_permuted") not in names or family == "qwen2_moe"  # no dense MLP elsewhere
    assert set(report.restricted) == {"head_channels", "rotation"}
    if family == "olmoe":  # the full-width Q/K norm: heads in full, Q/K rotations as half-turns only
        assert "whole projection" in report.restricted["rotation"] and "heads" not in report.restricted
        assert ("rotation", "plane_rotation_with_qk_norm") in names


LIGHT = [(family, dtype, far) for family in FAMILIES for dtype, far in
         ((torch.float32, True), (torch.float64, False), (torch.float32, False))]


@pytest.mark.parametrize("family,dtype,far", LIGHT,
                         ids=[f"{f}-{str(d)[6:]}-{'far' if far else 'init'}" for f, d, far in LIGHT])
def test_experts_and_mlp_hold_at_init_and_in_float32(family, dtype, far):
    model = moe_model(family, dtype=dtype, far=far)
    report = check(model, random_inputs(family, model, seed=3), MOE_SYMMETRIES, key=7)
    for symmetry in (*MOE_SYMMETRIES, "all"):
        assert_symmetry_holds(report, symmetry, dtype)
    assert report.oracle.passed and report.passed
    for control in report.controls:
        if not far and control.name == "norms_not_permuted":  # HF's norm gains are all ones: shown, not assumed
            assert not control.informative and not control.broken and control.holds
            continue
        assert control.broken and control.max_rel_error > BROKEN, control.name  # experts' too, at init


OTHER_CLASSES = [(family, cls) for family in FAMILIES for cls in family_by_name(family).classes
                 if cls != DEFAULT_CLASSES[family]]


@pytest.mark.parametrize("family,cls", OTHER_CLASSES, ids=[cls for _, cls in OTHER_CLASSES])
def test_every_head_class_keeps_experts_mlp_and_heads(family, cls):
    model = moe_model(family, cls)
    report = check(model, random_inputs(family, model, seed=3), ("experts", "mlp", "heads", "tokens"), key=12345,
                   include_combined=False)
    for symmetry in ("experts", "mlp", "heads", "tokens"):
        assert_symmetry_holds(report, symmetry, torch.float64)
    assert report.passed and max(c.max_rel_error for c in report.checks) < EXACT


# --- planted bugs: each a one-rule mistake in gpt-oss's spec, caught by the check of the symmetry it breaks ---


def with_rule(subject: Subject, pattern_end: str, axes: tuple) -> Subject:
    """The subject with the rule whose pattern ends with `pattern_end` given other axes (a planted bug)."""
    rules = tuple(Rule(r.pattern, axes, r.tag) if r.pattern.endswith(pattern_end) else r for r in subject.spec.rules)
    assert rules != subject.spec.rules
    subject.spec = FamilySpec("gpt_oss-with-bug", rules)
    subject.claims = subject.spec.claim_all(subject.params)
    return subject


def gpt_oss_subject() -> Subject:
    model = moe_model("gpt_oss")
    return Subject(model, random_inputs("gpt_oss", model, seed=3))


def interleaving_ignored(g) -> Concat:
    return Concat((("expert_mlp", g.d_expert), ("expert_mlp", g.d_expert)), groups=g.n_experts)


BUGS = {  # name -> (symmetry it breaks, rule pattern's end, the wrong axes of a geometry)
    "expert_down_bias_left_behind": ("experts", r"down_proj_bias", lambda g: (None, "resid")),
    "expert_gate_up_bias_left_behind": ("experts", r"gate_up_proj_bias", lambda g: (None, None)),
    "router_bias_not_permuted": ("experts", r"router\.bias", lambda g: (None,)),
    "interleaving_ignored": ("mlp", r"gate_up_proj", lambda g: (None, "resid", Merged(0, interleaving_ignored(g)))),
    "sinks_left_in_place": ("heads", r"sinks", lambda g: (None,)),
}


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_is_caught(bug):
    symmetry, pattern, wrong = BUGS[bug]
    clean = gpt_oss_subject()
    original = clean.trace()
    element = clean.build({symmetry: 12345})
    restored = clean.unscramble(clean.trace(element), element)
    assert max((restored[n] - r.tensor).abs().max().item() for n, r in original.items()) < 1e-12
    buggy = with_rule(gpt_oss_subject(), pattern, wrong(clean.geometry))
    restored = buggy.unscramble(buggy.trace(element), element)
    worst = max(((restored[n] - r.tensor).abs().max() / r.tensor.abs().max()).item() for n, r in original.items())
    assert worst > BROKEN, bug


def test_the_shared_expert_reordered_with_the_routed_ones_is_caught():
    """Qwen2-MoE with a shared expert as wide as a routed one: swapping it with the routed expert that the key puts
    first (a reordering that forgets the shared expert has no router row) changes the function."""
    config = random_config("qwen2_moe")
    config.shared_expert_intermediate_size = config.moe_intermediate_size
    torch.manual_seed(3)
    model = randomize_(hf.Qwen2MoeForCausalLM(config).to(torch.float64), 3).eval()
    use_exact_numerics(model)
    subject = Subject(model, random_inputs("qwen2_moe", model, seed=3))
    original = subject.trace()
    element = subject.build({"experts": 12345})
    params = dict(subject.transformed_params(element))
    i = config.moe_intermediate_size
    for layer in range(config.num_hidden_layers):
        at = f"model.layers.{layer}.mlp."
        gate_up, down = params[at + "experts.gate_up_proj"].clone(), params[at + "experts.down_proj"].clone()
        shared = [params[at + f"shared_expert.{x}_proj.weight"] for x in ("gate", "up", "down")]
        params[at + "shared_expert.gate_proj.weight"] = gate_up[0, :i]
        params[at + "shared_expert.up_proj.weight"] = gate_up[0, i:]
        params[at + "shared_expert.down_proj.weight"] = down[0]
        gate_up[0] = torch.cat(shared[:2])
        down[0] = shared[2]
        params[at + "experts.gate_up_proj"], params[at + "experts.down_proj"] = gate_up, down
    restored = subject.unscramble(subject.trace(element, params=params), element)
    worst = max(((restored[n] - r.tensor).abs().max() / r.tensor.abs().max()).item() for n, r in original.items())
    assert worst > BROKEN
    right = subject.unscramble(subject.trace(element), element)
    assert max((right[n] - r.tensor).abs().max().item() for n, r in original.items()) < 1e-12


# --- scramble: plain transformers reloads the scrambled checkpoint and computes the same logits ---


@pytest.mark.parametrize("family", FAMILIES)
def test_scrambled_checkpoint_reloads_in_plain_transformers(family, tmp_path):
    model = moe_model(family)
    names = ("experts", "mlp", "channels", "heads", "rotation", "router_shift")
    record = save_and_scramble(model, tmp_path, key=5, symmetries=names)
    assert set(record["symmetries"]) == set(names)
    original, scrambled = reloaded_in_transformers(tmp_path)
    ids = random_inputs(family, model, seed=3)["input_ids"]
    with torch.no_grad():
        expected, got = original(ids).logits, scrambled(ids).logits
        router = next(n for n, _ in original.named_parameters() if n.endswith(("mlp.gate.weight", "router.weight")))
        moved = dict(scrambled.named_parameters())[router]
        assert not torch.allclose(moved, dict(original.named_parameters())[router])
        # the stock routers take their softmax in float32: the same logits to float32's rounding
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-5
        moved.copy_(dict(original.named_parameters())[router])  # the router rows put back: a control
        broken = scrambled(ids).logits
    assert ((broken - expected).abs().max() / expected.abs().max()).item() > BROKEN


# --- compare: the experts' order and each expert's neuron order recovered from the weights alone ---


@pytest.mark.parametrize("family", FAMILIES)
def test_compare_recovers_the_experts_and_their_neurons(family):
    import copy

    from perm_core.engine.transforms import composed
    from perm_core.verify.same_function import compare_models

    a = moe_model(family)
    subject = Subject(a)
    key = symmetries.build_many({name: 5 for name in symmetries.WEIGHT_SYMMETRIES}, subject.geometry)
    b = copy.deepcopy(a)
    with torch.no_grad():
        for name, tensor in subject.transformed_params(key).items():
            dict(b.named_parameters())[name].copy_(tensor)
    result = compare_models(a, b, [random_inputs(family, a, seed=3)], "A", "B")
    assert result.verdict == "same function" and result.exit_code == 0 and result.residual < 1e-12
    found = result.recovered.element
    for layer in range(subject.geometry.n_layers):
        for role in ("experts", "expert_mlp"):
            (mine,), (theirs,) = composed(found.spaces[(role, layer)]), composed(key.spaces[(role, layer)])
            assert torch.equal(mine.index, theirs.index), (role, layer)
    summary = result.recovered.summary()
    assert summary["experts"]["of"] == 8 and summary["experts"]["moved"] >= 2
    assert summary["router_shift"] == {"shifted": 2, "of": 2}  # every layer's router translation recovered
    for layer in range(subject.geometry.n_layers):
        (mine,), (theirs,) = found.spaces[("router_shift", layer)], key.spaces[("router_shift", layer)]
        assert (mine.vector - theirs.vector).abs().max() < 1e-12
        # a router bias (gpt-oss's) gives its offset back; without one the key's offset acts on nothing
        assert abs(mine.offset - theirs.offset) < 1e-12 if family == "gpt_oss" else mine.offset == 0
    assert summary["mlp"]["moved"] > summary["mlp"]["of"] // 2
    moved = dict(b.named_parameters())  # a control: one layer's router rows of B rolled by one
    router = next(n for n in moved if n.endswith(("mlp.gate.weight", "router.weight")))
    with torch.no_grad():
        moved[router].copy_(torch.roll(moved[router], 1, 0))
    assert compare_models(a, b, [random_inputs(family, a, seed=3)], "A", "B").verdict != "same function"


def test_the_matrix_row_of_a_mixture_of_experts(capsys):
    from perm_core.verify import matrix

    row = matrix.family_row("olmoe")
    assert row.passed and row.cells["experts"].status == matrix.HOLDS
    assert 0 < row.cells["experts"].max_rel_error < EXACT and row.cells["experts"].controls_broken == 2
    assert {s for s, c in row.cells.items() if c.status == matrix.RESTRICTED} == {"head_channels", "rotation"}
    assert "whole projection" in row.cells["rotation"].reason


# --- the router's translation: router_shift, a symmetry check runs (engine.transforms.Translation), and the same
# translation written by hand here, measured on the stock forward ---


def shifted_routers(params: dict, alone: bool, seed: int = 0) -> dict:
    """One vector added to every router row and one number to every router bias (alone: to the first row only)."""
    generator = torch.Generator().manual_seed(seed)
    out = dict(params)
    for name, weight in params.items():
        if name.endswith(("mlp.gate.weight", "router.weight", "router.bias")):
            shift = (3.0 * torch.randn(weight.shape[1:], generator=generator, dtype=weight.dtype)
                     if weight.dim() == 2 else torch.tensor(2.5, dtype=weight.dtype))
            out[name] = torch.cat([weight[:1] + shift, weight[1:]]) if alone else weight + shift
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_router_translation_keeps_the_function_and_one_row_alone_breaks_it(family):
    from torch.func import functional_call

    model = moe_model(family)
    inputs = random_inputs(family, model, seed=3)
    params = {n: p.detach() for n, p in model.named_parameters()}
    with torch.no_grad():
        base = model(**inputs).logits
        moved = functional_call(model, shifted_routers(params, alone=False), args=(), kwargs=inputs).logits
        alone = functional_call(model, shifted_routers(params, alone=True), args=(), kwargs=inputs).logits
    scale = base.abs().max()
    assert ((moved - base).abs().max() / scale).item() < EXACT  # softmax and top k read only differences
    assert ((alone - base).abs().max() / scale).item() > BROKEN


ROUTER_SHIFT_ROWS = [(family, dtype, far) for family in FAMILIES for dtype, far in
                     ((torch.float64, True), (torch.float32, True), (torch.float64, False))]


@pytest.mark.parametrize("family,dtype,far", ROUTER_SHIFT_ROWS,
                         ids=[f"{f}-{str(d)[6:]}-{'far' if far else 'init'}" for f, d, far in ROUTER_SHIFT_ROWS])
def test_router_shift_holds_both_ways_and_one_row_shifted_breaks(family, dtype, far):
    model = moe_model(family, dtype=dtype, far=far)
    report = check(model, random_inputs(family, model, seed=3), ["router_shift", "experts"], key=21)
    for symmetry in ("router_shift", "experts", "all"):
        assert_symmetry_holds(report, symmetry, dtype)
    shift = {c.direction: c for c in report.checks if c.symmetry == "router_shift"}
    assert "router" in shift["forward"].moved_what or "gate.weight" in shift["forward"].moved_what
    if dtype == torch.float64:
        assert max(c.max_rel_error for c in shift.values()) < EXACT
    control = next(c for c in report.controls if c.symmetry == "router_shift")
    assert control.name == "one_row_shifted" and control.broken and control.max_rel_error > BROKEN
    assert report.passed and report.oracle.passed


def test_router_shift_adds_to_the_router_alone_and_comes_back_off():
    """The element adds one vector to every router row and one number to every bias (gpt-oss), moves nothing else,
    and spec.restore_param takes it back off after the experts' reordering (Explore's un-scrambled weight)."""
    from perm_core.engine.spec import restore_param

    subject = Subject(moe_model("gpt_oss"))
    element = subject.build({"router_shift": 4, "experts": 4})
    shift_only = subject.build({"router_shift": 4})
    moved = subject.transformed_params(shift_only)
    changed = {n for n, p in subject.params.items() if not torch.equal(moved[n], p)}
    assert changed == {f"model.layers.{i}.mlp.router.{w}" for i in (0, 1) for w in ("weight", "bias")}
    weight = subject.params["model.layers.0.mlp.router.weight"]
    step = moved["model.layers.0.mlp.router.weight"] - weight
    assert (step - step[0]).abs().max() < 1e-15 and step[0].abs().max() > 0.05  # the same vector on every row
    bias = moved["model.layers.0.mlp.router.bias"] - subject.params["model.layers.0.mlp.router.bias"]
    assert (bias - bias[0]).abs().max() < 1e-15 and bias[0].abs() > 1e-3
    both = subject.transformed_params(element)
    for name in ("model.layers.1.mlp.router.weight", "model.layers.1.mlp.router.bias"):
        claim = subject.claims[name]
        assert (restore_param(both[name], claim, element) - subject.params[name]).abs().max() < 1e-14
        # the control: the permutations alone undone leave the translation in
        plain = apply_axes(both[name], claim.rule.axes, element.inverse(), claim.layer)
        assert (plain - subject.params[name]).abs().max() > 1e-3
    alone = subject.transformed_params(symmetries.controls("router_shift", 4, subject.geometry)[0].scramble)
    rows = alone["model.layers.0.mlp.router.weight"] - weight
    assert rows[0].abs().max() > 0.05 and rows[1:].abs().max() == 0  # the control: one row shifted


def test_assert_symmetric_on_a_mixture_of_experts():
    from perm_core.testing import assert_symmetric

    model = moe_model("gpt_oss", dtype=torch.float32)
    report = assert_symmetric(model, random_inputs("gpt_oss", model, seed=3), ("experts", "mlp"), key=3,
                              dtype="float64", backward=False)
    assert report.dtype == "float64" and {c.symmetry for c in report.checks} == {"experts", "mlp", "all"}
    dense = build_random_model("llama", seed=3)[0]  # nothing to reorder: said, not passed
    with pytest.raises(VacuousCheckError, match="no mixture-of-experts layers"):
        assert_symmetric(dense, random_inputs("llama", dense, seed=3), "experts", backward=False)


def test_cli_check_of_a_mixture_of_experts_json(capsys):
    from tests.unit.json_schema import validated

    assert main(["check", "random:qwen2_moe", "--symmetry", "experts", "--symmetry", "mlp", "--key", "9",
                 "--dtype", "float64", "--json"]) == 0
    report = validated("check", capsys.readouterr().out)
    assert report["passed"] and report["family"] == "qwen2_moe" and "not_applicable" not in report
    assert {c["name"] for c in report["controls"]} == {"router_not_permuted", "router_alone", "output_not_permuted",
                                                      "expert_down_not_permuted"}
    assert main(["check", "random:gpt2", "--symmetry", "experts", "--symmetry", "mlp", "--json"]) == 0
    report = validated("check", capsys.readouterr().out)
    assert "no mixture-of-experts layers" in report["not_applicable"]["experts"]
    assert {c["symmetry"] for c in report["checks"]} == {"mlp"}


def test_the_streamed_check_of_a_mixture_of_experts_checkpoint(tmp_path, capsys):
    """check --stream reads Mixtral's per-expert tensors into its fused experts one block at a time (the streamed
    path's own tests: test_stream_moe.py): experts and mlp pass at float64 round-off, and their controls break."""
    from tests.unit.json_schema import validated

    moe_model("mixtral").save_pretrained(tmp_path, safe_serialization=True)
    capsys.readouterr()  # the save's own progress bar
    assert main(["check", str(tmp_path), "--stream", "--symmetry", "experts", "--symmetry", "mlp", "--dtype",
                 "float64", "--json"]) == 0
    report = validated("check", capsys.readouterr().out)
    assert report["passed"] and report["family"] == "mixtral" and "streamed" in report
    assert {c["symmetry"] for c in report["checks"]} == {"experts", "mlp", "all"}
    assert all(c["max_rel_error"] < EXACT for c in report["checks"])
    assert {c["name"]: c["broken"] for c in report["controls"]} == {
        "router_not_permuted": True, "router_alone": True, "expert_down_not_permuted": True}
