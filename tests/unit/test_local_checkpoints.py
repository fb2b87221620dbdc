"""Local save_pretrained directories keep their class: check and scramble them through the CLI, and refuse
what the specs cannot describe (exit 2, one line naming the unclaimed parameters)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as hf

from perm_core.__main__ import main
from perm_core.engine.spec import apply_axes
from perm_core.models import registry
from perm_core.models.defaults import DEFAULT_TEXT, default_inputs
from perm_core.models.random_models import build_random_model, random_config
from perm_core.run.numerics import use_exact_numerics
from perm_core.run.trace import TOKEN_RESID
from perm_core.verify.subject import Subject
from tests.unit.json_schema import validated

ROOT = Path(__file__).resolve().parents[2]
CLASSES = {  # class -> family
    "BertModel": "bert", "BertForSequenceClassification": "bert", "BertForTokenClassification": "bert",
    "ViTModel": "vit", "ViTForImageClassification": "vit",
    "GPT2Model": "gpt2", "GPT2LMHeadModel": "gpt2",
    "LlamaModel": "llama", "LlamaForCausalLM": "llama",
}  # fmt: skip
WORDS = ["<unk>", "[PAD]", "[CLS]", "[SEP]"] + "the quick brown fox jumps over lazy dog near river bank".split()


def save_tokenizer(directory: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary (built here: nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS + [f"w{i}" for i in range(120 - len(WORDS))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(directory)


def save_checkpoint(directory: Path, class_name: str, tokenizer: bool = False, seed: int = 1, config=None) -> Path:
    family = CLASSES.get(class_name) or class_name.split("For")[0].removesuffix("Model").lower()
    if config is None:
        model, _ = build_random_model(family, seed=seed, model_class=class_name)
    else:
        model = getattr(hf, class_name)(config)
    model.config._attn_implementation = "eager"
    model.save_pretrained(directory)
    if tokenizer:
        save_tokenizer(directory)
    return directory


def cli(*argv) -> int:
    return main([str(a) for a in argv])


def tensor_dtypes(path: Path) -> set[str]:
    """The dtypes in a safetensors header (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


def outputs(model, inputs: dict) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs)
    found = {}
    for name in ("logits", "last_hidden_state", "pooler_output"):
        value = getattr(out, name, None)
        if value is not None:
            found[name] = value
    return found


@pytest.mark.parametrize("class_name", list(CLASSES))
def test_local_directory_keeps_its_class_and_passes_check(class_name, tmp_path, one_thread, capsys):
    directory = save_checkpoint(tmp_path / class_name, class_name)
    loaded = registry.load_model(str(directory), dtype=torch.float64)
    assert type(loaded.model).__name__ == class_name
    assert loaded.info.source == "local" and loaded.info.family == CLASSES[class_name]
    saved, _ = build_random_model(CLASSES[class_name], seed=1, model_class=class_name)
    assert set(dict(loaded.model.named_parameters())) == set(dict(saved.named_parameters()))  # the head survives
    if class_name.startswith("Bert") and class_name != "BertModel":
        assert torch.equal(loaded.model.classifier.weight, saved.classifier.weight.double())
    if CLASSES[class_name] != "vit":
        assert loaded.tokenizer is None  # weights only: token ids drawn from the vocabulary
        assert default_inputs(loaded)["input_ids"].shape == (1, 12)
    assert cli("check", directory, "--symmetry", "tokens", "--symmetry", "channels", "--symmetry", "rotation",
               "--key", 9, "--json") == 0
    report = validated("check", capsys.readouterr().out)
    assert report["passed"] and report["family"] == CLASSES[class_name]


@pytest.mark.parametrize("class_name", ["BertForTokenClassification", "GPT2LMHeadModel", "LlamaForCausalLM"])
def test_per_token_logits_move_with_their_tokens(class_name, tmp_path, one_thread):
    """Token classification / LM logits carry a token axis: un-permuting them is what makes `tokens` pass."""
    loaded = registry.load_model(str(save_checkpoint(tmp_path / "m", class_name)), dtype=torch.float64)
    subject = Subject(loaded.model, default_inputs(loaded))
    scramble = subject.build({"tokens": 5})
    scrambled = subject.trace(scramble)
    assert scrambled["output.logits"].axes == (None, "tokens", None)
    original = subject.trace()["output.logits"].tensor
    assert (scrambled["output.logits"].tensor - original).abs().max() > 1e-3  # the rows really moved
    restored = subject.unscramble(scrambled, scramble)["output.logits"]
    assert (restored - original).abs().max() < 1e-12


def test_sequence_classifier_reads_the_fixed_cls(tmp_path, one_thread):
    loaded = registry.load_model(str(save_checkpoint(tmp_path / "m", "BertForSequenceClassification")),
                            dtype=torch.float64)
    subject = Subject(loaded.model, default_inputs(loaded))
    scramble = subject.build({"tokens": 5})
    assert scramble.tokens.index[0] == 0  # [CLS] stays first
    scrambled = subject.trace(scramble)["output.logits"]
    assert scrambled.axes == (None, None)
    assert (scrambled.tensor - subject.trace()["output.logits"].tensor).abs().max() < 1e-12


@pytest.mark.parametrize("class_name", list(CLASSES))
def test_scramble_float64_keeps_class_and_function(class_name, tmp_path, one_thread, capsys):
    family = CLASSES[class_name]
    with_tokenizer = family != "vit" and class_name.endswith("Model")  # bare text classes carry a tokenizer
    source = save_checkpoint(tmp_path / "source", class_name, tokenizer=with_tokenizer)
    out = tmp_path / "scrambled"
    symmetries = ["channels", "heads", "head_channels", "mlp", "rotation"]
    argv = ["scramble", source, "--key", 31, "--dtype", "float64", "--out", out]
    for name in symmetries:
        argv += ["--symmetry", name]
    assert cli(*argv) == 0, capsys.readouterr().err

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [class_name]
    assert tensor_dtypes(out / "model.safetensors") == {"F64"}
    assert not list(out.glob("*.bin"))
    has_tokenizer_files = (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
    assert has_tokenizer_files == with_tokenizer
    if class_name in ("GPT2LMHeadModel", "LlamaForCausalLM"):
        written = json.loads((out / "generation_config.json").read_text())
        kept = json.loads((source / "generation_config.json").read_text())
        assert {k: v for k, v in written.items() if k != "transformers_version"} == \
               {k: v for k, v in kept.items() if k != "transformers_version"}
    record = validated("scramble_keys", out / "key.json")
    assert record["dtype"] == "float64" and record["class"] == class_name

    # Plain transformers, the recorded class: same input -> same outputs (hidden states up to the channel map).
    cls = getattr(hf, class_name)
    original = cls.from_pretrained(source, dtype=torch.float64, attn_implementation="eager").eval()
    scrambled = cls.from_pretrained(out, dtype=torch.float64, attn_implementation="eager").eval()
    assert next(scrambled.parameters()).dtype == torch.float64
    loaded = registry.load_model(str(source), dtype=torch.float64)
    inputs = {k: v.double() if v.is_floating_point() else v for k, v in default_inputs(loaded).items()}
    subject = Subject(loaded.model)
    inverse = subject.build({name: 31 for name in symmetries}).inverse()
    stock = outputs(original, inputs), outputs(scrambled, inputs)
    # Stock eager attention and RMSNorm of ViT and Llama compute in float32 even here (perm_core/run/numerics.py):
    # as shipped, the two agree to float32 round-off; with the same math in float64, to float64 round-off.
    for name in ("logits",):
        if name in stock[0]:
            assert (stock[1][name] - stock[0][name]).abs().max() / stock[0][name].abs().max() < 1e-5
    use_exact_numerics(original)
    use_exact_numerics(scrambled)
    a, b = outputs(original, inputs), outputs(scrambled, inputs)
    assert set(a) == set(b) and a
    for name in a:
        back = b[name]
        if name == "last_hidden_state":
            back = apply_axes(back, TOKEN_RESID, inverse)
        elif name == "pooler_output":
            back = apply_axes(back, (None, "resid"), inverse)
        else:
            assert (b[name] - a[name]).abs().max() / a[name].abs().max() < 1e-12  # logits are invariant
        assert (back - a[name]).abs().max() / a[name].abs().max() < 1e-12, name
    different = [n for n, p in scrambled.named_parameters()
                 if p.dim() == 2 and (p - dict(original.named_parameters())[n]).abs().max() > 1e-3]
    assert different  # the weights really changed


def test_reproduce_command_runs_as_written(tmp_path, one_thread):
    source = save_checkpoint(tmp_path / "source", "LlamaForCausalLM", tokenizer=True)
    out = tmp_path / "scrambled"
    assert cli("scramble", source, "--symmetry", "mlp", "--symmetry", "rotation", "--key", 77, "--dtype",
               "float64", "--out", out) == 0
    record = validated("scramble_keys", out / "key.json")
    assert "--out" in record["reproduce"] and "--dtype float64" in record["reproduce"]
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    shutil.rmtree(out)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(record["reproduce"], shell=True, cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    again = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(again) == set(first)
    assert again == first  # byte for byte: weights, config, generation config, tokenizer and key.json


def test_float32_scramble_writes_float32(tmp_path, one_thread):
    source = save_checkpoint(tmp_path / "source", "GPT2LMHeadModel")
    assert cli("scramble", source, "--symmetry", "channels", "--key", 1, "--out", tmp_path / "out") == 0
    assert tensor_dtypes(tmp_path / "out" / "model.safetensors") == {"F32"}


def refused(directory: Path, capsys) -> str:
    capsys.readouterr()  # drop what saving the checkpoint printed
    assert cli("check", directory, "--symmetry", "channels") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def cross_attention_decoder(directory: Path) -> Path:
    """A listed BERT class (a decoder with cross-attention) whose crossattention.* parameters no rule claims."""
    config = random_config("bert")
    config.is_decoder = config.add_cross_attention = True
    return save_checkpoint(directory, "BertLMHeadModel", config=config)


def test_unclaimed_parameters_are_named(tmp_path, one_thread, capsys):
    line = refused(cross_attention_decoder(tmp_path / "qa"), capsys)
    assert "bert.encoder.layer.0.crossattention.self.query.weight" in line and "BertLMHeadModel" in line
    cross = random_config("gpt2")
    cross.add_cross_attention = True  # a listed class with parameters the spec has no rule for
    line = refused(save_checkpoint(tmp_path / "cross", "GPT2Model", config=cross), capsys)
    assert "h.0.crossattention.c_attn.weight" in line and "GPT2Model" in line
    assert cli("scramble", tmp_path / "qa", "--symmetry", "mlp", "--key", 1, "--out", tmp_path / "x") == 2
    assert "crossattention.self.query.weight" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_refusal_is_one_line_in_a_real_process(tmp_path):
    directory = cross_attention_decoder(tmp_path / "qa")
    result = subprocess.run([sys.executable, "-m", "perm_core", "check", str(directory)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "crossattention.self.query.weight" in result.stderr


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_in_one_line(tmp_path, one_thread, capsys):
    """A researcher's directory with another model's tokenizer files: its ids index past the embedding table
    (an IndexError traceback from deep in torch, before this check)."""
    small = random_config("bert")
    small.vocab_size = len(WORDS)  # the saved tokenizer has 120 tokens
    line = refused(save_checkpoint(tmp_path / "mismatch", "BertForSequenceClassification", tokenizer=True,
                                   config=small), capsys)
    assert "120 tokens" in line and f"holds {len(WORDS)}" in line
    fits = save_checkpoint(tmp_path / "fits", "BertForSequenceClassification", tokenizer=True)
    assert registry.load_model(str(fits)).tokenizer is not None  # a vocabulary at least as large: loads as before


def test_unknown_architecture_and_pickles_are_refused(tmp_path, one_thread, capsys):
    directory = save_checkpoint(tmp_path / "m", "GPT2Model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["RemoteCodeGPT"]}))
    assert "not a class of the installed transformers" in refused(directory, capsys)
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    assert "'llama' class" in refused(directory, capsys)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(b"not really a pickle")
    assert "pickle" in refused(directory, capsys)


def test_tokenizer_only_where_the_source_had_one(tmp_path, one_thread):
    plain = registry.load_model(str(save_checkpoint(tmp_path / "plain", "GPT2LMHeadModel")))
    assert plain.tokenizer is None and "no tokenizer" in plain.info.description
    with_tokenizer = registry.load_model(str(save_checkpoint(tmp_path / "tok", "GPT2LMHeadModel", tokenizer=True)))
    assert with_tokenizer.tokenizer is not None
    ids = default_inputs(with_tokenizer)["input_ids"][0].tolist()
    assert ids == with_tokenizer.tokenizer(DEFAULT_TEXT)["input_ids"] and ids.count(0) < len(ids)  # 0 is <unk>
