"""The layer-streamed check and scramble of an encoder-decoder (T5ForConditionalGeneration, perm_core.stream's
encoder_decoder stages): the same verdicts and per-tensor errors as the whole-model check, the original run equal to
transformers' own forward, a planted spec bug in a middle encoder block and in a middle decoder block found and named
by both, scrambled shards equal to the whole-model scramble's, and memory bounded by the largest block (a control
that does not break failing the report: test_stream, with every streamed family)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from perm_core.engine.spec import Rule
from perm_core.models.random_models import build_random_model, random_inputs, randomize_
from perm_core.run.numerics import use_exact_numerics
from perm_core.stream.check import stream_check
from perm_core.stream.shards import ShardReader
from perm_core.stream.stages import StreamingUnsupportedError
from perm_core.verify.check import check
from tests.unit.json_schema import validated
from tests.unit.symmetry_asserts import assert_same_errors, by_name
from tests.unit.test_cli import cli_here

pytestmark = pytest.mark.usefixtures("one_thread")

# T5 v1.1's layout (gated GELU, no scaling before the head), and t5-small's (the decoder's output scaled by
# d_model**-0.5 before its tied head)
VARIANTS = {"v1.1": {}, "scaled": {"scale_decoder_outputs": True}}


def saved(tmp_path, seed: int = 0, shard: str = "40KB", cls: str = "T5ForConditionalGeneration", **config):
    """A random T5 (norms, embeddings and position tables far from init), written as sharded float32 safetensors;
    returns (the model in float64, its inputs, the directory)."""
    model, _ = build_random_model("t5", seed=seed, model_class=cls)
    if config:
        for name, value in config.items():
            setattr(model.config, name, value)
        model = type(model)(model.config)
        randomize_(model, seed)
        use_exact_numerics(model.eval())
    directory = tmp_path / "t5"
    model.save_pretrained(directory, max_shard_size=shard)
    model = model.to(torch.float64)
    return model, random_inputs("t5", model, seed), directory


@pytest.mark.parametrize("variant", VARIANTS)
def test_streamed_and_whole_model_checks_agree(variant, tmp_path):
    model, inputs, directory = saved(tmp_path, **VARIANTS[variant])
    assert len(ShardReader(directory).files) > 2  # really sharded
    whole = check(model, inputs)  # every symmetry: tokens does not hold on T5 (its relative position bias)
    streamed = stream_check(directory, inputs)
    assert whole.passed and streamed.passed
    assert_same_errors(streamed, whole)
    names = {n for c in streamed.checks for n in by_name(c)}
    assert {"grad.blocks.1.hidden", "blocks.2.cross_attn", "grad.decoder.embed", "grad.input",
            "grad.param.decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"} <= names
    assert [(c.symmetry, c.name, c.broken) for c in streamed.controls] == [
        (c.symmetry, c.name, c.broken) for c in whole.controls]
    assert all(c.broken and c.max_rel_error > 1e-3 for c in streamed.controls)
    # tokens: measured as the whole-model check measures it, the transformed model run on its own activations
    assert [(n.symmetry, n.broken) for n in streamed.not_symmetries] == [("tokens", True)]
    assert streamed.not_symmetries[0].max_rel_error == pytest.approx(whole.not_symmetries[0].max_rel_error, rel=1e-9)
    assert streamed.oracle.passed and streamed.oracle.max_rel_error == pytest.approx(whole.oracle.max_rel_error)
    assert streamed.oracle.tolerance == pytest.approx(whole.oracle.tolerance, rel=1e-6)
    assert streamed.restricted == whole.restricted and "heads" in streamed.restricted and not streamed.notes
    document = validated("check", streamed.to_json())
    assert set(document) == set(whole.to_json()) | {"streamed"}
    assert "each stage" in document["streamed"]["proof"] and document["streamed"]["memory"]["bound_bytes"] > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_streamed_original_run_is_transformers_own_forward(variant, tmp_path, monkeypatch):
    """Both embeddings, every encoder and decoder block's output (each stack's last normed), their attention and
    cross-attention probabilities and the logits, as transformers' whole forward gives them."""
    from perm_core.stream.encoder_decoder import EncoderDecoderModel
    from perm_core.stream.forward import forward_pass

    model, inputs, directory = saved(tmp_path, **VARIANTS[variant])
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
    streamed = EncoderDecoderModel(directory, torch.float64)
    assert (streamed.n_encoder, streamed.n_layers, streamed.scale_output) == (2, 4, variant == "scaled")
    run, _ = forward_pass(streamed, inputs)
    records = run.records
    expected = {"embed": out.encoder_hidden_states[0], "decoder.embed": out.decoder_hidden_states[0],
                "output.logits": out.logits,
                **{f"blocks.{i}.hidden": h for i, h in enumerate(out.encoder_hidden_states[1:])},
                **{f"blocks.{i + 2}.hidden": h for i, h in enumerate(out.decoder_hidden_states[1:])},
                **{f"blocks.{i}.attn": a for i, a in enumerate(out.encoder_attentions)},
                **{f"blocks.{i + 2}.attn": a for i, a in enumerate(out.decoder_attentions)},
                **{f"blocks.{i + 2}.cross_attn": a for i, a in enumerate(out.cross_attentions)}}
    assert set(records) == set(expected)
    for name, theirs in expected.items():
        assert (records[name] - theirs).abs().max() <= 1e-12 * theirs.abs().max(), name
    # the stock modules' run too, with their own arithmetic (T5's layer norm's variance in float32)
    assert (run.stock_logits - out.logits).abs().max() <= 1e-5 * out.logits.abs().max()

    # the controls: the decoder's position table left out (the encoder's run is still the stock one, the
    # decoder's is not), and the head without (or with) the scaling the stock forward applies
    read = EncoderDecoderModel.read
    monkeypatch.setattr(EncoderDecoderModel, "read", lambda self, names: {
        n: torch.zeros_like(w) if n == self.tables["decoder"] else w for n, w in read(self, names).items()})
    wrong, _ = forward_pass(streamed, inputs, stock=False)
    assert (wrong.records["blocks.1.hidden"] - expected["blocks.1.hidden"]).abs().max() == 0
    for name in ("blocks.2.hidden", "blocks.3.attn", "output.logits"):
        assert (wrong.records[name] - expected[name]).abs().max() > 1e-3 * expected[name].abs().max(), name
    monkeypatch.undo()
    streamed.scale_output = not streamed.scale_output
    wrong, _ = forward_pass(streamed, inputs, stock=False)
    assert (wrong.records["blocks.3.hidden"] - expected["blocks.3.hidden"]).abs().max() == 0
    assert (wrong.records["output.logits"] - out.logits).abs().max() > 0.5 * out.logits.abs().max()


def plant(monkeypatch, bug: Rule) -> None:
    """A spec bug: `bug` claims its parameters before T5's own rules do."""
    from perm_core.families import t5

    rules = t5.FAMILY.rules
    monkeypatch.setattr(t5, "FAMILY", dataclasses.replace(t5.FAMILY, rules=lambda g: (bug, *rules(g))))


# three encoder and three decoder blocks: encoder block 1 is trace block 1, decoder block 1 is trace block 4. Each
# bug claims a middle block's MLP output projection's input axis as untouched: an MLP permutation moves that block's
# hidden neurons but not the weight that reads them
BUGS = {
    "encoder": (1, "encoder.block.1.layer.1.DenseReluDense.wo.weight",
                Rule(r"encoder\.block\.(?P<layer>1)\.layer\.1\.DenseReluDense\.wo\.weight", ("resid", None),
                     "mlp.out")),
    "decoder": (4, "decoder.block.1.layer.2.DenseReluDense.wo.weight",
                Rule(r"decoder\.block\.(?P<layer>1)\.layer\.2\.DenseReluDense\.wo\.weight", ("resid", None),
                     "mlp.out", 3)),
}


@pytest.mark.parametrize("stack", BUGS)
def test_a_spec_bug_in_a_middle_block_is_found_and_named_by_both(stack, monkeypatch, tmp_path):
    layer, parameter, rule = BUGS[stack]
    model, inputs, directory = saved(tmp_path, seed=3, num_layers=3, num_decoder_layers=3)
    clean = stream_check(directory, inputs, ["mlp"], key=4)
    assert clean.passed and all(c.first_break == "" for c in clean.checks)  # the control: no bug, nothing named
    plant(monkeypatch, rule)
    whole = check(model, inputs, ["mlp"], key=4)
    streamed = stream_check(directory, inputs, ["mlp"], key=4)
    for report in (whole, streamed):
        forward, backward = report.checks
        assert not report.passed and not forward.passed and not backward.passed
        assert forward.first_break == f"blocks.{layer}.hidden"
        stage = {s.where: s.error_over_tolerance for s in forward.stages}
        assert stage["embeddings"] <= 1 and stage[f"block {layer - 1}"] <= 1 and stage[f"block {layer}"] > 1e6
        assert f"grad.param.{parameter}" in {t.name for t in backward.tensors if not t.passed}
    # streamed, each block is checked on the original's own input, so every other block is still exact (the
    # decoder's blocks too, where the bug is the encoder's: they read the original's encoder output)
    assert all(s.error_over_tolerance <= 1 for s in streamed.checks[0].stages
               if s.where.startswith("block ") and s.where != f"block {layer}")
    # and backward, only the planted block's own tensors break, and the sums its stage adds to: its stack's
    # position table's gradient and, for a decoder block, the encoder output's
    failing = {t.name for t in streamed.checks[1].tensors if not t.passed}
    assert streamed.checks[1].first_break in failing and f"grad.param.{parameter}" in failing
    own = f"grad.param.{stack}.block.1."
    table = f"grad.param.{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    sums = {table, *(["grad.blocks.2.hidden"] if stack == "decoder" else [])}
    input_grad = f"grad.blocks.{layer - 1}.hidden"
    assert all(n.startswith(own) or n in {input_grad, *sums} for n in failing)
    assert input_grad in failing and sums <= failing
    # the sums' round-off was measured (they are over the base tolerance) and allowed them nothing near the break
    measured = {n for a in streamed.allowances if a["stage"].startswith("the sum ") for n in a["over_base_tolerance"]}
    assert measured == sums and all(by_name(streamed.checks[1])[n].tolerance <= 1e-6 for n in sums)


def test_streamed_scramble_writes_the_same_shards_as_the_whole_model_scramble(tmp_path, capsys):
    from transformers import AutoModelForSeq2SeqLM

    _, inputs, directory = saved(tmp_path, shard="30KB")
    common = ("scramble", str(directory), "--symmetry", "channels", "--symmetry", "heads", "--key", "7")
    assert cli_here(capsys, *common, "--stream", "--out", str(tmp_path / "streamed")).returncode == 0
    assert cli_here(capsys, *common, "--out", str(tmp_path / "whole")).returncode == 0
    source, streamed, whole = (ShardReader(tmp_path / d) for d in ("t5", "streamed", "whole"))
    assert streamed.files == source.files and validated("scramble_keys", tmp_path / "streamed" / "key.json")["key"] == 7
    assert {n: e.file for n, e in streamed.entries.items()} == {n: e.file for n, e in source.entries.items()}
    assert sorted(streamed.names()) == sorted(whole.names())
    for name in streamed.names():
        assert torch.equal(streamed.read(name), whole.read(name)), name
    moved = [n for n in source.names() if not torch.equal(source.read(n), streamed.read(n))]
    assert len(moved) > len(source.names()) // 2  # the control: the weights did change
    original, scrambled = (AutoModelForSeq2SeqLM.from_pretrained(tmp_path / d).double().eval()
                           for d in ("t5", "streamed"))
    with torch.no_grad():
        a, b = (model(**inputs).logits for model in (original, scrambled))
    # the scrambled weights are rounded once to float32 (a rotation changes every digit): their function is the
    # original's to float32 round-off through four blocks, not closer
    assert (a - b).abs().max() / a.abs().max() < 1e-5


def test_memory_is_bounded_by_the_largest_block(tmp_path):
    from tests.unit.test_cli import cli
    from tests.unit.test_stream import held_within_its_bound

    _, _, directory = saved(tmp_path, shard="8MB", d_model=512, d_kv=64, num_heads=8, d_ff=2048, num_layers=5,
                            num_decoder_layers=5)
    result = cli("check", str(directory), "--stream", "--symmetry", "channels", "--json")  # a fresh process
    assert result.returncode == 0, result.stderr
    report = validated("check", result.stdout)
    assert report["passed"] and [n["symmetry"] for n in report["not_symmetries"]] == []
    memory = report["streamed"]["memory"]
    # a decoder block: self- and cross-attention (8 x 512 x 512) and a gated MLP (3 x 512 x 2048), in float64
    assert memory["largest_block_bytes"] > 40 * 2**20
    # block 7: a decoder block, whose stage holds its gradients and a transformed copy of its weights at once
    held_within_its_bound(memory, directory, middle_block="block 7", last_block="block 9")


def test_other_t5_classes_are_refused_with_one_line(tmp_path, capsys):
    model, _ = build_random_model("t5", model_class="T5Model")
    model.save_pretrained(tmp_path / "base")
    inputs = random_inputs("t5", model)
    with pytest.raises(StreamingUnsupportedError, match=r"T5ForConditionalGeneration \(t5\); this checkpoint is "
                                                        "T5Model"):
        stream_check(tmp_path / "base", inputs, ["channels"])
    result = cli_here(capsys, "check", str(tmp_path / "base"), "--stream")
    assert result.returncode == 2 and "this checkpoint is T5Model" in result.stderr and not result.stdout


def test_a_stage_over_its_base_tolerance_is_judged_with_its_measured_round_off(tmp_path, monkeypatch):
    """With float64's base tolerance pinned at 1e-16, every block's own tensors are over it: each block's stage is
    rerun in float32 and judged with its round-off, and so is the head, and so is each sum over blocks (the decoder's
    and the encoder's position table gradients, the encoder output's), every block that adds to it rerun: the
    streamed check passes where the whole-model check (the whole run's round-off) passes. Without the allowance (the
    negative control), every measured tensor over the base tolerance fails, the sums among them."""
    from perm_core.stream.allowance import Allowances
    from perm_core.verify.tolerances import TOLERANCE

    model, inputs, directory = saved(tmp_path)
    monkeypatch.setitem(TOLERANCE, torch.float64, 1e-16)
    assert check(model, inputs, ["channels"]).passed
    streamed = stream_check(directory, inputs, ["channels"])
    tables = [f"grad.param.{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
              for stack in ("decoder", "encoder")]
    sums = [f"the sum {tables[0]}", "the sum grad.blocks.1.hidden", f"the sum {tables[1]}"]
    assert [a["stage"] for a in streamed.allowances] == ["the head", "block 3", "block 2", sums[0], sums[1],
                                                         "block 1", "block 0", sums[2]]
    assert all(a["measured"][0] == "original" for a in streamed.allowances)
    over = {n for a in streamed.allowances for n in a["over_base_tolerance"]}
    tensors = {t.name: t for c in streamed.checks for t in c.tensors}
    assert "grad.param.decoder.block.1.layer.1.EncDecAttention.k.weight" in over and "blocks.2.cross_attn" in over
    assert "output.logits" in over  # the head's, measured by the head stage every layout shares
    assert {*tables, "grad.blocks.1.hidden"} <= over  # the sums', measured once each is whole
    assert all(tensors[n].passed and 1e-16 < tensors[n].tolerance <= 1e-6 for n in over)
    assert streamed.passed and not any("fails here" in note for note in streamed.notes)
    assert all(any(note.startswith(f"{where}:") for note in streamed.notes) for where in sums)

    monkeypatch.setattr(Allowances, "measure", lambda self, *args, **kwargs: None)  # no allowance measured
    bare = stream_check(directory, inputs, ["channels"])
    failing = {t.name for c in bare.checks for t in c.tensors if not t.passed}
    assert not bare.allowances and not bare.passed and over <= failing
    assert {*tables, "grad.blocks.1.hidden"} <= failing


def test_every_tensor_of_the_checkpoint_is_a_parameter_some_stage_runs(tmp_path):
    """A tensor that is no parameter of the class is an error in one line, as for one stack's checkpoints (the
    control: the same directory without it checks)."""
    from safetensors.torch import save_file

    from perm_core.stream.shards import CheckpointError

    _, inputs, directory = saved(tmp_path)
    assert stream_check(directory, inputs, ["channels"], backward=False).passed
    save_file({"decoder.block.1.layer.2.surprise.weight": torch.ones(2, 2)}, directory / "extra.safetensors")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    index["weight_map"]["decoder.block.1.layer.2.surprise.weight"] = "extra.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="holds decoder.block.1.layer.2.surprise.weight, which is no parameter"):
        stream_check(directory, inputs, ["channels"])
