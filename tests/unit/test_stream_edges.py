"""The layer-streamed check at its edges: a break in every stage kind (the embedding, a block, the final norm, the
head's first and last vocabulary chunk) found and named; a negative control judged at BROKEN_AT and labelled with
the stage that broke it; the element's own round-off taken where it is the larger; the memory bound sized by the
checked dtype where activations dominate; the oracle's tolerance capped; and the oracle run on its own hidden
states, so that a bug in the traced stages shows even where the stock code rounds as they do (float64 families)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from perm_core.engine.spec import Rule
from perm_core.models.random_models import random_inputs
from perm_core.stream.allowance import Allowances
from perm_core.stream.check import stream_check
from perm_core.stream.layout import StreamedModel
from perm_core.stream.report import oracle
from perm_core.stream.tally import Scales, Tally
from perm_core.verify.check import check
from perm_core.verify.tolerances import BROKEN_AT, ROUNDOFF_CAP, ROUNDOFF_SAFETY, TOLERANCE
from tests.unit.test_stream import plant, saved

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 300  # random:llama's head in 3 to 30 chunks: each holds its 10 rows or more
EDGE_ROWS = 10


def head_rows_uniform_but(rows: slice):
    """A tweak for saved(): every row of Llama's untied head constant across channels (a channel permutation leaves
    its logit as it is, so forgetting to permute it changes nothing), except `rows`."""
    def tweak(model):
        weight = model.lm_head.weight
        kept = weight[rows].clone()
        weight.copy_(weight.mean(dim=1, keepdim=True).expand_as(weight))
        weight[rows] = kept
    return tweak


LAYER = r"(?:model\.)?layers\.(?P<layer>1)\."
# stage kind -> (the planted rule: a parameter left unmoved by the channel permutation, the checkpoint's tweak, the
# forward tensor that first breaks, the forward stage it breaks at, the parameter whose gradient fails)
STAGE_BUGS = {
    "embedding": (Rule(r"(?:model\.)?embed_tokens\.weight", (None, None), "embedding"), None, "embed",
                  "embeddings", "model.embed_tokens.weight"),
    "block 1": (Rule(LAYER + r"mlp\.down_proj\.bias", (None,), "mlp.out"), None, "blocks.1.hidden", "block 1",
                "model.layers.1.mlp.down_proj.bias"),
    "final norm": (Rule(r"(?:model\.)?norm\.weight", (None,), "norm"), None, "blocks.2.hidden", "block 2",
                   "model.norm.weight"),
    # only the head's first rows (its first chunk) or its last rows (its last chunk) can break: every other
    # chunk's logits are exact, and must not hide the break by coming before or after it
    "head chunk 0": (Rule(r"lm_head\.weight", (None, None), "head"), head_rows_uniform_but(slice(0, EDGE_ROWS)),
                     "output.logits", "output", "lm_head.weight"),
    "head last chunk": (Rule(r"lm_head\.weight", (None, None), "head"),
                        head_rows_uniform_but(slice(VOCAB - EDGE_ROWS, VOCAB)), "output.logits", "output",
                        "lm_head.weight"),
}


@pytest.mark.parametrize("kind", STAGE_BUGS)
def test_a_break_in_every_stage_kind_is_found_and_named(kind, monkeypatch, tmp_path):
    rule, tweak, tensor, stage, parameter = STAGE_BUGS[kind]
    _, inputs, directory = saved("llama", tmp_path, seed=3, tweak=tweak, num_hidden_layers=3, vocab_size=VOCAB)
    clean = stream_check(directory, inputs, ["channels"], key=4)
    assert clean.passed and all(c.first_break == "" for c in clean.checks)  # the control: no bug, nothing named
    assert 3 <= clean.head_chunks <= VOCAB // EDGE_ROWS  # a first, a middle and a last chunk, each >= 10 rows
    plant(monkeypatch, "llama", rule)
    report = stream_check(directory, inputs, ["channels"], key=4)
    forward, backward = report.checks
    assert not report.passed and not forward.passed and not backward.passed
    assert forward.first_break == tensor
    # each stage is checked on the original's own input: only the planted stage breaks, far over its tolerance
    over = {s.where: s.error_over_tolerance for s in forward.stages}
    assert over.pop(stage) > 1e6 and all(value <= 1 for value in over.values()), over
    assert f"grad.param.{parameter}" in {t.name for t in backward.tensors if not t.passed}
    assert report.to_json()["checks"][0]["first_break"] == tensor


def test_the_blocks_backward_runs_on_the_gradient_of_every_head_chunk(tmp_path):
    """Each block's backward is checked on the original's gradient at its output: the head's summed over all its
    vocabulary chunks. Any cotangent would keep the stages equivariant, so a partial sum passes every check; what
    shows it is each gradient's scale (its largest |value|: max_abs / max_rel), the whole-model check's."""
    from perm_core.verify.check import check

    model, inputs, directory = saved("llama", tmp_path, num_hidden_layers=3, vocab_size=VOCAB)
    streamed, whole = stream_check(directory, inputs, ["channels"]), check(model, inputs, ["channels"])
    assert streamed.head_chunks >= 3 and streamed.passed and whole.passed
    theirs = {t.name: t for t in whole.checks[1].tensors}
    scales = {t.name: (t.max_abs_error / t.max_rel_error, theirs[t.name].max_abs_error / theirs[t.name].max_rel_error)
              for t in streamed.checks[1].tensors if t.max_rel_error > 0 and theirs[t.name].max_rel_error > 0}
    assert {"grad.blocks.0.hidden", "grad.blocks.1.hidden", "grad.input"} <= set(scales) and len(scales) > 30
    for name, (mine, expected) in scales.items():
        assert mine == pytest.approx(expected, rel=1e-9), name


def uniform_norms_but(target: str, delta: float):
    """A tweak for saved(): every LayerNorm's weight and bias uniform (forgetting to permute it changes nothing),
    except the norm weight `target`, 1.5 + delta x noise: the norms_not_permuted control then breaks there only, by
    an amount proportional to delta."""
    def tweak(model):
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.5)
                module.bias.fill_(0.25)
        weight = model.get_parameter(target)
        weight.add_(delta * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    return tweak


def norms_control(report):
    return next(c for c in report.controls if c.name == "norms_not_permuted")


# delta -> (is the control broken, the window its break falls in): just above and just below BROKEN_AT
NEAR_BROKEN_AT = {2e-3: (True, (BROKEN_AT, 2 * BROKEN_AT)), 1e-3: (False, (BROKEN_AT / 2, BROKEN_AT))}


@pytest.mark.parametrize("delta", NEAR_BROKEN_AT)
def test_a_control_is_broken_just_above_broken_at_and_not_just_below(delta, tmp_path):
    broken, (low, high) = NEAR_BROKEN_AT[delta]
    _, inputs, directory = saved("bert", tmp_path, num_hidden_layers=3, tweak=uniform_norms_but(
        "bert.encoder.layer.1.output.LayerNorm.weight", delta))
    report = stream_check(directory, inputs, ["channels"], key=4)
    control = norms_control(report)
    assert low < control.max_rel_error < high  # the break planted where the test means it
    assert control.broken == broken and report.passed == broken  # an unbroken control fails the report
    assert all(c.passed for c in report.checks)
    measured = "block 1 (on the original's input there; streamed)" if broken else "every traced tensor"
    assert control.measured_on == measured


# the norm left unpermuted -> the stage the streamed control names
CONTROL_STAGES = {"bert.embeddings.LayerNorm.weight": "the embeddings",
                  "bert.encoder.layer.1.output.LayerNorm.weight": "block 1",
                  "bert.encoder.layer.2.attention.output.LayerNorm.weight": "block 2",
                  "cls.predictions.transform.LayerNorm.weight": "the head"}


@pytest.mark.parametrize("target", CONTROL_STAGES)
def test_a_control_names_the_stage_that_broke_it(target, tmp_path):
    _, inputs, directory = saved("bert", tmp_path, num_hidden_layers=3, tweak=uniform_norms_but(target, 0.5))
    report = stream_check(directory, inputs, ["channels"], key=4)
    control = norms_control(report)
    assert report.passed and control.broken and control.max_rel_error > 0.1
    assert control.measured_on == f"{CONTROL_STAGES[target]} (on the original's input there; streamed)"
    document = report.to_json()["controls"]
    assert next(c for c in document if c["name"] == "norms_not_permuted")["measured_on"] == control.measured_on


def _tally(name: str, distance: float) -> Tally:
    tally = Tally()
    tally.add(name, torch.zeros(1, dtype=torch.float64), torch.full((1,), distance, dtype=torch.float64))
    return tally


# the element's difference -> (passes, the tolerance it is judged by): the original's round-off (1e-5) allows
# 8e-5, the element's own (1e-4, the larger) 8e-4
OWN_ROUNDOFF = {5e-4: (True, ROUNDOFF_SAFETY * 1e-4), 9e-4: (False, ROUNDOFF_SAFETY * 1e-4)}


@pytest.mark.parametrize("difference", OWN_ROUNDOFF)
def test_the_larger_of_the_original_and_the_element_round_off_is_allowed(difference):
    """A float32 stage whose element rounds more than the original (a permutation reorders sums): the element's own
    round-off, measured because the original's did not cover it, is the one its tensor is judged with."""
    name = "grad.param.w"
    scales = Scales()
    scales.add(name, torch.ones(1, dtype=torch.float64))
    element = SimpleNamespace(tally=_tally(name, difference))
    allowance = Allowances(SimpleNamespace(dtype=torch.float32), {}, {"channels": element}, {}, make_element=None)
    allowance.measure("block 1", [name], scales, lambda: _tally(name, 1e-5), lambda label: _tally(name, 1e-4))
    assert allowance.used == [{"stage": "block 1", "over_base_tolerance": [name], "measured": ["original", "channels"]}]
    [error] = allowance.judged("channels", element.tally.differences(scales.final({}, torch.float32)))
    passed, tolerance = OWN_ROUNDOFF[difference]
    assert error.passed == passed and error.tolerance == pytest.approx(tolerance)


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_the_memory_bound_sizes_activations_by_the_checked_dtype(family, tmp_path):
    """64 tokens on a tiny model: one block's activations (its attention maps above all) dominate its weights, so an
    activation sized in the wrong dtype would move the bound by half of it."""
    model, _, directory = saved(family, tmp_path)
    inputs = random_inputs(family, model, seed=0, n_tokens=64)
    memory = {dtype: stream_check(directory, inputs, ["channels"], dtype=dtype).memory.to_json()
              for dtype in (torch.float32, torch.float64)}
    narrow, wide = memory[torch.float32], memory[torch.float64]
    assert narrow["activation_bytes"] > 4 * (3 * narrow["largest_block_bytes"] + 2 * narrow["largest_tensor_bytes"])
    for part in ("activation_bytes", "largest_block_bytes", "largest_tensor_bytes", "embedding_rows_bytes"):
        assert wide[part] == 2 * narrow[part], part  # the same tensors, each entry twice the bytes
    # a float32 check's float64 rerun: a block, two tensors and the block's activations, each at float64's size;
    # a float64 check's float32 rerun fits in what is counted already
    rerun_activations = narrow["allowance_bytes"] - 2 * narrow["largest_block_bytes"] - 4 * narrow[
        "largest_tensor_bytes"]
    assert 0 < rerun_activations < wide["activation_bytes"] and wide["allowance_bytes"] == 0
    for found in (narrow, wide):
        parts = (3 * found["largest_block_bytes"] + 2 * found["largest_tensor_bytes"] + found["activation_bytes"]
                 + found["embedding_rows_bytes"] + found["transforms_bytes"] + found["head_whole_bytes"]
                 + found["allowance_bytes"] + found["first_use_bytes"])
        assert found["bound_bytes"] == parts and found["held_bytes"] <= found["bound_bytes"]


class _Traced:
    """A StreamedModel's face to the oracle: its dtype, its outputs, a reader to build its other-dtype twin from."""

    output_axes = {"output.logits": (None, "tokens", None)}
    stock_attention = "sdpa"

    def __init__(self, directory, dtype: torch.dtype, reader=None):
        self.dtype, self.reader = dtype, SimpleNamespace(directory=directory)


# (the stock forward's distance from the traced one, the traced run's measured float32 round-off) -> (the oracle
# passes, its tolerance): ROUNDOFF_SAFETY x the round-off, up to ROUNDOFF_CAP, on each side of both
ORACLE_CASES = {(5e-5, 1e-5): (True, 8e-5), (1e-4, 1e-5): (False, 8e-5),
                (5e-4, 1e-3): (True, ROUNDOFF_CAP), (2e-3, 1e-3): (False, ROUNDOFF_CAP)}


@pytest.mark.parametrize("distance, roundoff", ORACLE_CASES)
def test_the_streamed_oracle_allows_its_measured_round_off_up_to_the_cap(distance, roundoff, monkeypatch):
    from perm_core.stream import report

    traced = torch.linspace(-1.0, 1.0, 200, dtype=torch.float64).reshape(1, 4, 50)
    run = SimpleNamespace(records={"output.logits": traced}, stock_outputs={"output.logits": traced + distance})

    def rerun(model, inputs, stock, head_chunks):
        assert model.dtype == torch.float32 and not stock  # the traced stages, one precision down
        return SimpleNamespace(records={"output.logits": (traced + roundoff).to(torch.float32)}), []

    monkeypatch.setattr(report, "forward_pass", rerun)
    result = oracle(_Traced("checkpoint", torch.float64), {}, run, [(0, 50)])
    passed, tolerance = ORACLE_CASES[(distance, roundoff)]
    assert result.max_rel_error == pytest.approx(distance, rel=1e-2)  # over the stock output's scale
    assert result.tolerance == pytest.approx(tolerance, rel=1e-2) and result.passed == passed
    assert TOLERANCE[torch.float64] < result.tolerance


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_the_oracle_catches_a_traced_stage_bug_in_a_float64_family(family, monkeypatch, tmp_path):
    """GPT-2 and BERT run wholly in float64, stock and traced alike: the oracle can tell them apart only if the stock
    forward runs on its own hidden states. The planted bug (block 0's traced output scaled by 1.001) is equivariant,
    so every element check passes on it: the oracle row alone must fail."""
    _, inputs, directory = saved(family, tmp_path)
    clean = stream_check(directory, inputs, ["channels"])
    assert clean.passed and clean.oracle.max_rel_error < 1e-12  # the control: no float32 anywhere in the stock run
    assert clean.oracle.tolerance == TOLERANCE[torch.float64]
    real = StreamedModel.block

    def scaled(self, layer, weights, hidden, kwargs, encoder_out=None, stock=False):
        found = real(self, layer, weights, hidden, kwargs, encoder_out, stock)
        if layer == 0 and not stock:
            found["blocks.0.hidden"] = found["blocks.0.hidden"] * 1.001
        return found

    monkeypatch.setattr(StreamedModel, "block", scaled)
    report = stream_check(directory, inputs, ["channels"])
    assert all(c.passed for c in report.checks) and all(c.broken for c in report.controls)
    assert not report.oracle.passed and not report.passed
    assert 1e-4 < report.oracle.max_rel_error < 1e-1 and report.oracle.tolerance < 1e-5
    assert not report.to_json()["oracle"]["passed"]


def test_a_control_hidden_only_by_uniform_tensors_is_explained_as_the_whole_model_check_does(monkeypatch, tmp_path):
    """At Hugging Face's init (norm gains ones, biases zeros) norms_not_permuted cannot bite: streamed, as whole, it
    is not informative, shown by rerunning it on a copy with the uniform tensors randomized (read through the same
    shards). The negative control in the same reports: a true symmetry planted as a control is not explained away
    (its randomized copy does not break either), stays NOT BROKEN and fails both."""
    from perm_core.engine import symmetries
    from tests.unit.test_control_edges import hf_init

    model, inputs = hf_init("vit")
    model.save_pretrained(tmp_path / "vit", max_shard_size="40KB")
    real = symmetries.controls
    monkeypatch.setattr(symmetries, "controls", lambda name, key, g, n=None: real(name, key, g, n) + [
        symmetries.Control(name, "true_element", "the symmetry itself", lambda: symmetries.build(name, key, g, n))])
    whole = check(model, inputs, ["channels"], key=3)
    streamed = stream_check(tmp_path / "vit", inputs, ["channels"], key=3)
    notes = []
    for report in (whole, streamed):
        hidden = next(c for c in report.controls if c.name == "norms_not_permuted")
        planted = next(c for c in report.controls if c.name == "true_element")
        assert not hidden.broken and not hidden.informative and hidden.holds and hidden.max_rel_error < 1e-12
        assert float(hidden.note.rsplit("breaks by ", 1)[1]) > BROKEN_AT
        notes.append(hidden.note.split(" (error ")[0])  # the error itself is each run's own round-off
        assert not planted.broken and planted.informative and not planted.holds and planted.note == ""
        assert all(c.passed for c in report.checks) and not report.passed
    assert notes[0] == notes[1] and "uniform here" in notes[0]  # the same tensors named, the same example
    assert [(c.name, c.broken, c.informative) for c in streamed.controls] == [
        (c.name, c.broken, c.informative) for c in whole.controls]
