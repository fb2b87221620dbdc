"""The CLI: JSON shape, exit codes, scramble round trip through plain transformers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as hf

from tests.unit.json_schema import validated

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "perm_core", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def cli_here(capsys, *args) -> subprocess.CompletedProcess:
    """The same command through perm_core's main() in this process (argparse's own exits included): what
    `python -m perm_core` runs, without a second interpreter importing torch for it. The process itself (exit
    status, nothing on stderr but the one line): test_usage_errors_in_a_real_process_are_one_line_and_exit_2."""
    from perm_core.__main__ import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["perm_core", *args], code, out, err)


def test_check_json_shape_and_exit_zero():
    result = cli("check", "random:gpt2", "--symmetry", "channels", "--symmetry", "tokens", "--key", "99",
                 "--json")
    assert result.returncode == 0, result.stderr
    report = validated("check", result.stdout)
    assert set(report) - {"stored_dtype"} == {"schema_version", "model", "family", "dtype", "keys", "passed", "checks",
                                              "controls", "not_symmetries", "restricted", "oracle"}
    assert report["oracle"]["passed"] and report["oracle"]["max_rel_error"] < 1e-12
    assert report["not_symmetries"] == [] and isinstance(report["restricted"], dict)
    assert report["keys"] == {"channels": 99, "tokens": 99}
    assert (report["model"], report["family"], report["dtype"], report["passed"]) == (
        "random:gpt2", "gpt2", "float64", True)
    assert {(c["symmetry"], c["direction"]) for c in report["checks"]} == {
        (s, d) for s in ("channels", "tokens", "all") for d in ("forward", "backward")}
    for c in report["checks"]:
        assert set(c) == {"symmetry", "direction", "passed", "max_abs_error", "max_rel_error", "tolerance",
                          "tensors", "moved", "moved_what", "note", "non_finite", "floored", "floored_max_abs_error",
                          "max_rel_error_eps", "first_break", "stages"}
        assert c["first_break"] == "" and c["stages"][0]["where"] in ("embeddings", "head")
        assert c["passed"] and c["max_rel_error"] < 1e-9 and c["tolerance"] == 1e-9
        assert c["moved"] >= 0.1 and c["moved_what"] and c["note"] == "" and c["non_finite"] == []
        assert all(set(t) >= {"name", "max_abs_error", "max_rel_error", "tolerance", "finite"} for t in c["tensors"])
    assert report["controls"]
    for c in report["controls"]:
        assert set(c) == {"symmetry", "name", "broken", "max_rel_error", "measured_on", "informative"}
        assert c["broken"] and c["max_rel_error"] > 1e-2


def test_check_table_float32(capsys):
    result = cli_here(capsys, "check", "random:llama", "--symmetry", "rotation", "--dtype", "float32")
    assert result.returncode == 0, result.stderr
    assert "general_rotation_with_rope" in result.stdout and "PASSED" in result.stdout
    assert "1e-04" in result.stdout


@pytest.mark.parametrize("args,message", [
    (("check", "random:deberta"), "vit, bert, gpt2, llama"),
    (("check", "no-such-model"), "nknown model"),
    (("check", "random:vit", "--key", "-1"), "A key must be a whole number"),
    (("check", "random:vit", "--key", str(10**30)), "A key must be a whole number"),
    (("check", "gpt2"), "offline"),
    (("scramble", "random:vit", "--symmetry", "tokens", "--key", "1", "--out", "/tmp/never"), "tokens"),
])
def test_bad_usage_exits_2_with_one_line(args, message, capsys):
    result = cli_here(capsys, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unsupported_local_directory_exits_2(tmp_path, capsys):
    config = hf.DebertaV2Config(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                intermediate_size=64)
    hf.DebertaV2Model(config).save_pretrained(tmp_path / "deberta")
    result = cli_here(capsys, "check", str(tmp_path / "deberta"))
    assert result.returncode == 2
    assert "not supported" in result.stderr and "llama" in result.stderr


def test_a_broken_spec_exits_1(tmp_path, monkeypatch):
    """If the engine were wrong the exit code says so: forget the norms in the real spec."""
    import dataclasses

    from perm_core.cli import check as check_command
    from perm_core.families import bert

    def rules_without_norms(g):
        return tuple(dataclasses.replace(r, axes=(None,) * len(r.axes)) if r.tag == "norm" else r
                     for r in bert.rules(g))

    monkeypatch.setattr(bert, "FAMILY", dataclasses.replace(bert.FAMILY, rules=rules_without_norms))
    from perm_core.__main__ import build_parser

    args = build_parser().parse_args(["check", "random:bert", "--symmetry", "channels", "--key", "3", "--json"])
    assert check_command.run(args) == 1


def test_scramble_writes_a_function_identical_model(tmp_path):
    out = tmp_path / "scrambled"
    result = cli("scramble", "random:gpt2", "--symmetry", "channels", "--symmetry", "heads",
                 "--symmetry", "mlp", "--key", "7", "--out", str(out))
    assert result.returncode == 0, result.stderr
    record = validated("scramble_keys", out / "key.json")
    assert record["key"] == 7 and set(record["symmetries"]) == {"channels", "heads", "mlp"}
    assert (out / "model.safetensors").exists() and not list(out.glob("*.bin"))
    from perm_core.models.random_models import build_random_model, random_inputs
    original, _ = build_random_model("gpt2")
    scrambled = hf.AutoModelForCausalLM.from_pretrained(out).eval()
    inputs = random_inputs("gpt2", original)
    with torch.no_grad():
        a, b = original(**inputs).logits, scrambled(**inputs).logits
    assert (a - b).abs().max() / a.abs().max() < 1e-5
    assert (original.transformer.wte.weight - scrambled.transformer.wte.weight).abs().max() > 0.5


def test_check_takes_a_key_per_symmetry_and_a_named_input(capsys):
    command = ("check", "digits-vit", "--symmetry", "tokens", "--symmetry", "mlp", "--key", "5", "--key", "mlp=9",
               "--forward-only", "--json")
    result = cli_here(capsys, *command, "--input", "digit:3")
    assert result.returncode == 0, result.stderr
    report = validated("check", result.stdout)
    assert report["keys"] == {"tokens": 5, "mlp": 9}
    assert {c["direction"] for c in report["checks"]} == {"forward"}
    other = validated("check", cli_here(capsys, *command, "--input", "digit:4").stdout)

    def errors(found):
        return [t["max_abs_error"] for c in found["checks"] for t in c["tensors"]]
    assert errors(report) != errors(other)  # the input really is the one named


@pytest.mark.parametrize("argv,message", [
    (("--key", "nope=3"), "unknown symmetry 'nope'"),
    (("--key", "mlp=3"), "mlp is not checked"),
    (("--key", "tokens=abc"), "A key must be a whole number"),
    (("--input", "digit:9999"), "digit 9999 does not exist"),
    (("--input", "photo:x"), "unknown input 'photo:x'"),
    (("--input", "image:/nonexistent.png"), "input 'image:/nonexistent.png'"),
])
def test_bad_keys_and_inputs_are_one_line_usage_errors(argv, message, capsys):
    result = cli_here(capsys, "check", "digits-vit", "--symmetry", "tokens", *argv)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args,message,one_line", [
    (("check", "random:deberta"), "vit, bert, gpt2, llama", True),  # a usage error before any model
    (("check", "gpt2"), "offline", True),  # the hub's code path
    # a model loaded first: transformers' "Loading weights" progress bar is on stderr before the error line
    (("check", "digits-vit", "--symmetry", "tokens", "--input", "digit:9999"), "digit 9999 does not exist", False),
])
def test_usage_errors_in_a_real_process_are_one_line_and_exit_2(args, message, one_line):
    """`python -m perm_core` itself: exit status 2 and no traceback; before a model is loaded, stderr is that one
    line (no warning or log line from the imports)."""
    result = cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr and "Traceback" not in result.stderr
    if one_line:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
