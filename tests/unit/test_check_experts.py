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
