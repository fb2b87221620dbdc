"""A NaN or an infinity is a break at the place it first appears: first_break names that tensor and stages give its
place a margin of inf, whether it sits at the first place of the run or a later one, with finite failures before or
after it; and through the whole-model check, a report that fails, names it, and stays strict JSON."""

from __future__ import annotations

import math

import pytest
import torch

from perm_core.cli import print_json
from perm_core.cli.check import format_report
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.verify.check import check
from perm_core.verify.first_break import first_break, stages
from perm_core.verify.tolerances import TensorError, tensor_errors
from tests.unit.json_schema import validated

pytestmark = pytest.mark.usefixtures("one_thread")
BAD = [math.nan, math.inf, -math.inf]
# A forward run's tensors in the order it computes them, and each one's place
FORWARD = {"embed": "embeddings", "blocks.0.attn": "block 0", "blocks.0.hidden": "block 0",
           "blocks.1.attn": "block 1", "blocks.1.hidden": "block 1", "output.logits": "output"}
# A backward run's: the head's parameters first, the embedding table last
BACKWARD = {"grad.param.head.weight": "head", "grad.blocks.1.hidden": "block 1", "grad.param.h.0.w": "block 0",
            "grad.blocks.0.hidden": "block 0", "grad.input": "input", "grad.param.wte.weight": "embeddings"}
WHERE = {"n_layers": 2, "parameter_layers": {"head.weight": None, "h.0.w": 0, "wte.weight": None},
         "embedding_parameters": frozenset({"wte.weight"})}


def errors_with(names: dict, bad: dict[str, float], off: dict[str, float] | None = None, in_original: bool = False):
    """Errors of a run whose tensors are exact but for `bad` (name -> a value put in one entry) and `off` (name -> a
    finite relative error); listed in reverse, so that only the places can order them."""
    generator = torch.Generator().manual_seed(0)
    original = {n: torch.randn(4, 3, generator=generator, dtype=torch.float64) for n in reversed(names)}
    restored = {n: t.clone() for n, t in original.items()}
    for name, value in bad.items():
        (original if in_original else restored)[name][1, 2] = value
    for name, relative in (off or {}).items():
        restored[name][0, 0] += relative * original[name].abs().max()
    return tensor_errors(original, restored)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("names", [FORWARD, BACKWARD], ids=["forward", "backward"])
@pytest.mark.parametrize("in_original", [False, True], ids=["restored", "original"])
def test_a_non_finite_tensor_is_the_first_break_at_its_place(bad, names, in_original):
    order = list(names)
    for i, name in enumerate(order):
        errors = errors_with(names, {name: bad}, in_original=in_original)
        assert first_break(errors, **WHERE) == name
        found = stages(errors, **WHERE)
        assert [s.where for s in found] == list(dict.fromkeys(names.values()))  # every place, in run order
        assert {s.where: s.error_over_tolerance for s in found}[names[name]] == math.inf
        assert next(s for s in found if s.where == names[name]).worst_tensor == name
        assert all(s.error_over_tolerance < 1e-3 for s in found if s.where != names[name])
        later, earlier = order[i + 1:], order[:i]
        if later:  # a finite failure after it does not take its place
            assert first_break(errors_with(names, {name: bad}, {later[-1]: 0.1}, in_original), **WHERE) == name
        if earlier:  # the other side: one before it is the first break
            assert first_break(errors_with(names, {name: bad}, {earlier[0]: 0.1}, in_original), **WHERE) == earlier[0]


def test_a_nan_margin_counts_as_inf_and_is_the_worst_of_its_place():
    errors = [TensorError("blocks.0.attn", 1.0, 1e6, 1e-9),  # far over, but finite
              TensorError("blocks.0.hidden", math.nan, math.nan, 1e-9),  # a NaN error however it came
              TensorError("blocks.1.hidden", 0.0, 0.0, 0.0)]  # no tolerance at all: nothing passes it
    found = {s.where: s for s in stages(errors, n_layers=2)}
    assert (found["block 0"].error_over_tolerance, found["block 0"].worst_tensor) == (math.inf, "blocks.0.hidden")
    assert found["block 1"].error_over_tolerance == math.inf
    assert first_break(errors, n_layers=2) == "blocks.0.attn"
    assert first_break(errors[1:], n_layers=2) == "blocks.0.hidden"
    assert first_break([TensorError("embed", 0.0, 0.0, 1e-9, finite=False)], n_layers=2) == "embed"


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("where", ["embed", "blocks.1.hidden"])
def test_a_non_finite_model_fails_the_check_and_its_report_names_the_tensor(bad, where, capsys):
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=5)
    inputs = random_inputs("gpt2", model, seed=5)
    assert model.config.n_layer == 2
    with torch.no_grad():
        if where == "embed":  # one input token's row of the table
            model.transformer.wte.weight[inputs["input_ids"][0, 3]] = bad
        else:  # the last block's MLP output projection
            model.transformer.h[1].mlp.c_proj.weight[0, 0] = bad
    report = check(model, inputs, ["channels"], key=3)
    forward, backward = report.checks
    assert not report.passed and not forward.passed and not backward.passed
    assert forward.first_break == where and where in forward.non_finite and where in forward.note
    assert "non-finite" in forward.note and forward.max_rel_error == math.inf
    margins = {s.where: s.error_over_tolerance for s in forward.stages}
    assert margins["block 1"] == margins["output"] == math.inf
    assert (margins["embeddings"] == math.inf) == (where == "embed")
    assert not report.oracle.passed and report.oracle.max_rel_error == math.inf
    print_json(report.to_json())  # what `check --json` prints
    for payload in (validated("check", report.to_json()), validated("check", capsys.readouterr().out)):
        assert payload["passed"] is False and payload["oracle"]["passed"] is False
        assert payload["oracle"]["max_rel_error"] == "inf"
        first = payload["checks"][0]
        assert first["first_break"] == where and first["passed"] is False and where in first["non_finite"]
        assert {s["where"]: s["error_over_tolerance"] for s in first["stages"]}["block 1"] == "inf"
    text = format_report(report)
    assert f"first breaks at {where}" in text and "non-finite" in text and text.endswith("FAILED")
