"""A NaN or an infinity through the layer-streamed check's report: a checkpoint with a non-finite weight fails,
names the first tensor it reaches in forward order, and its JSON stays strict (what `check --stream --json` prints),
as the whole-model check's does (test_non_finite_places.py)."""

from __future__ import annotations

import math

import pytest

from perm_core.cli import print_json
from perm_core.stream.check import stream_check
from tests.unit.json_schema import validated
from tests.unit.test_stream import saved

pytestmark = pytest.mark.usefixtures("one_thread")

BAD = [math.nan, math.inf, -math.inf]


def poisoned(where: str, bad: float):
    """A tweak for saved(): one weight of GPT-2's (two blocks) set to `bad`."""
    def tweak(model):
        if where == "blocks.1.hidden":  # the last block's MLP output projection
            model.transformer.h[1].mlp.c_proj.weight[0, 0] = bad
        else:  # every token's position row: the embedding's output
            model.transformer.wpe.weight[:, 0] = bad
    return tweak


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["embed", "blocks.1.hidden"])
def test_a_non_finite_checkpoint_fails_the_streamed_check_naming_the_tensor(where, bad, tmp_path, capsys):
    _, inputs, directory = saved("gpt2", tmp_path, tweak=poisoned(where, bad))
    report = stream_check(directory, inputs, ["channels"], key=3)
    forward, backward = report.checks
    assert not report.passed and not forward.passed and not backward.passed
    assert forward.first_break == where and where in forward.non_finite and "non-finite" in forward.note
    assert forward.max_rel_error == math.inf
    margins = {s.where: s.error_over_tolerance for s in forward.stages}
    assert margins["block 1"] == math.inf and (margins["embeddings"] == math.inf) == (where == "embed")
    assert not report.oracle.passed and report.oracle.max_rel_error == math.inf
    print_json(report.to_json())
    for payload in (validated("check", report.to_json()), validated("check", capsys.readouterr().out)):
        assert payload["passed"] is False and payload["oracle"]["max_rel_error"] == "inf"
        first = payload["checks"][0]
        assert first["first_break"] == where and where in first["non_finite"]


VOCAB = 300  # Llama's untied head in 3 or more vocabulary chunks (test_stream_edges.py)


@pytest.mark.parametrize("bad", BAD, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("row", [0, VOCAB - 1], ids=["first chunk", "last chunk"])
def test_a_non_finite_row_in_one_head_chunk_fails_whichever_chunk_it_is_in(row, bad, tmp_path):
    """The head's logits are tallied chunk by chunk: a non-finite chunk, first or last, is not outweighed by the
    finite ones on either side of it."""
    def tweak(model):
        model.lm_head.weight[row, 0] = bad

    _, inputs, directory = saved("llama", tmp_path, seed=3, tweak=tweak, num_hidden_layers=2, vocab_size=VOCAB)
    report = stream_check(directory, inputs, ["channels"], key=4)
    forward = report.checks[0]
    assert report.head_chunks >= 3 and not report.passed and not forward.passed
    assert forward.first_break == "output.logits" and "output.logits" in forward.non_finite
    assert {s.where: s.error_over_tolerance for s in forward.stages}["output"] == math.inf


def test_the_same_checkpoint_finite_passes(tmp_path):
    """The control: the same model and input without the poisoned weight."""
    _, inputs, directory = saved("gpt2", tmp_path)
    report = stream_check(directory, inputs, ["channels"], key=3)
    assert report.passed and all(c.first_break == "" and not c.non_finite for c in report.checks)
    assert report.oracle.passed and math.isfinite(report.oracle.max_rel_error)
