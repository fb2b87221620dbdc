"""Checkpoints as people store them: float32, bfloat16 and float16 weights, and sharded safetensors.

compare holds a pair stored coarser than float64 to the rounding of its stored dtype (same_function.weight_bound,
propagated_bounds) and a float64 pair to float64 round-off; scramble writes the stored dtype and shard layout; check
upcasts and says what was stored."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers as hf

from perm_core.__main__ import main
from perm_core.engine.spec import transform_param
from perm_core.engine.symmetries import WEIGHT_SYMMETRIES, build_many
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.run.numerics import use_exact_numerics
from perm_core.verify import same_function
from perm_core.verify.same_function import UNIT_ROUNDOFF, compare_models, weight_bound
from perm_core.verify.subject import Subject
from tests.unit.json_schema import validated
from tests.unit.test_recover import with_params

KEY = 5
HEADER_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}
CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


pytestmark = pytest.mark.usefixtures("one_thread")


def cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def saved(directory: Path, family: str, dtype: torch.dtype, **save_kwargs) -> Path:
    model = build_random_model(family, seed=1, model_class=CLASSES[family])[0].to(dtype)
    model.config._attn_implementation = "eager"
    model.save_pretrained(directory, **save_kwargs)
    return directory


def scrambled(capsys, source: Path, out: Path, *extra) -> Path:
    argv = ["scramble", source, "--key", KEY, "--out", out, *extra]
    for name in WEIGHT_SYMMETRIES:
        argv += ["--symmetry", name]
    code, _, err = cli(capsys, *argv)
    assert code == 0, err
    return out


def header_dtypes(directory: Path) -> set[str]:
    """The dtypes in the safetensors headers of a checkpoint (8-byte little-endian length, then JSON)."""
    found = set()
    for path in directory.glob("*.safetensors"):
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        found |= {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    return found


def compare_json(capsys, a: Path, b: Path) -> tuple[int, dict]:
    code, out, err = cli(capsys, "compare", a, b, "--json")
    assert out, err
    return code, validated("compare", out)


@pytest.mark.parametrize("family, dtype", [("gpt2", torch.float32), ("llama", torch.bfloat16),
                                           ("gpt2", torch.float16)])
def test_a_rounded_scramble_is_the_same_function_up_to_its_rounding(family, dtype, tmp_path, capsys):
    source = saved(tmp_path / "source", family, dtype)
    out = scrambled(capsys, source, tmp_path / "scrambled")  # no --dtype: the stored one
    assert header_dtypes(out) == {HEADER_DTYPES[dtype]}
    code, report = compare_json(capsys, source, out)
    name = str(dtype).removeprefix("torch.")
    assert code == 0, report["explanation"]
    assert report["verdict"] == f"same function up to {name} rounding of the stored weights"
    assert report["stored_dtype"] == {"a": name, "b": name} and report["precision"] == name
    u = UNIT_ROUNDOFF[dtype]
    residual = report["residual"]["max_rel_error"]
    # Really rounded (float64 round-off would refuse it), and by one rounding only: scramble applies the element
    # in float64 and rounds once, so no weight is further than u_stored of its tensor's largest entry.
    assert 1e-9 < residual <= u < report["bounds"]["weights"] == weight_bound(dtype)
    assert 1e-9 < report["output_error"] <= report["bounds"]["outputs"]
    assert all(t["max_rel_error"] <= t["tolerance"] for t in report["tensors"])
    assert set(report["recovered"]) == set(WEIGHT_SYMMETRIES) and report["recovered"]["rotation"]["rotated"] > 0
    code, text, _ = cli(capsys, "compare", source, out)
    assert code == 0 and f"VERDICT: same function up to {name} rounding of the stored weights" in text
    assert f"(stored as {name})" in text and f"bound {report['bounds']['weights']:.1e}" in text


def test_a_rounded_pair_that_needed_no_rounding_is_the_same_function(tmp_path, capsys):
    """Permutations move float32 weights exactly: nothing to excuse, so the verdict is the plain one."""
    source = saved(tmp_path / "source", "gpt2", torch.float32)
    code, _, err = cli(capsys, "scramble", source, "--key", KEY, "--out", tmp_path / "permuted", "--symmetry",
                       "channels", "--symmetry", "heads", "--symmetry", "head_channels", "--symmetry", "mlp")
    assert code == 0, err
    code, report = compare_json(capsys, source, tmp_path / "permuted")
    assert code == 0 and report["verdict"] == "same function" and report["precision"] == "float32"
    assert report["residual"]["max_rel_error"] == 0.0 and report["output_error"] < 1e-12


def nudged(directory: Path, name: str, relative: float) -> None:
    """One entry of one stored weight moved by `relative` x the tensor's largest |entry|, in place."""
    path = directory / "model.safetensors"
    tensors = safetensors.torch.load_file(path)
    weight = tensors[name]
    weight[3, 5] += relative * weight.abs().max()
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("dtype, relative", [(torch.float32, 1e-3), (torch.bfloat16, 0.1)])
def test_one_weight_nudged_beyond_the_rounding_is_a_different_function(dtype, relative, tmp_path, capsys):
    """1e-3 is 800x the float32 bound; bfloat16 cannot hold a 1e-3 nudge of its largest entries (its spacing there
    is 8e-3), and its bound is 1.6e-2, so its nudge is 0.1."""
    source = saved(tmp_path / "source", "gpt2", dtype)
    out = scrambled(capsys, source, tmp_path / "scrambled")
    name = "transformer.h.1.mlp.c_proj.weight"
    nudged(out, name, relative)
    code, report = compare_json(capsys, source, out)
    assert code == 1 and report["verdict"] == "different functions"
    assert report["residual"]["worst_tensor"] == name
    assert report["residual"]["max_rel_error"] == pytest.approx(relative, rel=0.05)
    assert name in report["explanation"]


def test_float64_checkpoints_keep_float64_tolerances(tmp_path, capsys):
    """A float32-rounded scramble stored as float64 is not excused: only the stored dtype sets the rounding."""
    source = saved(tmp_path / "source", "gpt2", torch.float64)
    rounded = scrambled(capsys, source, tmp_path / "rounded", "--dtype", "float32")
    code, report = compare_json(capsys, source, rounded)  # B stored in float32: its rounding is allowed
    assert code == 0 and report["verdict"] == "same function up to float32 rounding of the stored weights"
    widened = tmp_path / "widened"
    hf.GPT2LMHeadModel.from_pretrained(rounded, dtype=torch.float64).save_pretrained(widened)
    assert header_dtypes(widened) == {"F64"}
    code, report = compare_json(capsys, source, widened)
    assert code == 1 and report["verdict"] == "different functions" and report["precision"] == "float64"
    assert report["bounds"]["weights"] == 1e-9 and "rounded to float32?" in report["explanation"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_other_writers_roundings_are_within_the_bound(dtype):
    """The two other writers weight_bound allows for, measured: A and B both rounded from one float64 original
    (two roundings, the second moved by the rotations), and the element applied in float32 before rounding."""
    original = build_random_model("llama", seed=2, dtype=torch.float64)[0]
    subject = Subject(original)
    element = build_many({name: KEY for name in WEIGHT_SYMMETRIES}, subject.geometry)
    probes = [random_inputs("llama", original, seed) for seed in (0, 1)]
    a = with_params(original, {n: p.detach().to(dtype).double() for n, p in subject.params.items()})
    twice = with_params(original, {n: transform_param(p.detach(), subject.claims[n], element).to(dtype).double()
                                   for n, p in subject.params.items()})
    in_float32 = with_params(original, {n: transform_param(p.detach().to(dtype).float(), subject.claims[n], element)
                                        .to(dtype).double() for n, p in subject.params.items()})
    u = UNIT_ROUNDOFF[dtype]
    for b, most in ((twice, 2 * u), (in_float32, u + 4 * UNIT_ROUNDOFF[torch.float32])):
        result = compare_models(a, b, probes, stored=(dtype, dtype))
        assert result.exit_code == 0, result.explanation()
        assert 1e-9 < result.residual <= most <= result.weight_bound / 2
        assert all(e.max_rel_error <= e.tolerance / 2 for e in result.tensors)  # traced: 2x inside their bounds


@pytest.mark.parametrize("stored", [None, torch.float32])
def test_traced_tensors_that_do_not_unscramble_deny_the_element(stored, monkeypatch):
    """Outputs and weights agree but one un-scrambled hidden state does not (a planted un-scrambling bug: two of
    its channels swapped): the element is not recovered, so compare does not say "same function"."""
    a = build_random_model("gpt2", seed=3, dtype=torch.float64)[0]
    subject = Subject(a)
    b = with_params(a, subject.transformed_params(build_many({name: KEY for name in WEIGHT_SYMMETRIES},
                                                             subject.geometry)))
    probes = [random_inputs("gpt2", a, seed) for seed in (0, 1)]
    honest = compare_models(a, b, probes, stored=(stored, stored))
    assert honest.exit_code == 0

    unscramble = Subject.unscramble

    def buggy(self, records, element):
        restored = dict(unscramble(self, records, element))
        restored["blocks.0.hidden"] = restored["blocks.0.hidden"][..., [1, 0, *range(2, a.config.n_embd)]]
        return restored

    monkeypatch.setattr(same_function.Subject, "unscramble", buggy)
    result = compare_models(a, b, probes, stored=(stored, stored))
    assert result.same_function and result.weights_within and result.outputs[0].max_rel_error < 1e-6
    assert not result.element_recovered and result.exit_code == 1
    assert result.verdict == "same function, element not recovered"
    assert "blocks.0.hidden" in result.explanation()


def plain_logits(directory: Path, class_name: str, inputs: dict, dtype=torch.float64) -> torch.Tensor:
    model = getattr(hf, class_name).from_pretrained(directory, dtype=dtype, attn_implementation="eager").eval()
    use_exact_numerics(model)  # float64 math throughout: the two differ by their stored weights alone
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("family, dtype, shards", [("gpt2", torch.float32, "50KB"), ("llama", torch.bfloat16, None),
                                                   ("gpt2", torch.float16, None), ("llama", torch.bfloat16, "60KB")])
def test_stored_checkpoints_check_and_scramble(family, dtype, shards, tmp_path, capsys):
    source = saved(tmp_path / "source", family, dtype, **({"max_shard_size": shards} if shards else {}))
    name = str(dtype).removeprefix("torch.")
    code, text, err = cli(capsys, "check", source, "--symmetry", "channels", "--symmetry", "rotation",
                          "--forward-only")
    assert code == 0, text + err
    assert text.splitlines()[1] == f"weights stored as {name}, checked in float64 (upcast)"
    code, out, _ = cli(capsys, "check", source, "--symmetry", "mlp", "--forward-only", "--dtype", "float32", "--json")
    report = validated("check", out)
    assert code == 0 and report["stored_dtype"] == name and report["dtype"] == "float32"

    out = scrambled(capsys, source, tmp_path / "scrambled")
    assert header_dtypes(out) == {HEADER_DTYPES[dtype]}
    assert json.loads((out / "config.json").read_text())["dtype"] == name
    record = validated("scramble_keys", out / "key.json")
    assert record["dtype"] == record["stored_dtype"] == name and f"--dtype {name}" in record["reproduce"]
    index = source / "model.safetensors.index.json"
    assert index.exists() == bool(shards)
    if shards:  # the very same shards
        weight_map = json.loads(index.read_text())["weight_map"]
        assert len(set(weight_map.values())) >= 2
        assert json.loads((out / "model.safetensors.index.json").read_text())["weight_map"] == weight_map
        assert not (out / "model.safetensors").exists()
    # Plain transformers reloads it: in its stored dtype by default, and with the source's logits to the stored
    # precision (float64 math: the written weights are within one rounding of the exact ones).
    reloaded = getattr(hf, CLASSES[family]).from_pretrained(out)
    assert next(reloaded.parameters()).dtype == dtype
    inputs = random_inputs(family, reloaded)
    a, b = plain_logits(source, CLASSES[family], inputs), plain_logits(out, CLASSES[family], inputs)
    error = ((b - a).abs().max() / a.abs().max()).item()
    assert 1e-12 < error < 16 * UNIT_ROUNDOFF[dtype], error
