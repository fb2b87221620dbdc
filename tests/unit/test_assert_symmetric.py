"""perm_core.testing.assert_symmetric as a researcher writes it in their own suite: a BertForSequenceClassification
built by transformers (its own random init), inputs as tensors, their forward hooks on it."""

from __future__ import annotations

import pytest
import torch
import transformers

from perm_core.testing import assert_symmetric

pytestmark = pytest.mark.usefixtures("one_thread")

SEQUENCE = 10


def tiny_bert(trained_looking: bool = False) -> transformers.BertForSequenceClassification:
    """transformers' own init; trained_looking: LayerNorm gains and biases, biases and position rows moved off it."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(config)
    if trained_looking:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith(("LayerNorm.weight", "LayerNorm.bias", ".bias", "position_embeddings.weight")):
                    parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def bert_inputs() -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (1, SEQUENCE), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, -1] = 0  # a padded last position, as a tokenizer's batch has
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def add_after_block(model, layer: int, vector: torch.Tensor):
    """A steering hook: `vector` added to the residual stream that block `layer` outputs."""

    def add(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        moved = hidden + vector
        return (moved, *output[1:]) if isinstance(output, tuple) else moved

    return model.bert.encoder.layer[layer].register_forward_hook(add)


def test_an_hf_initialised_bert_keeps_its_symmetries_and_is_left_as_it_was():
    model = tiny_bert()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = assert_symmetric(model, bert_inputs(), ["channels", "heads", "mlp", "tokens"], key=7,
                              dtype=torch.float64)
    assert report.passed and report.dtype == "float64" and report.model == "BertForSequenceClassification"
    assert {(c.symmetry, c.direction) for c in report.checks} == {
        (s, d) for s in ("channels", "heads", "mlp", "tokens", "all") for d in ("forward", "backward")}
    assert report.oracle.passed and report.oracle.max_rel_error <= 1e-9
    # the caller's model: still float32, still training, still its own attention, its weights untouched
    assert model.training and model.config._attn_implementation == "sdpa"
    assert all(p.dtype == torch.float32 and torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_moved_norms_and_biases_in_float32_as_held():
    report = assert_symmetric(tiny_bert(trained_looking=True), bert_inputs(), "channels", key=3)
    assert report.dtype == "float32" and [c.passed for c in report.checks] == [True, True]


def test_a_hook_that_follows_the_dtype_and_keeps_the_symmetry_passes():
    """The hook is part of the function checked: a vector the permutation moves with the channels (its mean over
    them, the same in every channel) is a symmetric edit."""
    model = tiny_bert(trained_looking=True)
    add_after_block(model, 1, torch.full((32,), 0.5))
    assert_symmetric(model, bert_inputs(), ["channels"], key=3, dtype="float64")


def test_a_steering_vector_after_block_1_breaks_channels_and_is_named_at_block_1():
    """The negative control that must fail: a fixed vector does not move with the permuted channels."""
    model = tiny_bert(trained_looking=True)
    add_after_block(model, 1, torch.randn(32, generator=torch.Generator().manual_seed(2)))
    with pytest.raises(AssertionError) as raised:
        assert_symmetric(model, bert_inputs(), ["channels"], key=3, dtype=torch.float64)
    message = str(raised.value)
    rows = {line.split()[1]: line.split() for line in message.splitlines() if line.startswith("channels ")}
    assert rows["forward"][2] == "blocks.1.hidden"  # the first tensor the hook changes, in forward order
    assert rows["backward"][2].startswith("grad.")
    assert float(rows["forward"][3]) > 1e3  # err/tol: far over the float64 tolerance
    assert "worst error over tolerance by place" in message and "block 1 " in message


def test_a_float64_hook_on_a_float32_check_is_one_clear_assertion():
    model = tiny_bert()
    add_after_block(model, 1, torch.randn(32, dtype=torch.float64))
    with pytest.raises(AssertionError) as raised:
        assert_symmetric(model, bert_inputs(), ["channels"], key=3)
    message = str(raised.value)
    assert message.startswith("BertForSequenceClassification cannot be checked in float32: ")
    assert "forward hook" in message and "vector.to(hidden.dtype)" in message and "\n" not in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_symmetry_name_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="unknown symmetry 'channel'"):
        assert_symmetric(tiny_bert(), bert_inputs(), ["channel"])
    with pytest.raises(ValueError, match="float32 or float64"):
        assert_symmetric(tiny_bert(), bert_inputs(), ["channels"], dtype=torch.float16)


def test_a_symmetry_the_architecture_lacks_fails_with_its_reason():
    """T5's relative position bias reads the token order: the check reports tokens as not holding (a passing
    report), and the assertion, which claims the symmetry, fails with the reason and the measured break."""
    from perm_core.models.random_models import build_random_model, random_inputs

    model, _ = build_random_model("t5", dtype=torch.float64, seed=3)
    with pytest.raises(AssertionError) as raised:
        assert_symmetric(model, random_inputs("t5", model, seed=3), ["tokens"], backward=False)
    message = str(raised.value)
    assert "tokens is not a symmetry of t5: The relative position bias" in message
    assert float(message.split("(measured break ")[1].split(")")[0]) > 1e-2


def test_the_table_names_a_control_that_did_not_break_and_a_disagreeing_oracle():
    from perm_core.testing import failure_table
    from perm_core.verify.oracle import OracleResult
    from perm_core.verify.results import ControlResult, Report

    report = Report("mine", "bert", "float64", {"channels": 3},
                    controls=[ControlResult("channels", "residual_rotation", "", False, 2e-16)],
                    oracle=OracleResult("output.logits", 3e-2, 1e-9, "sdpa"))
    lines = failure_table(report).splitlines()
    assert lines[0] == "mine (bert, float64) is not symmetric as asserted (keys channels=3)"
    assert "    channels: residual_rotation  max rel err 2.00e-16" in lines
    assert any(line.startswith("oracle: the traced run's output.logits is 3.00e-02") for line in lines)
    assert "no check was run" in lines
