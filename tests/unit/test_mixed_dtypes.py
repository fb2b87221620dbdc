"""A researcher's model as they hold it, with their own forward hooks: a hook whose tensor keeps float64 while the
check runs the model in float32 (its round-off rerun) ends in one clear sentence, not a stack of modeling frames;
a hook that follows the activations' dtype is checked like any other part of the forward."""

from __future__ import annotations

import pytest
import torch

from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.run.trace import MixedDtypeError
from perm_core.verify.check import check

pytestmark = pytest.mark.usefixtures("one_thread")


def steered_bert(follows_dtype: bool):
    """A float64 BERT whose block 1 adds a fixed float64 vector to the residual stream (a steering vector)."""
    model, _ = build_random_model("bert", dtype=torch.float64, seed=1)
    steer = torch.randn(model.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def add(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        moved = hidden + (steer.to(hidden.dtype) if follows_dtype else steer)
        return (moved, *output[1:]) if isinstance(output, tuple) else moved

    model.bert.encoder.layer[1].register_forward_hook(add)
    return model, random_inputs("bert", model, seed=1)


def test_a_hook_that_keeps_float64_in_the_float32_rerun_is_one_clear_sentence():
    model, inputs = steered_bert(follows_dtype=False)
    with pytest.raises(MixedDtypeError) as raised:
        check(model, inputs, ["channels"], key=1)
    message = str(raised.value)
    assert "parameters in float32" in message and "forward hook" in message and "same dtype" in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # torch's stack is not chained on


def test_a_hook_that_follows_the_dtype_is_checked_and_its_fixed_vector_breaks_the_channels_symmetry():
    """The control: the same hook, cast with the activations, runs; a vector the channel permutation does not move
    breaks the symmetry at the block it is added in, not before."""
    model, inputs = steered_bert(follows_dtype=True)
    report = check(model, inputs, ["channels"], key=1)
    forward = report.checks[0]
    assert not report.passed and not forward.passed
    assert forward.first_break == "blocks.1.hidden"


def test_an_error_that_is_not_about_dtypes_is_left_as_it_is():
    model, inputs = steered_bert(follows_dtype=True)

    def fail(module, args, output):
        raise RuntimeError("the researcher's hook failed")

    model.bert.encoder.layer[0].register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="the researcher's hook failed"):
        check(model, inputs, ["channels"], key=1)
