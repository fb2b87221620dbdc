"""The round-off allowances of the streamed check's embedding and head stages (stream.allowance, stream.head,
stream.reverse.embedding_stage; an encoder-decoder's embedding too): a stage ill-conditioned by a large offset under
a norm is rerun in the other dtype and judged with its measured round-off, as the whole-model check judges the whole
run; without the allowance (the negative control) exactly the tensors over the base tolerance fail; a real break in
that stage still fails there."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from perm_core.engine.spec import Rule
from perm_core.stream.check import stream_check
from perm_core.verify.check import check
from tests.unit.symmetry_asserts import by_name
from tests.unit.test_stream import plant, saved

BASE, CAP = 1e-9, 1e-6


def _offset(path: str, offset: float):
    """A tweak for saved(): the model in float64 (a float32 checkpoint rounds an offset's small parts away), the
    parameter at `path` shifted by `offset` on every channel: the norm after it subtracts a mean of that size, its
    float64 round-off past 1e-9 relative, its float32 round-off O(1) (capped)."""
    def tweak(model):
        model.double()
        model.get_parameter(path).add_(offset)
    return tweak


# stage -> (the parameter shifted, the offset, a planted bug in that stage: its rule, its first break, the gradient
# it breaks)
STAGES = {
    "the embedding": ("bert.embeddings.token_type_embeddings.weight", 2e7,
                      Rule(r"(?:bert\.)?embeddings\.LayerNorm\.bias", (None,), "norm"), "embed",
                      "grad.param.bert.embeddings.LayerNorm.bias"),
    "the head": ("cls.predictions.transform.dense.bias", 1e7,
                 Rule(r"cls\.predictions\.transform\.LayerNorm\.bias", (None,), "norm"), "output.logits",
                 "grad.param.cls.predictions.transform.LayerNorm.bias"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    found = {}
    for stage, (path, offset, *_) in STAGES.items():
        found[stage] = saved("bert", tmp_path_factory.mktemp(stage.split()[1]), num_hidden_layers=2,
                             tweak=_offset(path, offset))
    return found


def _over(report) -> dict[str, float]:
    return {t.name: t.tolerance for c in report.checks for t in c.tensors if t.finite and t.max_rel_error > BASE}


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_ill_conditioned_embedding_or_head_is_judged_with_its_measured_round_off(stage, checkpoints, monkeypatch):
    from perm_core.stream.allowance import Allowances

    model, inputs, directory = checkpoints[stage]
    whole = check(model, inputs, ["channels"])
    streamed = stream_check(directory, inputs, ["channels"])
    assert whole.passed and streamed.passed
    for mine, theirs in zip(streamed.checks, whole.checks, strict=True):
        assert {n: t.passed for n, t in by_name(mine).items()} == {n: t.passed for n, t in by_name(theirs).items()}
    [used] = streamed.allowances  # only this stage needed one
    over = _over(streamed)
    assert used["stage"] == stage and used["measured"][0] == "original"
    assert set(used["over_base_tolerance"]) == set(over)
    # each such tensor got its stage's measured allowance, as the whole-model check gave it the run's
    assert over and all(BASE < tolerance <= CAP for tolerance in over.values())
    theirs = {t.name: t for c in whole.checks for t in c.tensors}
    assert all(theirs[name].passed and theirs[name].tolerance > BASE for name in over)
    assert any(note.startswith(f"{stage}:") for note in streamed.notes)
    assert not any("fails here" in note for note in streamed.notes)
    assert all(c.broken and c.max_rel_error > 1e-3 for c in streamed.controls)

    monkeypatch.setattr(Allowances, "measure", lambda self, *args, **kwargs: None)  # the control: none measured
    bare = stream_check(directory, inputs, ["channels"])
    failing = {t.name for c in bare.checks for t in c.tensors if not t.passed}
    assert not bare.passed and failing == set(over) and not bare.allowances
    assert all(t.tolerance == BASE for c in bare.checks for t in c.tensors)


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_allowance_at_the_embedding_or_head_never_rescues_a_real_break(stage, checkpoints, monkeypatch):
    """A spec bug planted in the ill-conditioned stage: found there by both checks, far over the capped allowance."""
    model, inputs, directory = checkpoints[stage]
    *_, bug, first_break, parameter = STAGES[stage]
    plant(monkeypatch, "bert", bug)
    whole = check(model, inputs, ["channels"])
    streamed = stream_check(directory, inputs, ["channels"])
    assert not whole.passed and not streamed.passed
    for report in (whole, streamed):
        forward, backward = report.checks
        assert forward.first_break == first_break and not backward.passed
        broken = by_name(backward)[parameter]
        assert not broken.passed and broken.tolerance <= CAP and broken.max_rel_error > 1e-3
    assert stage in [a["stage"] for a in streamed.allowances]


def _ill_conditioned_lookup(monkeypatch, width: int, offset: float) -> None:
    """T5's embedding stage is a lookup, exact under every element; made ill-conditioned here: each token's row gets
    (sum(row + offset) - offset * width - sum(row)) added to every channel, zero in exact arithmetic, its round-off
    depending on the order the channels are summed in (a permutation reorders it). The whole model's lookups and the
    streamed stage's are the same module's forward."""
    real = torch.nn.Embedding.forward

    def forward(self, ids):
        rows = real(self, ids)
        if self.embedding_dim != width:  # the relative position tables
            return rows
        return rows + ((rows + offset).sum(-1, keepdim=True) - offset * width - rows.sum(-1, keepdim=True))
    monkeypatch.setattr(torch.nn.Embedding, "forward", forward)


@pytest.fixture(scope="module")
def t5_checkpoint(tmp_path_factory):
    from tests.unit.test_stream_t5 import saved as saved_t5

    return saved_t5(tmp_path_factory.mktemp("t5"))


def test_an_ill_conditioned_t5_embedding_is_judged_with_its_measured_round_off(t5_checkpoint, monkeypatch):
    """An encoder-decoder's embedding (both stacks' outputs) gets its stage's measured allowance as one stack's does.
    float64's base tolerance is pinned at 1e-16, so that a round-off the whole-model check allows (its float32 rerun
    not saturated by the planted sum, offset 1e5) is over it: the streamed check passes where the whole-model check
    passes; without the embedding's allowance (the negative control) the encoder's embedding output fails, and only
    tensors the embedding measured; a spec bug planted in the token table still fails there, far over the cap."""
    from perm_core.families import t5
    from perm_core.stream.allowance import Allowances
    from perm_core.verify.tolerances import TOLERANCE

    model, inputs, directory = t5_checkpoint
    assert model.config.num_heads != model.config.d_model
    monkeypatch.setitem(TOLERANCE, torch.float64, 1e-16)
    _ill_conditioned_lookup(monkeypatch, model.config.d_model, 1e5)
    whole = check(model, inputs, ["channels"])
    streamed = stream_check(directory, inputs, ["channels"])
    assert whole.passed and streamed.passed
    [used] = [a for a in streamed.allowances if a["stage"] == "the embedding"]
    embed = by_name(streamed.checks[0])["embed"]
    assert "embed" in used["over_base_tolerance"] and embed.max_rel_error > 1e-12  # the planted round-off
    assert embed.passed and embed.max_rel_error <= embed.tolerance <= CAP
    assert not any("fails here" in note for note in streamed.notes)

    measure = Allowances.measure
    with monkeypatch.context() as bare_run:  # the control: the embedding's allowance alone not measured
        bare_run.setattr(Allowances, "measure", lambda self, where, *args, **kwargs: None if where == "the embedding"
                         else measure(self, where, *args, **kwargs))
        bare = stream_check(directory, inputs, ["channels"])
    failing = {t.name for c in bare.checks for t in c.tensors if not t.passed}
    assert not bare.passed and "embed" in failing and failing <= set(used["over_base_tolerance"])

    rules = t5.FAMILY.rules  # the bug: the token table claimed as untouched by the channels' permutation
    bug = Rule(r"(?:transformer\.)?shared\.weight", (None, None), "embedding")
    monkeypatch.setattr(t5, "FAMILY", dataclasses.replace(t5.FAMILY, rules=lambda g: (bug, *rules(g))))
    planted = stream_check(directory, inputs, ["channels"])
    for report in (check(model, inputs, ["channels"]), planted):
        first = report.checks[0]
        assert not report.passed and first.first_break == "embed"
        broken = by_name(first)["embed"]
        assert not broken.passed and broken.tolerance <= CAP and broken.max_rel_error > 1e-3
    assert "the embedding" in [a["stage"] for a in planted.allowances]
