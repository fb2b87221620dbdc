"""Bugs planted in the streamed path itself (not in a family's rules), each caught by the one driver's agreement with
the whole-model check: the same verdicts and first break, and the streamed original run's records equal to the
whole-model trace's. Planted: a forgotten bias (block 1's element stage leaves a per-channel parameter unmoved), a
block index off by one (block 1's stage run on block 0's input) and a stage boundary moved (GPT-2's
final norm run as the head's first step instead of at the end of the last block). The negative control: the clean
checkpoint agrees on every count."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from perm_core.stream import reverse
from perm_core.stream.check import stream_check
from perm_core.stream.encoder_decoder import streamed_model
from perm_core.stream.forward import forward_pass
from perm_core.verify.check import check
from perm_core.verify.subject import Subject
from tests.unit import test_stream, test_stream_t5

pytestmark = pytest.mark.usefixtures("one_thread")


def saved(family: str, tmp_path):
    """A random three-block checkpoint (T5: three blocks a stack) and the model in float64 with its input."""
    if family == "t5":
        return test_stream_t5.saved(tmp_path, seed=3, num_layers=3, num_decoder_layers=3)
    return test_stream.saved(family, tmp_path, seed=3, num_hidden_layers=3)


def disagreements(model, inputs, directory) -> list[str]:
    """Where the streamed check and its original run differ from the whole-model check's (empty: they agree)."""
    whole, streamed = check(model, inputs, ["channels"], key=4), stream_check(directory, inputs, ["channels"], key=4)
    found = []
    for mine, theirs in zip(streamed.checks, whole.checks, strict=True):
        if (mine.passed, mine.first_break) != (theirs.passed, theirs.first_break):
            found.append(f"{mine.direction}: streamed {mine.passed} at {mine.first_break!r}, whole "
                         f"{theirs.passed} at {theirs.first_break!r}")
    records = forward_pass(streamed_model(directory, torch.float64), inputs, stock=False)[0].records
    traced = Subject(model, inputs).trace()
    found += [f"record {name}" for name, tensor in records.items()
              if not (tensor - traced[name].tensor).abs().max() <= 1e-12 * traced[name].tensor.abs().max()]
    return found


def forget_bias(monkeypatch, family: str) -> None:
    """Block 1's element stage leaves a per-channel parameter as stored: GPT-2's MLP output bias, T5's first norm."""
    tag = "norm" if family == "t5" else "mlp.out"
    real = reverse.transform_param
    monkeypatch.setattr(reverse, "transform_param", lambda w, claim, scramble: w if (
        claim.layer == 1 and claim.rule.tag == tag and w.dim() == 1) else real(w, claim, scramble))


def shift_block_inputs(monkeypatch, family: str) -> None:
    """Block 1's stage given block 0's input (T5's block 1 is its encoder's)."""
    real = reverse.BlockStage.__init__

    def stage(self, model, layer, run, *args):
        inputs = run.block_inputs
        real(self, model, layer, dataclasses.replace(run, block_inputs=[inputs[0], inputs[0], *inputs[2:]]), *args)
    monkeypatch.setattr(reverse.BlockStage, "__init__", stage)


def move_final_norm_into_the_head(monkeypatch, family: str) -> None:
    """GPT-2's final norm declared as the head's first step: the last block's stage ends before it."""
    from perm_core.families import gpt2

    stages = tuple(dataclasses.replace(s, norm_opens_head=not s.norm_opens_head) for s in gpt2.FAMILY.stages)
    monkeypatch.setattr(gpt2, "FAMILY", dataclasses.replace(gpt2.FAMILY, stages=stages))


# bug -> (how it is planted, the families it is planted in, what shows it: a check's first break or a record)
PLANTED = {
    "forgotten bias": (forget_bias, ["gpt2", "t5"], "forward: streamed False at 'blocks.1."),
    "block index off by one": (shift_block_inputs, ["gpt2", "t5"], "forward: streamed False at 'blocks.1."),
    "stage boundary moved": (move_final_norm_into_the_head, ["gpt2"], "record blocks.2.hidden"),
}
CASES = [(bug, family) for bug, (_, families, _) in PLANTED.items() for family in families]


@pytest.mark.parametrize("bug, family", CASES)
def test_a_bug_planted_in_the_streamed_path_is_caught_by_the_agreement(bug, family, monkeypatch, tmp_path):
    model, inputs, directory = saved(family, tmp_path)
    assert disagreements(model, inputs, directory) == []  # the control: the clean path agrees on every count
    plant, _, shown = PLANTED[bug]
    plant(monkeypatch, family)
    found = disagreements(model, inputs, directory)
    assert any(f.startswith(shown) for f in found), found
