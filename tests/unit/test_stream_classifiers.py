"""The streamed check of sequence classifiers, the checkpoints fine-tuning most often leaves: BERT's (its pooler, then
the classifier), RoBERTa's (a classification head reading token 0 itself), DistilBERT's (token 0 through
pre_classifier, an inline ReLU and the classifier) and the decoders' (score on every token,
read at each row's last token that is no padding, found from the ids as transformers finds it). The same verdicts,
per tensor, control and oracle as the whole-model check, on inputs whose last position is padding; a bug planted in
the new heads caught; save_pretrained directories (sharded, and bfloat16) through the CLI."""

from __future__ import annotations

import pytest
import torch

from perm_core.engine.spec import Rule
from perm_core.families import family_by_name
from perm_core.models.random_models import build_random_model
from perm_core.stream.check import stream_check
from perm_core.stream.forward import forward_pass
from perm_core.stream.layout import StreamedModel
from perm_core.stream.shards import ShardReader
from perm_core.verify.check import check
from tests.unit import test_stream
from tests.unit.json_schema import validated
from tests.unit.symmetry_asserts import assert_streamed_report_agrees
from tests.unit.test_cli import cli_here

pytestmark = pytest.mark.usefixtures("one_thread")

ENCODERS = ["bert:BertForSequenceClassification", "roberta:RobertaForSequenceClassification",
            "distilbert:DistilBertForSequenceClassification"]
DECODERS = ["llama:LlamaForSequenceClassification", "qwen2:Qwen2ForSequenceClassification",
            "mistral:MistralForSequenceClassification", "qwen3:Qwen3ForSequenceClassification",
            "phi3:Phi3ForSequenceClassification", "gemma3:Gemma3TextForSequenceClassification",
            "gpt_neox:GPTNeoXForSequenceClassification", "gpt2:GPT2ForSequenceClassification",
            # mixtures of experts: their fused experts streamed block by block, then the same pooled score
            "mixtral:MixtralForSequenceClassification", "qwen2_moe:Qwen2MoeForSequenceClassification",
            "qwen3_moe:Qwen3MoeForSequenceClassification", "gpt_oss:GptOssForSequenceClassification"]
PAD = 3  # the decoders' pad id: with one, transformers finds the pooled token from the ids, not by position


def saved(case: str, tmp_path, **config):
    """A random classifier (far from init) saved as sharded float32 safetensors, the model in float64 and its input:
    ids with a padded last position (attention mask 0). A decoder has a pad id, which its input also holds inside
    the row, and its last id is no pad id (as random_inputs writes it): transformers pools that last token."""
    decoder = family_by_name(case.partition(":")[0]).pools_last_token
    model, inputs, directory = test_stream.saved(case, tmp_path, **({"pad_token_id": PAD} if decoder else {}),
                                                 **config)
    if decoder:
        inputs["input_ids"][..., 2] = PAD
    return model, inputs, directory


def pooled_index(model, inputs) -> int:
    """Where transformers' forward reads its logits: the one token whose score changes the pooled logits."""
    ids = inputs["input_ids"]
    hidden = model.base_model(**inputs).last_hidden_state
    spread = [(model.score(hidden)[0, t] - model(**inputs).logits[0]).abs().max() for t in range(ids.shape[1])]
    return min(range(len(spread)), key=spread.__getitem__)


@pytest.mark.parametrize("case", ENCODERS + DECODERS)
def test_streamed_and_whole_model_checks_agree_on_classifiers(case, tmp_path):
    model, inputs, directory = saved(case, tmp_path)
    assert len(ShardReader(directory).files) > 2 and inputs["attention_mask"][0, -1] == 0  # sharded; padded last
    whole = check(model, inputs)
    streamed = stream_check(directory, inputs)
    assert_streamed_report_agrees(streamed, whole)
    assert validated("check", streamed.to_json())["streamed"]["memory"]["bound_bytes"] > 0
    # the head: one row of scores per label, pooled (no token axis), as transformers' logits [1, labels]
    records = forward_pass(StreamedModel(directory, torch.float64), inputs, stock=False)[0].records
    with torch.no_grad():
        logits = model(**inputs).logits
    assert records["output.logits"].shape == logits.shape == (1, model.config.num_labels)
    assert (records["output.logits"] - logits).abs().max() <= 1e-12 * logits.abs().max()
    if case in DECODERS:  # the pooled token is the last one (its id is no pad), though its attention mask is 0
        assert "last_token_moved" in {c.name for c in streamed.controls}
        with torch.no_grad():
            assert pooled_index(model, inputs) == inputs["input_ids"].shape[1] - 1


@pytest.mark.parametrize("case", ["bert:BertForSequenceClassification", "llama:LlamaForSequenceClassification"])
def test_float32_classifiers_get_the_same_verdicts_streamed(case, tmp_path):
    """In float32 (the head's round-off measured against float64 where a tensor needs it), the same verdicts and
    controls as the whole-model check, every error at float32 round-off."""
    model, inputs, directory = saved(case, tmp_path)
    whole, streamed = check(model.float(), inputs), stream_check(directory, inputs, dtype=torch.float32)
    assert whole.passed and streamed.passed
    assert [(c.symmetry, c.direction, c.passed) for c in streamed.checks] == [
        (c.symmetry, c.direction, c.passed) for c in whole.checks]
    assert all(0 < c.max_rel_error < 1e-4 for r in (whole, streamed) for c in r.checks)
    assert [(c.name, c.broken) for c in streamed.controls] == [(c.name, c.broken) for c in whole.controls]
    assert all(c.broken for c in streamed.controls)


@pytest.mark.parametrize("case", ["llama:LlamaForSequenceClassification", "gpt2:GPT2ForSequenceClassification"])
def test_a_right_padded_decoder_input_gets_the_same_verdicts_streamed(case, tmp_path):
    """Ids padded with the pad id on the right: transformers pools the last real token (two before the end), which
    the token symmetry moves (only the last position stays), so both checks fail the token permutation at the
    logits, and agree on everything else: the streamed head pools where transformers does."""
    model, inputs, directory = saved(case, tmp_path)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    ids[ids == PAD] = PAD + 1
    ids[0, -2:], mask[0, -2:] = PAD, 0
    with torch.no_grad():
        assert pooled_index(model, inputs) == ids.shape[1] - 3
        logits = model(**inputs).logits
    records = forward_pass(StreamedModel(directory, torch.float64), inputs, stock=False)[0].records
    assert (records["output.logits"] - logits).abs().max() <= 1e-12 * logits.abs().max()
    names = ["tokens", "channels"]
    whole, streamed = check(model, inputs, names), stream_check(directory, inputs, names)
    verdicts = [[(c.symmetry, c.direction, c.passed) for c in r.checks] for r in (streamed, whole)]
    assert verdicts[0] == verdicts[1] == [("tokens", "forward", False), ("tokens", "backward", False),
                                          ("channels", "forward", True), ("channels", "backward", True),
                                          ("all", "forward", False), ("all", "backward", False)]
    assert streamed.checks[0].first_break == whole.checks[0].first_break == "output.logits"
    assert [(c.name, c.broken) for c in streamed.controls] == [(c.name, c.broken) for c in whole.controls]
    assert streamed.oracle.passed and whole.oracle.passed and not streamed.passed and not whole.passed


def test_a_pooled_token_off_by_one_is_caught(tmp_path, monkeypatch):
    """The decoder head pooled one token before transformers' choice: the token permutation moves that token, so
    the streamed check fails it at the logits, and the streamed run is no longer transformers' forward."""
    from perm_core.stream import head_modules

    model, inputs, directory = saved("qwen2:Qwen2ForSequenceClassification", tmp_path)
    assert stream_check(directory, inputs, ["tokens"]).passed  # the control: the clean head passes
    real = head_modules.last_non_padding
    monkeypatch.setattr(head_modules, "last_non_padding", lambda ids, pad: real(ids, pad) - 1)
    report = stream_check(directory, inputs, ["tokens"])
    forward, backward = report.checks
    assert not report.passed and not forward.passed and not backward.passed
    assert forward.first_break == "output.logits" and forward.max_rel_error > 1e-2
    with torch.no_grad():
        logits = model(**inputs).logits
    records = forward_pass(StreamedModel(directory, torch.float64), inputs, stock=False)[0].records
    assert (records["output.logits"] - logits).abs().max() > 1e-2 * logits.abs().max()


# (case, the head's bias claimed as untouched though its channels move, its gradient's name)
BIASES = {"bert": ("bert:BertForSequenceClassification", r"bert\.pooler\.dense\.bias", "bert.pooler.dense.bias"),
          "roberta": ("roberta:RobertaForSequenceClassification", r"classifier\.dense\.bias",
                      "classifier.dense.bias"),
          "distilbert": ("distilbert:DistilBertForSequenceClassification", r"pre_classifier\.bias",
                         "pre_classifier.bias")}


@pytest.mark.parametrize("family", BIASES)
def test_a_classifier_bias_left_unpermuted_is_caught_by_both(family, tmp_path, monkeypatch):
    case, pattern, name = BIASES[family]
    model, inputs, directory = saved(case, tmp_path)
    assert stream_check(directory, inputs, ["channels"], key=4).passed  # the control: the clean spec passes
    test_stream.plant(monkeypatch, family, Rule(pattern, (None,), "head"))
    whole, streamed = check(model, inputs, ["channels"], key=4), stream_check(directory, inputs, ["channels"], key=4)
    for report in (whole, streamed):
        forward, backward = report.checks
        assert not report.passed and not forward.passed and not backward.passed
        assert forward.first_break == "output.logits"
        assert f"grad.param.{name}" in {t.name for t in backward.tensors if not t.passed}
    # streamed, every block is checked on the original's input: only the head's tensors break
    assert all(s.error_over_tolerance <= 1 for s in streamed.checks[0].stages if s.where != "output")


@pytest.mark.parametrize("case, dtype", [("llama:LlamaForSequenceClassification", torch.float32),
                                         ("qwen2:Qwen2ForSequenceClassification", torch.bfloat16),
                                         ("gpt_oss:GptOssForSequenceClassification", torch.bfloat16),
                                         ("bert:BertForSequenceClassification", torch.bfloat16)])
def test_a_saved_classifier_passes_the_streamed_check_on_the_cli(case, dtype, tmp_path, capsys):
    """save_pretrained's directory (sharded by max_shard_size, or in bfloat16) through `check DIR --stream`, on the
    CLI's own default input, forward and backward, and forward only."""
    family, _, cls = case.partition(":")
    model, _ = build_random_model(family, model_class=cls)
    if family_by_name(family).pools_last_token:
        model.config.pad_token_id = PAD
    directory = tmp_path / "classifier"
    model.to(dtype).save_pretrained(directory, max_shard_size="40KB" if dtype == torch.float32 else "20KB")
    assert len(ShardReader(directory).files) > 2
    for extra in ((), ("--forward-only",)):
        result = cli_here(capsys, "check", str(directory), "--stream", "--json", *extra)
        assert result.returncode == 0, result.stderr
        report = validated("check", result.stdout)
        assert report["passed"] and "streamed" in report and report["stored_dtype"] == str(dtype).removeprefix("torch.")
        assert report["oracle"]["passed"] and all(c["broken"] for c in report["controls"])
        assert {c["direction"] for c in report["checks"]} == ({"forward"} if extra else {"forward", "backward"})


@pytest.mark.parametrize("case", ["bert:BertForSequenceClassification", "roberta:RobertaForSequenceClassification",
                                  "distilbert:DistilBertForSequenceClassification",
                                  "llama:LlamaForSequenceClassification", "gpt2:GPT2ForSequenceClassification",
                                  "mixtral:MixtralForSequenceClassification"])
def test_a_streamed_scramble_of_a_classifier_writes_the_whole_model_scramble(case, tmp_path, capsys):
    """The same shards, tensor for tensor, as the whole-model scramble; the scrambled classifier, loaded by
    transformers, gives the original's logits (the written float32 weights rounded once: float32 round-off)."""
    import transformers as hf

    _, inputs, directory = saved(case, tmp_path)
    common = ("scramble", str(directory), "--symmetry", "channels", "--symmetry", "rotation", "--key", "7")
    assert cli_here(capsys, *common, "--stream", "--out", str(tmp_path / "streamed")).returncode == 0
    assert cli_here(capsys, *common, "--out", str(tmp_path / "whole")).returncode == 0
    source, streamed, whole = (ShardReader(d) for d in (directory, tmp_path / "streamed", tmp_path / "whole"))
    assert streamed.files == source.files and sorted(streamed.names()) == sorted(whole.names())
    for name in streamed.names():
        assert torch.equal(streamed.read(name), whole.read(name)), name
    moved = [n for n in source.names() if not torch.equal(source.read(n), streamed.read(n))]
    assert len(moved) > len(source.names()) // 2  # the control: the weights did change
    # eager experts (a mixture of experts' loop over them: the default grouped kernel refuses float64; a dense
    # model has none to set), as tests/unit/scrambled_checkpoints.py loads them
    cls = getattr(hf, case.partition(":")[2])
    original, scrambled = (cls.from_pretrained(d, experts_implementation="eager").double().eval()
                           for d in (directory, tmp_path / "streamed"))
    with torch.no_grad():
        a, b = original(**inputs).logits, scrambled(**inputs).logits
    assert (a - b).abs().max() <= 1e-5 * a.abs().max()


def test_distilberts_inline_relu_is_run(tmp_path, monkeypatch):
    """DistilBERT's classifier applies a ReLU its forward makes on the spot (no module of the class): left out of
    the declared head, the streamed logits are no longer transformers' (and the check cannot see it: the head
    without it is equivariant all the same, which is why the record is compared)."""
    import dataclasses

    model, inputs, directory = saved("distilbert:DistilBertForSequenceClassification", tmp_path)
    with torch.no_grad():
        logits = model(**inputs).logits
    streamed = StreamedModel(directory, torch.float64)
    records = forward_pass(streamed, inputs, stock=False)[0].records
    assert (records["output.logits"] - logits).abs().max() <= 1e-12 * logits.abs().max()
    head = streamed.layout.heads[0]
    assert len(head.modules) == 3  # the control: pre_classifier, the ReLU, the classifier
    monkeypatch.setattr(streamed, "layout", dataclasses.replace(streamed.layout, heads=(
        dataclasses.replace(head, modules=(head.modules[0], head.modules[2])),)))
    records = forward_pass(streamed, inputs, stock=False)[0].records
    assert (records["output.logits"] - logits).abs().max() > 1e-3 * logits.abs().max()


def test_a_mixture_of_experts_classifier_with_a_router_bias_left_behind_is_caught_by_both(tmp_path, monkeypatch):
    """gpt-oss's classifier, its block 0's router bias not permuted with the router's rows when the experts are
    reordered: the tokens of that block choose other experts, so both checks break there and name that bias."""
    case = "gpt_oss:GptOssForSequenceClassification"
    model, inputs, directory = saved(case, tmp_path)
    assert stream_check(directory, inputs, ["experts"], key=4).passed  # the control: the clean spec passes
    test_stream.plant(monkeypatch, "gpt_oss", Rule(r"model\.layers\.(?P<layer>0)\.mlp\.router\.bias", (None,),
                                                   "router"))
    whole, streamed = check(model, inputs, ["experts"], key=4), stream_check(directory, inputs, ["experts"], key=4)
    for report in (whole, streamed):
        forward, backward = report.checks
        assert not report.passed and not forward.passed and not backward.passed
        assert forward.first_break == "blocks.0.hidden"
        assert "grad.param.model.layers.0.mlp.router.bias" in {t.name for t in backward.tensors if not t.passed}
