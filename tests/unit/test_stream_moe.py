"""The streamed check and scramble on the five mixtures of experts (issue 48): the same one driver as every dense
family, their fused expert tensors read one block at a time, assembled from the checkpoint's per-expert tensors as
transformers assembles them (perm_core.stream.fused).

Each family: the streamed and whole-model checks agree in float32 as in float64 (the float64 agreement is
test_stream's table, which every streamed family joins), a spec bug planted in a middle block is named at the same
first break by both, the streamed scramble writes the whole-model scramble's shards bit for bit and plain transformers
(eager experts) reloads them as the same function, while the router rows put back break it. The reader: a fused
parameter is the one a loaded model holds, its experts stacked in the checkpoint's natural order (expert 10 after 9),
and it is never read by rows.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from perm_core.engine.spec import Merged, Rule
from perm_core.stream.check import stream_check
from perm_core.stream.shards import CheckpointError, ShardReader
from perm_core.verify.check import check
from tests.unit.symmetry_asserts import ROUNDOFF_NOISE, by_name
from tests.unit.test_cli import cli_here
from tests.unit.test_stream import plant, saved

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")
L1 = r"model\.layers\.(?P<layer>1)\."


def three_blocks(family: str) -> dict:
    """A three-block checkpoint of the family: gpt-oss alternates sliding and full attention, Qwen2-MoE's config
    lists one attention type per block too (all full)."""
    types = {"gpt_oss": ["sliding_attention", "full_attention", "sliding_attention"],
             "qwen2_moe": ["full_attention"] * 3}
    return {"num_hidden_layers": 3, **({"layer_types": types[family]} if family in types else {})}


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_and_whole_model_checks_agree_in_float32(family, tmp_path):
    """float32: the same verdicts for every symmetry and control, every tensor within float32's tolerance in both."""
    model, inputs, directory = saved(family, tmp_path, seed=2)
    model = model.to(torch.float32)
    whole = check(model, inputs, key=6)
    streamed = stream_check(directory, inputs, key=6, dtype=torch.float32)
    assert whole.passed and streamed.passed and streamed.dtype == whole.dtype == "float32"
    assert [(c.symmetry, c.direction, c.passed) for c in streamed.checks] == [
        (c.symmetry, c.direction, c.passed) for c in whole.checks]
    for mine, theirs in zip(streamed.checks, whole.checks, strict=True):
        assert by_name(mine).keys() == by_name(theirs).keys() and mine.first_break == theirs.first_break == ""
        assert mine.max_rel_error < 1e-4 and theirs.max_rel_error < 1e-4, (mine.symmetry, mine.direction)
    assert {c.symmetry for c in streamed.checks} >= {"experts", "mlp", "heads", "rotation"}
    assert [(c.symmetry, c.name, c.broken) for c in streamed.controls] == [
        (c.symmetry, c.name, c.broken) for c in whole.controls]
    assert all(c.broken and c.max_rel_error > 1e-2 for c in streamed.controls)
    assert {"router_not_permuted", "router_alone", "expert_down_not_permuted"} <= {c.name for c in streamed.controls}


# family -> (symmetry, the planted rule, the parameter whose gradient both name): each a bug in block 1 of three,
# found first at its output, or at its attention (OLMoE's query norm)
BUGS = {
    # Mixtral: block 1's router rows left in place when its experts are reordered
    "mixtral": ("experts", Rule(L1 + r"mlp\.gate\.weight", (None, "resid"), "router"),
                "model.layers.1.mlp.gate.weight"),
    # Qwen2-MoE: block 1's shared expert's down projection not told its neurons moved
    "qwen2_moe": ("mlp", Rule(L1 + r"mlp\.shared_expert\.down_proj\.weight", ("resid", None), "mlp.out"),
                  "model.layers.1.mlp.shared_expert.down_proj.weight"),
    # Qwen3-MoE: block 1's experts' down projections left behind when each expert's neurons move (gate|up move)
    "qwen3_moe": ("mlp", Rule(L1 + r"mlp\.experts\.down_proj", (None, "resid", None), "experts.down"),
                  "model.layers.1.mlp.experts.down_proj"),
    # OLMoE: block 1's full-width query norm gain left in place when the heads move
    "olmoe": ("heads", Rule(L1 + r"self_attn\.q_norm\.weight", (None,), "qk_norm"),
              "model.layers.1.self_attn.q_norm.weight"),
    # gpt-oss: block 1's router bias not permuted with its rows
    "gpt_oss": ("experts", Rule(L1 + r"mlp\.router\.bias", (None,), "router"), "model.layers.1.mlp.router.bias"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bug_in_a_middle_block_is_named_at_the_same_first_break_by_both(family, monkeypatch, tmp_path):
    symmetry, rule, parameter = BUGS[family]
    model, inputs, directory = saved(family, tmp_path, seed=3, **three_blocks(family))
    clean = stream_check(directory, inputs, [symmetry], key=4)
    assert clean.passed and all(c.first_break == "" for c in clean.checks)  # the control: no bug, nothing named
    plant(monkeypatch, family, rule)
    whole = check(model, inputs, [symmetry], key=4)
    streamed = stream_check(directory, inputs, [symmetry], key=4)
    for report in (whole, streamed):
        forward, backward = report.checks
        assert not report.passed and not forward.passed and not backward.passed
        assert forward.first_break == ("blocks.1.attn" if family == "olmoe" else "blocks.1.hidden")
        stage = {s.where: s.error_over_tolerance for s in forward.stages}
        assert stage["embeddings"] <= 1 and stage["block 0"] <= 1 and stage["block 1"] > 1e6
        assert f"grad.param.{parameter}" in {t.name for t in backward.tensors if not t.passed}
    # every gradient of an expert tensor has its error per expert in both checks, the largest the tensor's own (the
    # figures differ where a bug is: the whole model's backward carries it on, streamed each block runs on the
    # original's own gradients)
    whole_split = {t.name for t in whole.checks[1].tensors if t.expert_errors is not None}
    split = [t for t in streamed.checks[1].tensors if t.expert_errors is not None]
    assert {t.name for t in split} == whole_split and len(split) >= 3
    for tensor in split:
        assert len(tensor.expert_errors) == 4 and max(tensor.expert_errors) == tensor.max_rel_error, tensor.name
    # streamed, each block runs on the original's own input: the block after the bug is still exact; and backward
    # only block 1's own tensors break (the whole model's backward carries the error on to the head's gradients)
    assert all(s.error_over_tolerance <= 1 for s in streamed.checks[0].stages if s.where == "block 2")
    failing = {t.name for t in streamed.checks[1].tensors if not t.passed}
    assert streamed.checks[1].first_break in failing
    assert all(n.startswith("grad.param.model.layers.1.") or n == "grad.blocks.0.hidden" for n in failing), failing


@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_scramble_is_the_whole_model_scramble_and_reloads_as_the_same_function(family, tmp_path, capsys):
    model, inputs, directory = saved(family, tmp_path, shard="30KB")
    common = ("scramble", str(directory), "--key", "7", *(a for name in ("experts", "mlp", "channels", "heads",
                                                                        "rotation") for a in ("--symmetry", name)))
    assert cli_here(capsys, *common, "--stream", "--out", str(tmp_path / "streamed")).returncode == 0
    assert cli_here(capsys, *common, "--out", str(tmp_path / "whole")).returncode == 0
    source, streamed, whole = (ShardReader(tmp_path / d) for d in (family, "streamed", "whole"))
    assert len(source.files) > 2 and streamed.files == source.files
    # every stored tensor in its own shard under its own name: the experts one tensor per expert where the
    # checkpoint stores them so (gpt-oss stores them fused)
    assert {n: e.file for n, e in streamed.entries.items()} == {n: e.file for n, e in source.entries.items()}
    per_expert = [n for n in source.names() if ".experts.3." in n]
    assert (len(per_expert) == 0) if family == "gpt_oss" else (len(per_expert) == 2 * 3)  # two blocks, 3 tensors
    assert sorted(streamed.names()) == sorted(whole.names())
    for name in streamed.names():
        assert torch.equal(streamed.read(name), whole.read(name)), name
    moved = [n for n in source.names() if not torch.equal(source.read(n), streamed.read(n))]
    assert len(moved) > len(source.names()) // 2

    def stock(path):
        return hf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, experts_implementation="eager",
                                                       attn_implementation="eager").eval()

    original, scrambled = stock(tmp_path / family), stock(tmp_path / "streamed")
    router = next(n for n, _ in original.named_parameters() if n.endswith(("mlp.gate.weight", "router.weight")))
    with torch.no_grad():
        expected, got = original(**inputs).logits, scrambled(**inputs).logits
        # the stock routers take their softmax in float32: the same logits to float32's rounding
        assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-5
        dict(scrambled.named_parameters())[router].copy_(dict(original.named_parameters())[router])  # the control
        broken = scrambled(**inputs).logits
    assert ((broken - expected).abs().max() / expected.abs().max()).item() > 1e-2


def test_a_fused_parameter_is_the_loaded_one_its_experts_in_natural_order(tmp_path, monkeypatch):
    """Twelve experts stored one tensor each: the streamed reader assembles gate_up_proj and down_proj exactly as the
    loaded model holds them, expert 10 after expert 9 (in the names' string order it would come after expert 1)."""
    from transformers import core_model_loading

    from perm_core.stream.layout import StreamedModel

    model, _, directory = saved("mixtral", tmp_path, num_local_experts=12)
    stored = ShardReader(directory).names()
    assert "model.layers.0.block_sparse_moe.experts.10.w1.weight" in stored
    assert not any(n.endswith("gate_up_proj") for n in stored)
    loaded = dict(hf.MixtralForCausalLM.from_pretrained(directory, dtype=torch.float32).named_parameters())
    streamed = StreamedModel(directory, torch.float32)
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert streamed.reader.entries[name].shape == tuple(loaded[name].shape) == (
            (12, 32, 48) if "gate_up" in name else (12, 48, 16))
        assert torch.equal(streamed.reader.read(name), loaded[name]), name
    assert streamed.bytes_of(["model.layers.1.mlp.experts.gate_up_proj"]) == 12 * 32 * 48 * 4
    with pytest.raises(CheckpointError, match="assembled from 24 stored tensors"):
        streamed.reader.rows("model.layers.1.mlp.experts.gate_up_proj", [0])
    # the control: the experts collected in the names' string order are another parameter
    monkeypatch.setattr(core_model_loading, "dot_natural_key", lambda name: name)
    shuffled = StreamedModel(directory, torch.float32)
    read = shuffled.reader.read("model.layers.1.mlp.experts.gate_up_proj")
    assert not torch.equal(read, loaded["model.layers.1.mlp.experts.gate_up_proj"])
    assert torch.equal(read[2], loaded["model.layers.1.mlp.experts.gate_up_proj"][10])  # 0, 1, 10, 11, 2, ...


def test_a_conversion_that_is_not_a_rearrangement_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """A converter step that is not known to move stored values only (here stacking, taken off the list as a
    dequantization would be off it) is not streamed: the checkpoint's bytes would not be the parameter's."""
    from perm_core.stream import fused

    saved("qwen3_moe", tmp_path)
    assert cli_here(capsys, "check", str(tmp_path / "qwen3_moe"), "--stream", "--symmetry", "experts",
                    "--dtype", "float64").returncode == 0  # the control: stacking and concatenating stream
    monkeypatch.setattr(fused, "REARRANGING", tuple(s for s in fused.REARRANGING if s != "MergeModulelist"))
    result = cli_here(capsys, "check", str(tmp_path / "qwen3_moe"), "--stream", "--symmetry", "experts")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "MergeModulelist" in line and "not only renamed or rearranged" in line


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_the_merged_expert_axes_stream_as_one_space(family, tmp_path):
    """The fused tensors' expert and neuron axes are read as one Merged space by the streamed check's claims, as by the
    whole model's: the experts' rows move with their router rows."""
    _, inputs, directory = saved(family, tmp_path)
    from perm_core.stream.layout import StreamedModel

    streamed = StreamedModel(directory, torch.float64)
    fused = [n for n in streamed.names if n.endswith(("gate_up_proj", "down_proj"))]
    assert len(fused) == 4 and all(any(isinstance(a, Merged) for a in streamed.claims[n].rule.axes) for n in fused)
    report = stream_check(directory, inputs, ["experts"], key=3)
    assert report.passed and report.checks[0].max_rel_error < ROUNDOFF_NOISE


def test_a_mixture_of_experts_is_held_within_its_memory_bound_in_a_fresh_process(tmp_path):
    """A streamed float64 check of a 10-block Mixtral with blocks of about 53 MiB (its fused gate|up tensor 32 MiB of
    them), experts and the neurons inside them both moved, in a process of its own so that the peak resident memory
    is the check's: held within its bound, each stage's own mark, far below the whole model (test_stream's
    held_within_its_bound). Ten blocks, not eight: the bound counts the largest tensor twice, and a fused expert
    tensor is most of its block."""
    from tests.unit.json_schema import validated
    from tests.unit.test_cli import cli
    from tests.unit.test_stream import held_within_its_bound

    shape = dict(hidden_size=512, intermediate_size=1024, num_local_experts=4, num_experts_per_tok=2,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_hidden_layers=10)
    _, _, directory = saved("mixtral", tmp_path, shard="8MB", **shape)
    result = cli("check", str(directory), "--stream", "--symmetry", "experts", "--symmetry", "mlp", "--json")
    assert result.returncode == 0, result.stderr
    report = validated("check", result.stdout)
    assert report["passed"]
    memory = report["streamed"]["memory"]
    assert memory["largest_block_bytes"] > 50 * 2**20 and memory["largest_tensor_bytes"] == 4 * 2048 * 512 * 8
    held_within_its_bound(memory, directory, middle_block="block 4", last_block="block 9")
