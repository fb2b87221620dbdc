"""compare A B: the element that maps a checkpoint to its scrambled copy is recovered exactly from the weights
(every permutation index equal to the key's, rotations to 1e-12), and near misses are told apart."""

from __future__ import annotations

import copy

import pytest
import torch

from perm_core.__main__ import main
from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble, transform_params
from perm_core.engine.symmetries import WEIGHT_SYMMETRIES, build_many
from perm_core.engine.transforms import Permutation, apply_chain, composed
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.models.registry import FAMILIES
from perm_core.verify import recover as recover_module
from perm_core.verify.recover import recover
from perm_core.verify.same_function import IncomparableError, compare_models
from perm_core.verify.subject import Subject
from tests.unit.json_schema import validated

KEY = 7


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(family: str, seed: int = 0):
    return build_random_model(family, seed=seed, dtype=torch.float64)[0]


def probes(family: str, model) -> list[dict]:
    return [random_inputs(family, model, seed) for seed in (0, 1)]


def with_params(model, params: dict[str, torch.Tensor]):
    """A separate model holding `params` (ties follow the named, de-duplicated parameters)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in other.named_parameters():
            param.copy_(params[name])
    return other


def scrambled(model, names=WEIGHT_SYMMETRIES, key=KEY):
    subject = Subject(model)
    element = build_many({name: key for name in names}, subject.geometry)
    return with_params(model, subject.transformed_params(element)), element


def matrix(chain, size: int) -> torch.Tensor:
    return apply_chain(chain, torch.eye(size, dtype=torch.float64), 0)


def only_permutation(chain) -> torch.Tensor:
    (merged,) = composed(chain)
    assert isinstance(merged, Permutation)
    return merged.index


@pytest.mark.parametrize("family", FAMILIES)
def test_every_weight_symmetry_is_recovered_exactly(family):
    a = tiny(family)
    b, key = scrambled(a)
    result = compare_models(a, b, probes(family, a), "A", "B")
    assert result.verdict == "same function" and result.exit_code == 0
    assert result.output_error < 1e-12 and result.residual < 1e-12
    assert {e.name for e in result.outputs} & {"output.logits", "output.last_hidden"}
    assert {e.name for e in result.tensors} >= {"embed", "blocks.0.hidden", "blocks.0.attn", "blocks.1.hidden"}
    assert all(e.max_rel_error < 1e-12 for e in result.tensors)
    before = max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert before > 0.1  # the key really moved the weights
    found = result.recovered.element
    for space, chain in key.spaces.items():
        if space[0] in ("resid", "heads", "mlp"):  # pure permutations: the very same index
            assert torch.equal(only_permutation(found.spaces[space]), only_permutation(chain)), space
        elif space[0] == "router_shift":  # a translation: the same vector (and offset, where a router bias takes it)
            (mine,), (theirs,) = found.spaces[space], chain
            assert (mine.vector - theirs.vector).abs().max() < 1e-12, space
            assert abs(mine.offset - theirs.offset) < 1e-12 if family == "gpt_oss" else mine.offset == 0, space
        else:  # head permutation, then an orthogonal map per head: equal as matrices
            size = chain[0].size
            assert (matrix(found.spaces[space], size) - matrix(chain, size)).abs().max() < 1e-12, space
    summary = result.recovered.summary()
    assert summary["channels"]["moved"] > summary["channels"]["of"] // 2
    assert summary["rotation"]["rotated"] == summary["rotation"]["of"] > 0


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox", "t5"])
def test_head_channel_permutations_are_recovered_as_the_keys_permutations(family):
    a = tiny(family)
    b, key = scrambled(a, ("channels", "heads", "head_channels", "mlp"))
    subject = Subject(a)
    found = recover(subject.params, dict(b.named_parameters()), subject.spec, subject.claims, subject.geometry)
    assert all(m.permutation is not None for m in found.in_head.values())
    assert found.summary()["rotation"]["rotated"] == 0 and found.summary()["head_channels"]["moved"] > 0
    for space, chain in key.spaces.items():
        assert torch.equal(only_permutation(found.element.spaces[space]), only_permutation(chain)), space


def test_a_wrong_element_leaves_a_residual_and_breaks_the_traced_tensors():
    """The residual is what vouches for the recovery: two residual channels swapped must show in the weights
    and in every un-scrambled hidden state (the outputs alone cannot tell: the wrong element is a symmetry too)."""
    a = tiny("llama")
    b, _ = scrambled(a)
    subject = Subject(a, random_inputs("llama", a))
    found = recover(subject.params, dict(b.named_parameters()), subject.spec, subject.claims, subject.geometry)
    index = found.resid.clone()
    index[[0, 1]] = index[[1, 0]]
    wrong = Scramble({**found.element.spaces, ("resid", None): (Permutation(index),)})
    moved = transform_params(subject.params, subject.spec, wrong, subject.claims)
    params_b = dict(b.named_parameters())
    assert max((moved[n] - params_b[n]).abs().max() / params_b[n].abs().max() for n in params_b) > 0.1
    original, traced_b = subject.trace(), Subject(b, subject.inputs).trace()
    for element, low, high in ((found.element, 0.0, 1e-12), (wrong, 1e-3, float("inf"))):
        restored = subject.unscramble(traced_b, element)
        for name in ("embed", "blocks.0.hidden", "blocks.1.hidden"):
            difference = (restored[name] - original[name].tensor).abs().max() / original[name].tensor.abs().max()
            assert low <= difference < high, (name, difference)


@pytest.mark.parametrize("family", ["gpt2", "llama", "dinov2"])
def test_one_weight_nudged_is_a_different_function_and_named(family):
    a = tiny(family)
    b, _ = scrambled(a)
    name = next(n for n, c in Subject(b).claims.items()
                if c.rule.tag == "mlp.out" and c.layer == 1 and b.get_parameter(n).dim() == 2)
    with torch.no_grad():
        weight = b.get_parameter(name)
        weight[3, 5] += 1e-3 * weight.abs().max()
    result = compare_models(a, b, probes(family, a))
    assert result.verdict == "different functions" and result.exit_code == 1
    assert 1e-9 < result.output_error
    worst = max(result.parameters, key=lambda e: e.max_rel_error)
    assert worst.name == name and worst.max_rel_error == pytest.approx(1e-3, rel=1e-6)
    assert name in result.explanation()
    others = [e.max_rel_error for e in result.parameters if e.name != name]
    assert max(others) < 1e-12  # the alignment itself is still exact: only the nudge remains


@pytest.mark.parametrize("family", ["vit", "bert", "llama"])
def test_unrelated_models_are_different_functions(family):
    a, b = tiny(family, seed=0), tiny(family, seed=1)
    result = compare_models(a, b, probes(family, a))
    assert result.verdict == "different functions" and result.exit_code == 1
    assert result.output_error > 0.01 and result.residual > 0.1
    assert result.recovered.summary()["channels"]["moved"] > 0  # the best alignment is still a real element


def test_a_weight_no_output_reads_gives_same_function_without_the_element():
    """Dinov2Model's mask token only replaces masked patches (pre-training): changing it keeps the function."""
    a = tiny("dinov2")
    b, _ = scrambled(a)
    with torch.no_grad():
        b.get_parameter("embeddings.mask_token").add_(0.5)
    result = compare_models(a, b, probes("dinov2", a))
    assert result.same_function and result.output_error < 1e-12
    assert result.verdict == "same function, element not recovered" and result.exit_code == 1
    assert max(result.parameters, key=lambda e: e.max_rel_error).name == "embeddings.mask_token"


def test_models_of_two_families_or_precisions_are_refused():
    with pytest.raises(IncomparableError, match="gpt2 model and B a bert"):
        compare_models(tiny("gpt2"), tiny("bert"), [])
    with pytest.raises(IncomparableError, match="float32"):
        compare_models(tiny("gpt2"), build_random_model("gpt2")[0], [])


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_scrambled_copy_json_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "scrambled"
    argv = ["scramble", "random:gpt2", "--key", "11", "--dtype", "float64", "--out", str(out)]
    assert main(argv + [a for name in WEIGHT_SYMMETRIES for a in ("--symmetry", name)]) == 0
    capsys.readouterr()
    code, stdout, _ = run_cli(capsys, "random:gpt2", str(out), "--json")
    assert code == 0
    report = validated("compare", stdout)
    assert {"a", "b", "family", "same_function", "output_error", "recovered", "residual", "tensors",
            "verdict"} <= set(report)
    assert report["family"] == "gpt2" and report["same_function"] is True and report["verdict"] == "same function"
    assert set(report["recovered"]) == set(WEIGHT_SYMMETRIES) and "tokens" in report["not_recovered"]
    assert report["recovered"]["channels"] == {"moved": report["recovered"]["channels"]["moved"], "of": 32}
    assert report["residual"]["max_rel_error"] < 1e-12 and report["residual"]["worst_tensor"]
    assert {t["name"] for t in report["tensors"]} >= {"output.logits", "blocks.1.attn"}
    code, stdout, _ = run_cli(capsys, "random:gpt2", str(out))
    assert code == 0 and "VERDICT: same function" in stdout and "tokens         not recovered" in stdout

    unrelated = tmp_path / "seed1"
    build_random_model("gpt2", seed=1)[0].save_pretrained(unrelated)
    code, stdout, _ = run_cli(capsys, "random:gpt2", str(unrelated), "--json")
    assert code == 1 and validated("compare", stdout)["verdict"] == "different functions"


@pytest.mark.parametrize("argv, message", [
    (["random:gpt2", "random:bert"], "A is a gpt2 model and B a bert model"),
    (["random:gpt2", "random:nope"], "Unknown random family"),
    (["random:gpt2", "random:gpt2", "--probes", "0"], "--probes must be between 1 and 16"),
])
def test_cli_bad_usage_exits_2_with_one_line(capsys, argv, message):
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 2 and stdout == ""
    assert message in stderr and stderr.count("\n") == 1


def test_weights_moved_by_a_non_symmetry_are_a_different_function():
    """A general Q/K rotation on a RoPE model: the weights are A's moved by an orthogonal map that the recovery
    finds exactly (residual at round-off), but RoPE does not commute with it, so the outputs differ."""
    a = tiny("llama")
    subject = Subject(a)
    not_a_symmetry = symmetries.rotation(KEY, subject.geometry, general_qk=True)
    b = with_params(a, subject.transformed_params(not_a_symmetry))
    result = compare_models(a, b, probes("llama", a))
    assert result.residual < 1e-12 and result.output_error > 1e-3
    assert result.verdict == "different functions" and "not a symmetry of llama" in result.explanation()


def test_a_few_evenly_spaced_features_per_parameter_still_recover_the_channels(monkeypatch):
    """Real vocabularies are capped (FEATURES_PER_PARAMETER); the cap must not cost exactness."""
    monkeypatch.setattr(recover_module, "FEATURES_PER_PARAMETER", 5)
    a = tiny("bert")
    b, key = scrambled(a)
    subject = Subject(a)
    assert recover_module.rows(subject.params, subject.claims, "resid", None, plain=True).shape[1] < 60
    found = recover(subject.params, dict(b.named_parameters()), subject.spec, subject.claims, subject.geometry)
    assert torch.equal(found.resid, only_permutation(key.spaces[("resid", None)]))
