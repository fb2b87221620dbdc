"""AppTest: the Check page on a mixture of experts names, per tensor, the expert that holds each expert tensor's error
(the gradients of the fused expert weights and of the router rows) and how many experts are over tolerance; a dense
model's table has no such columns."""

import torch

from perm_core.models.input_spec import inputs_from_spec
from perm_core.models.registry import load_model
from perm_core.verify.check import check
from perm_core.verify.expert_blocks import block_notes
from tests.app.test_check import check_page, run_button


def backward_table(at):
    box = next(s for s in at.selectbox if s.label == "Check")
    box.set_value(next(i for i, label in enumerate(box.options) if label.endswith("/ backward"))).run()
    return next(df.value for df in at.dataframe if "tensor" in df.value.columns)


def test_mixtral_names_each_expert_tensors_worst_expert():
    at = check_page(model="random:mixtral", dtype="float64", on_experts="1", k_experts="7", on_tokens="0",
                    on_channels="0")
    run_button(at).click().run()
    assert at.success and at.success[0].value.startswith("PASSED")
    table = backward_table(at)
    fused = table[table["worst expert"].notna()]
    # the router rows, gate_up_proj and down_proj of each of the two blocks
    assert sorted(fused["tensor"]) == sorted(f"grad.param.model.layers.{layer}.mlp.{name}" for layer in (0, 1)
                                             for name in ("gate.weight", "experts.gate_up_proj", "experts.down_proj"))
    assert (fused["experts over tolerance"] == "0 of 4").all()
    # the same check from the command the page gives (its input spec), through the library: the same worst experts
    spec = at.code[0].value.split("--input ")[1].split()[0]
    loaded = load_model("random:mixtral", dtype=torch.float64)
    report = check(loaded.model, inputs_from_spec(loaded, spec), ["experts"], key={"experts": 7})
    expected = {t.name: t.worst_expert for t in report.checks[1].tensors if t.expert_errors}
    assert dict(zip(fused["tensor"], fused["worst expert"].astype(int), strict=True)) == expected
    # each negative control of the experts says where in the experts it broke, as the library's report does
    controls = at.table[0].value
    shown = dict(zip(controls["control"], controls["where in the experts"], strict=True))
    said = {f"{c.symmetry}: {c.description}": " ".join(block_notes(c.experts, most=1)) for c in report.controls}
    assert shown == said
    assert "all 4 exact" in shown["experts: experts reordered, their router rows and biases not"]


def test_a_dense_models_table_has_no_expert_columns():
    at = check_page(model="random:gpt2", dtype="float64", on_tokens="0", on_channels="1")
    run_button(at).click().run()
    assert "worst expert" not in backward_table(at).columns
