"""Fusion: the aligned model is provably B, matching never moves B away from A, the CLI's JSON shape."""


import pytest
import torch

from perm_core.__main__ import main
from perm_core.applications import fusion
from perm_core.applications.matching import METHODS, align, distance
from perm_core.models.registry import load_model
from perm_core.verify.subject import Subject
from tests.unit.json_schema import each_required_field_is_named, validated


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with fusion.one_thread():  # tiny tensors on a shared 2-core machine
        yield


@pytest.fixture(scope="module")
def pair64():
    return load_model("digits-vit", dtype=torch.float64), load_model("digits-vit-b", dtype=torch.float64)


@pytest.fixture(scope="module")
def subjects(pair64):
    _, _, test_x, _ = fusion.cached_split()
    a, b = pair64
    return (Subject(a.model, {"pixel_values": test_x[:1].double()}),
            Subject(b.model, {"pixel_values": test_x[:1].double()}))


@pytest.fixture(scope="module")
def residual(pair64):
    train_x = fusion.cached_split()[0]
    return fusion.residual_candidate(pair64[0].model, pair64[1].model, train_x[:64].double())


@pytest.mark.parametrize("method", ["permutation", "permutation+rotation"])
def test_aligned_model_is_b_in_float64_and_a_misalignment_breaks_it(pair64, subjects, residual, method):
    scramble, _, _ = fusion.aligned_for(method, *subjects, residual)
    assert not scramble.is_identity
    proof = fusion.prove_alignment(pair64[1].model, scramble, n_images=16)
    assert proof.tolerance == 1e-9
    assert proof.passed and proof.max_rel_error < 1e-9
    names = {t["name"] for t in proof.tensors}
    assert {"blocks.0.attn", "blocks.2.hidden", "output.logits"} <= names
    # Negative control: the same alignment without the key side is a different function.
    assert proof.control_broken and proof.control_rel_error > 1e-2


@pytest.mark.parametrize("method", METHODS)
def test_matching_never_increases_the_distance(subjects, residual, method):
    subject_a, subject_b = subjects
    _, aligned, _ = fusion.aligned_for(method, subject_a, subject_b, residual)
    before, after = distance(subject_a.params, subject_b.params), distance(subject_a.params, aligned)
    assert before > 10  # two different seeds: far apart
    assert after <= before + 1e-9
    if method != "average":
        assert after < before - 0.5  # and every real method does move B closer here
    # The symmetries are orthogonal maps: the norm of B never changes, only its position relative to A.
    norm = distance(aligned, {n: torch.zeros_like(t) for n, t in aligned.items()})
    assert norm == pytest.approx(distance(subject_b.params, {n: torch.zeros_like(t)
                                                             for n, t in subject_b.params.items()}), rel=1e-12)


def test_matching_recovers_a_hidden_scramble_of_the_same_model(subjects):
    """B := A scrambled by heads, MLP and rotation keys. Permutation + rotation must undo it (distance ~0)."""
    subject_a, _ = subjects
    hidden = subject_a.build({"heads": 11, "mlp": 12, "rotation": 13})
    scrambled = subject_a.transformed_params(hidden)
    before = distance(subject_a.params, scrambled)
    found = align("permutation+rotation", subject_a.params, scrambled, subject_a.spec, subject_a.claims,
                  subject_a.geometry)
    from perm_core.engine.spec import transform_params
    after = distance(subject_a.params, transform_params(scrambled, subject_a.spec, found, subject_a.claims))
    assert before > 5
    assert after < 1e-9 * before
    # Rotation matching alone cannot undo the MLP permutation.
    rotation_only = align("rotation", subject_a.params, scrambled, subject_a.spec, subject_a.claims,
                          subject_a.geometry)
    partial = distance(subject_a.params, transform_params(scrambled, subject_a.spec, rotation_only,
                                                          subject_a.claims))
    assert partial > 0.1 * before


def test_barrier_height():
    assert fusion.barrier_height([0, 0.5, 1], [1.0, 3.0, 2.0]) == pytest.approx(1.5)
    assert fusion.barrier_height([0, 0.5, 1], [1.0, 1.0, 1.0]) == 0.0


def test_cli_json_shape(capsys):
    code = main(["fuse", "digits-vit", "digits-vit-b", "--method", "average", "--method", "permutation+rotation",
                 "--points", "5", "--json"])
    out = validated("fuse", capsys.readouterr().out)
    each_required_field_is_named("fuse", out)
    assert code == 0
    assert out["model_a"] == "digits-vit" and out["model_b"] == "digits-vit-b"
    assert out["accuracy_a"] > 0.95 and out["accuracy_b"] > 0.95
    assert [m["method"] for m in out["methods"]] == ["average", "permutation+rotation"]
    for m in out["methods"]:
        assert m["path_alpha"] == [0.0, 0.25, 0.5, 0.75, 1.0]
        assert len(m["path_loss"]) == len(m["path_accuracy"]) == 5
        assert m["path_loss"][0] == pytest.approx(out["loss_a"])
        assert m["path_loss"][-1] == pytest.approx(out["loss_b"], abs=1e-4)  # aligned B computes what B does
        assert m["loss"] == m["path_loss"][2] and 0 <= m["accuracy"] <= 1
        assert m["barrier"] >= 0 and m["distance_after"] <= m["distance_before"] + 1e-9
        assert set(m["group_distance_after"]) == {"attention", "mlp", "other"}
    average, aligned = out["methods"]
    assert average["proof"] is None  # plain averaging aligns nothing: no aligned B to prove, no control
    assert aligned["proof"]["passed"] and aligned["proof"]["control_broken"]
    assert average["distance_after"] == average["distance_before"]


@pytest.mark.parametrize("argv", [["fuse", "digits-vit", "digits-vit-b", "--points", "1"],
                                  ["fuse", "digits-vit", "random:vit"],
                                  ["fuse", "digits-vit", "no-such-model"]])
def test_cli_bad_input_exits_2_with_one_line(capsys, argv):
    assert main(argv) == 2
    # (Hugging Face's own loading bar may also write to stderr; our message is one line of its own.)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and len(lines[0]) > len("error: ")
