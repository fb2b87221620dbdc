"""Check names the experts (issue 48, item 5): a failing check of a mixture of experts says, block by block, which
experts compute another function after un-scrambling (each run on every token of its block's input) and how many
tokens chose other experts; the first such block is where the break began. A break planted in one expert of block 0
is named there, alone; experts reordered without their router rows leave every expert of block 0 exact and reroute
its tokens. Every gradient whose axis 0 is the experts carries its error per expert, the largest equal to the
tensor's own. Float64, random:FAMILY models far from init."""

import pytest
import torch

from perm_core.cli.check import format_report
from perm_core.engine import moe, symmetries
from perm_core.engine.spec import Scramble
from perm_core.engine.transforms import Permutation
from perm_core.families import geometry_of
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify import expert_blocks
from perm_core.verify.check import check, check_scramble
from perm_core.verify.results import Report
from perm_core.verify.subject import Subject
from tests.unit.json_schema import validated

pytestmark = pytest.mark.usefixtures("one_thread")


def subject_of(family: str) -> Subject:
    model = build_random_model(family, dtype=torch.float64, seed=3)[0]
    return Subject(model, random_inputs(family, model, seed=3))


def one_expert_broken(subject: Subject, expert: int, layer: int = 0) -> Scramble:
    """The planted bug: one expert's neurons reversed in gate|up but not in down, every other expert untouched."""
    g = subject.geometry
    index = torch.arange(g.n_experts * g.d_expert)
    neurons = slice(expert * g.d_expert, (expert + 1) * g.d_expert)
    index[neurons] = index[neurons].flip(0)
    return Scramble({("expert_mlp", layer): (Permutation(index),)}).with_controls(skip_tags=frozenset({"experts.down"}))


@pytest.mark.parametrize(("family", "expert"), [("mixtral", 1), ("gpt_oss", 2)])
def test_a_break_planted_in_one_expert_is_named_in_its_block(family, expert):
    subject = subject_of(family)
    results = check_scramble(subject, one_expert_broken(subject, expert), "mlp", subject.trace(backward=True))
    assert not any(r.passed for r in results)
    for result in results:
        first, later = result.experts
        assert (first.layer, first.experts_over_tolerance, first.tokens_rerouted) == (0, [expert], 0)
        assert first.expert_errors[expert] > 0.5 and max(
            e for i, e in enumerate(first.expert_errors) if i != expert) <= 1e-12
        assert later.layer == 1 and len(later.experts_over_tolerance) == 4  # its input broke: every expert differs
    report = Report("planted", family, "float64", {}, checks=results)
    text = format_report(report)
    assert f"block 0's experts, each on every token: 1 of 4 differ, expert {expert} (" in text
    assert "0 of 12 tokens chose other experts" in text
    validated("check", report.to_json())


def test_experts_reordered_without_their_router_rows_leave_every_expert_exact_and_reroute():
    """The control router_not_permuted: block 0's experts each compute the original's function; its tokens go to
    other experts."""
    subject = subject_of("mixtral")
    control = next(c for c in symmetries.controls("experts", 7, subject.geometry, subject.n_tokens)
                   if c.name == "router_not_permuted")
    forward = check_scramble(subject, control.scramble, "experts", subject.trace(), backward=False)[0]
    first = forward.experts[0]
    assert first.layer == 0 and first.experts_over_tolerance == [] and max(first.expert_errors) <= 1e-12
    assert first.tokens_rerouted > 0
    assert f"all 4 exact; {first.tokens_rerouted} of 12 tokens chose other experts" in format_report(
        Report("control", "mixtral", "float64", {}, checks=[forward]))


def test_a_passing_check_names_each_experts_gradient_error_and_needs_no_diagnosis():
    subject = subject_of("gpt_oss")
    results = check_scramble(subject, symmetries.build("experts", 7, subject.geometry, subject.n_tokens), "experts",
                             subject.trace(backward=True))
    assert all(r.passed and r.experts == [] for r in results)
    forward, backward = results
    assert all(t.expert_errors is None for t in forward.tensors)
    fused = [t for t in backward.tensors if t.expert_errors is not None]
    # router weight and bias, gate_up and down with their biases, in each of two blocks
    assert len(fused) == 12 and all(len(t.expert_errors) == 4 for t in fused)
    for tensor in fused:
        assert max(tensor.expert_errors) == tensor.max_rel_error  # the per-expert split of the same measurement
        assert tensor.expert_errors[tensor.worst_expert] == tensor.max_rel_error
        assert tensor.experts_over_tolerance == 0
    entry = next(t for t in validated("check", Report("x", "gpt_oss", "float64", {}, checks=results).to_json()
                                      )["checks"][1]["tensors"] if "expert_errors" in t)
    assert entry["worst_expert"] == max(range(4), key=entry["expert_errors"].__getitem__)


def test_a_dense_model_has_no_expert_errors():
    model = build_random_model("llama", dtype=torch.float64, seed=3)[0]
    report = check(model, random_inputs("llama", model, seed=3), symmetry_names=["mlp"], key=5,
                   include_combined=False)
    assert report.passed
    assert all(t.expert_errors is None for c in report.checks for t in c.tensors)
    document = validated("check", report.to_json())
    assert not any("expert_errors" in t for c in document["checks"] for t in c["tensors"])
    assert not any("experts" in c for c in document["checks"])


def test_each_broken_control_of_the_experts_says_where_in_the_experts_it_broke():
    """The report's controls of the experts and of the router's translation, on gpt-oss: the router's own breaks
    (experts reordered without their router rows, one router row shifted alone) leave every expert of block 0 exact
    and reroute tokens; router rows reordered alone change exactly the experts the key moves."""
    model = build_random_model("gpt_oss", dtype=torch.float64, seed=3)[0]
    report = check(model, random_inputs("gpt_oss", model, seed=3), ["experts", "router_shift"], key=12345,
                   backward=False, include_combined=False)
    assert report.passed
    first = {c.name: c.experts[0] for c in report.controls}
    assert set(first) == {"router_not_permuted", "router_alone", "one_row_shifted"}
    for name in ("router_not_permuted", "one_row_shifted"):
        assert first[name].layer == 0 and first[name].experts_over_tolerance == [] and first[name].tokens_rerouted
    order = moe.expert_order(12345, geometry_of(model), 0).tolist()
    assert first["router_alone"].experts_over_tolerance == [e for e in range(4) if order[e] != e] != []
    assert first["router_alone"].tokens_rerouted == 0
    text = format_report(report)
    assert "block 0's experts, each on every token: all 4 exact; " in text
    assert validated("check", report.to_json())["controls"][0]["experts"][0]["layer"] == 0


def test_errors_per_expert_are_each_experts_own_slice():
    """verify.experts.per_expert on a tensor whose expert 2 alone differs, by a known amount: only expert 2's error
    is above zero, and it is that amount over the tensor's scale (a max over another axis would spread it)."""
    from perm_core.verify.experts import per_expert

    reference = torch.arange(4 * 3 * 5, dtype=torch.float64).reshape(4, 3, 5) / 10
    restored = reference.clone()
    restored[2, 1, 3] += 0.25
    errors = per_expert(reference, restored, scale=5.0)
    assert errors == pytest.approx((0.0, 0.0, 0.05, 0.0), abs=1e-15)


def test_the_streamed_tally_keeps_each_experts_largest_difference_over_its_pieces():
    """stream.tally.Tally with one expert tensor compared in two pieces: each expert keeps the larger of its two
    differences, the first piece's where the second is exact (a tally that kept only the last piece would lose it);
    a NaN in one expert is that expert's infinite error alone."""
    import math

    from perm_core.stream.tally import Tally

    tally = Tally(frozenset({"grad.param.x"}))
    reference = torch.zeros(3, 2, dtype=torch.float64)
    first, second = reference.clone(), reference.clone()
    first[0, 1], first[2, 0], second[2, 1] = 0.5, 0.1, 0.3
    tally.add("grad.param.x", reference, first)
    tally.add("grad.param.x", reference, second)
    assert tally.expert_errors({"grad.param.x": 2.0})["grad.param.x"] == pytest.approx((0.25, 0.0, 0.15))
    broken = reference.clone()
    broken[1, 0] = math.nan
    tally.add("grad.param.x", reference, broken)
    errors = tally.expert_errors({"grad.param.x": 2.0})["grad.param.x"]
    assert errors[1] == math.inf and errors[0] == pytest.approx(0.25) and errors[2] == pytest.approx(0.15)
    plain = Tally()  # a tally told of no expert tensor splits nothing
    plain.add("grad.param.x", reference, first)
    assert plain.expert_errors({"grad.param.x": 2.0}) == {}


def test_a_broken_expert_is_named_by_its_original_number_when_the_experts_are_also_reordered():
    """Block 0's experts reordered by the experts key (scrambled expert e is original expert order[e]), then the
    expert at a scrambled place the key filled from elsewhere broken in the weights (its gate rows reversed, its up
    rows not): the diagnosis names it by its original number, not by the place the key moved it to."""
    subject = subject_of("mixtral")
    g = subject.geometry
    scramble = symmetries.build("experts", 7, g, subject.n_tokens)
    order = moe.expert_order(7, g, 0).tolist()
    place = next(p for p, e in enumerate(order) if p != e)
    params = dict(subject.transformed_params(scramble))
    name = "model.layers.0.mlp.experts.gate_up_proj"  # [experts, gate | up, d_model]
    fused = params[name].clone()
    fused[place, :g.d_expert] = fused[place, :g.d_expert].flip(0)
    params[name] = fused
    first = expert_blocks.diagnose(subject, scramble, params, subject.tolerance)[0]
    broken = order[place]
    assert first.layer == 0 and first.experts_over_tolerance == [broken] != [place] and first.tokens_rerouted == 0
    assert first.expert_errors[broken] > 0.1
    assert max(e for i, e in enumerate(first.expert_errors) if i != broken) <= 1e-12
    clean = expert_blocks.diagnose(subject, scramble, subject.transformed_params(scramble), subject.tolerance)[0]
    assert clean.experts_over_tolerance == [] and clean.tokens_rerouted == 0  # the control: unbroken, none named


def test_float32_round_off_in_exact_experts_is_not_a_broken_expert():
    """In float32 a true symmetry's experts differ by round-off (above zero, far below the tolerance): the diagnosis
    counts none of them as broken, and one tolerance below their round-off counts them all."""
    model = build_random_model("mixtral", dtype=torch.float32, seed=3)[0]
    subject = Subject(model, random_inputs("mixtral", model, seed=3))
    # channels moved too: every block's experts add in another order (reordered alone, block 0's are bit exact)
    scramble = symmetries.build_many({"experts": 7, "channels": 2}, subject.geometry, subject.n_tokens)
    blocks = expert_blocks.diagnose(subject, scramble, subject.transformed_params(scramble), subject.tolerance)
    errors = [e for block in blocks for e in block.expert_errors]
    assert 0 < min(errors) and max(errors) < subject.tolerance / 10
    assert all(block.experts_over_tolerance == [] and block.tokens_rerouted == 0 for block in blocks)
    below = expert_blocks.diagnose(subject, scramble, subject.transformed_params(scramble), min(errors) / 2)
    assert all(len(block.experts_over_tolerance) == subject.geometry.n_experts for block in below)
