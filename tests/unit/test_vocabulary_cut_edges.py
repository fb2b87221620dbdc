"""The vocabulary cut (perm_core.run.vocabulary.cut_to_rows_read) at its edges: the padding id at, just below and
just above the number of distinct input ids, the padding id among the input ids, and the two sizes at which the
cut stops being smaller than the table. At every one the lookup runs (its padding_idx is a row of the cut table)
and the early measure gives the very number the whole table gives."""

from __future__ import annotations

import pytest
import torch
import transformers

from perm_core.engine import symmetries
from perm_core.models.random_models import DEFAULT_CLASSES, random_config, random_inputs, randomize_
from perm_core.run import vocabulary
from perm_core.run.numerics import use_exact_numerics
from perm_core.verify import controls as controls_module
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT

IDS = torch.tensor([[2, 9, 9, 50, 2, 21]])  # 4 distinct ids: 2, 9, 21, 50
RENUMBERED = torch.tensor([[0, 1, 1, 3, 0, 2]])  # each id's rank among them
DISTINCT = 4
VOCABULARY = 120  # random_config's vocab_size


def subject_with_padding(family: str, padding_id: int | None, ids: torch.Tensor = IDS) -> Subject:
    config = random_config(family)
    assert config.vocab_size == VOCABULARY
    config.pad_token_id = padding_id
    model = randomize_(getattr(transformers, DEFAULT_CLASSES[family])(config).to(torch.float64), seed=4).eval()
    use_exact_numerics(model)
    inputs = random_inputs(family, model, seed=4, n_tokens=ids.shape[1])
    return Subject(model, {**inputs, "input_ids": ids})


def cut(subject: Subject, inputs: dict | None = None):
    return vocabulary.cut_to_rows_read(subject.model, subject.geometry, subject.inputs if inputs is None else inputs,
                                       subject.params, subject.claims)


def early_errors(subject: Subject, monkeypatch, with_the_cut: bool) -> list[float]:
    names = [n for n in ("channels", "heads", "mlp") if n not in subject.geometry.not_holding()]
    controls = [c for n in names for c in symmetries.controls(n, 21, subject.geometry, subject.n_tokens)]
    with monkeypatch.context() as patch:
        if not with_the_cut:
            patch.setattr(controls_module, "cut_to_rows_read", lambda model, geometry, inputs, params, claims:
                          (params, inputs))
        return [controls_module._early_break(subject, control)[0] for control in controls]


@pytest.mark.parametrize("family", ("bert", "llama"))
@pytest.mark.parametrize("padding_id,rows", [
    (None, DISTINCT),  # no padding row: exactly the rows read
    (DISTINCT - 1, DISTINCT),  # 3: already a row of the 4-row cut
    (DISTINCT, DISTINCT + 1),  # 4: the boundary, one row more so that row 4 exists
    (DISTINCT + 1, DISTINCT + 2),  # 5
    (2, DISTINCT),  # among the ids, below the count
    (9, 10),  # among the ids, above the count
    (50, 51),  # the largest id read
])
def test_the_padding_row_exists_in_the_cut_and_the_early_error_is_the_whole_tables(family, padding_id, rows,
                                                                                   monkeypatch):
    subject = subject_with_padding(family, padding_id)
    name, module = vocabulary.input_table(subject.model)
    assert module.padding_idx == padding_id
    params, inputs = cut(subject)
    assert params[name].shape[0] == rows and torch.equal(inputs["input_ids"], RENUMBERED)
    assert torch.equal(params[name][:DISTINCT], subject.params[name][[2, 9, 21, 50]])  # the rows read, in order
    # the lookup the early measure runs would raise "Padding_idx must be within num_embeddings" otherwise
    looked_up = torch.nn.functional.embedding(inputs["input_ids"], params[name], padding_idx=padding_id)
    assert torch.equal(looked_up, subject.params[name][IDS])
    with_cut, whole = early_errors(subject, monkeypatch, True), early_errors(subject, monkeypatch, False)
    assert len(with_cut) >= 4 and with_cut == whole
    assert min(with_cut) > BROKEN_AT  # real breaks, not a vacuous 0 == 0


@pytest.mark.parametrize("padding_id,cut_rows", [(VOCABULARY - 2, VOCABULARY - 1), (VOCABULARY - 1, None)])
def test_a_padding_row_that_needs_the_whole_table_leaves_it_whole(padding_id, cut_rows):
    """Keeping row 118 cuts 120 rows to 119; keeping row 119 needs all 120: no cut, the inputs untouched."""
    subject = subject_with_padding("bert", padding_id)
    name, _ = vocabulary.input_table(subject.model)
    params, inputs = cut(subject)
    if cut_rows is None:
        assert params is subject.params and inputs is subject.inputs
    else:
        assert params[name].shape[0] == cut_rows and torch.equal(inputs["input_ids"], RENUMBERED)


@pytest.mark.parametrize("distinct", (VOCABULARY - 1, VOCABULARY))
def test_an_input_that_reads_every_row_but_one_is_cut_and_one_that_reads_all_is_not(distinct):
    """Only the cut is asked here (no run): 119 or 120 tokens are more than the model's 64 positions."""
    subject = subject_with_padding("gpt2", None)
    name, _ = vocabulary.input_table(subject.model)
    ids = torch.arange(distinct).flip(0)[None]  # every id once, in reverse
    given = {"input_ids": ids}
    params, inputs = cut(subject, given)
    if distinct == VOCABULARY:
        assert params is subject.params and inputs is given
    else:
        assert params[name].shape[0] == VOCABULARY - 1
        # ids 118..0 read rows 0..118 of the table in order, so the renumbering keeps every id
        assert torch.equal(inputs["input_ids"], ids) and torch.equal(params[name], subject.params[name][:-1])
