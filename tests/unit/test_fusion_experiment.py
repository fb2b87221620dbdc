"""The fusion experiment on tiny pairs: every method's aligned B is B's function in float64 and its negative
control breaks; activation and weight matching undo a hidden scramble; the verdict reads the intervals."""


import pytest
import torch

from perm_core.__main__ import main
from perm_core.applications import fusion_experiment as fx
from perm_core.applications.activation_matching import align_by_activations, record_activations
from perm_core.applications.fusion import cached_split
from perm_core.applications.fusion_pairs import PairSettings, held_out_split, train_member
from perm_core.applications.intervals import Interval
from perm_core.applications.matching import align_by_weights, distance
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT
from tests.unit.json_schema import each_required_field_is_named, validated

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = PairSettings(width=16, layers=2, heads=4, epochs=1)


@pytest.fixture(scope="module")
def pair():
    return train_member(TINY, 0), train_member(TINY, 1)


def test_the_pair_trains_on_the_split_less_the_held_out_images(pair):
    fit, held = held_out_split()
    assert len(held) == 200 and len(fit) + len(held) == len(cached_split()[1])
    assert not set(fit.tolist()) & set(held.tolist())
    assert all(next(m.parameters()).dtype == torch.float64 for m in pair)
    assert not torch.equal(pair[0].classifier.weight, pair[1].classifier.weight)  # two seeds


def test_every_method_is_b_in_float64_and_its_negative_control_breaks(pair):
    run = fx.run_pair(*pair, (0, 1), [0.0, 0.5, 1.0])
    assert [m.method for m in run.methods] == list(fx.METHODS)
    average, *aligned = run.methods
    assert average.proved is None and average.proof_error is None and average.distance_after == average.distance_before
    for m in aligned:
        assert m.proved, m.method
        assert m.proof_error < 1e-9 and m.control_error > BROKEN_AT, m.method
        assert m.distance_after < m.distance_before, m.method
        # the path's far end is aligned B, which computes what B computes
        assert m.path_loss[-1] == pytest.approx(run.loss_b, rel=1e-9) and m.path_loss[0] == run.loss_a
        assert m.accuracy == m.path_accuracy[1] and m.barrier >= 0


@pytest.mark.parametrize("method", ["permutation", "permutation+rotation"])
def test_matching_undoes_a_hidden_scramble_of_the_same_model(pair, method):
    """B := A with its residual channels, heads, MLP neurons (and per-head rotations) scrambled: both matchers
    must find a B at distance ~0 from A."""
    model = pair[0]
    subject = Subject(model, {"pixel_values": cached_split()[2][:1].double()})
    keys = {"channels": 3, "heads": 4, "mlp": 5, **({"rotation": 6} if "rotation" in method else {})}
    scrambled = subject.transformed_params(subject.build(keys))
    before = distance(subject.params, scrambled)
    held = held_out_split()[1]
    acts_a = record_activations(model, cached_split()[0][held])
    acts_b = record_activations(model, cached_split()[0][held], scrambled)
    by_activations = align_by_activations(method, acts_a, acts_b, subject.geometry)
    by_weights = align_by_weights(method, subject.params, scrambled, subject.spec, subject.claims, subject.geometry)
    from perm_core.engine.spec import transform_params
    for found in (by_activations, by_weights):
        after = distance(subject.params, transform_params(scrambled, subject.spec, found, subject.claims))
        assert before > 1 and after < 1e-6 * before


def test_the_verdict_reads_the_intervals():
    adds, unclear = Interval(1.8, 0.9, 2.7, 5, 0.95), Interval(0.4, -1.2, 2.0, 5, 0.95)
    sentence = fx.verdict({"activations": adds, "weights": unclear})
    assert sentence.startswith("Over 5 seed pairs")
    assert "+1.8 points with activation matching (95 % interval +0.9 to +2.7: rotation adds)" in sentence
    assert "+0.4 points with weight matching (95 % interval -1.2 to +2.0: no difference this many pairs can show)" \
        in sentence
    costs = fx.verdict({"activations": Interval(-2.0, -3.0, -1.0, 5, 0.95), "weights": adds})
    assert "rotation costs" in costs and "rotation adds" in costs


def test_cli_experiment_json_gives_the_figures_and_intervals(capsys):
    code = main(["fuse", "--experiment", "--pairs", "2", "--width", "32", "--epochs", "1", "--points", "3",
                 "--json"])
    out = validated("fuse_experiment", capsys.readouterr().out)
    each_required_field_is_named("fuse_experiment", out)
    assert code == 0
    assert out["settings"]["pairs"] == 2 and out["settings"]["pair"]["width"] == 32
    assert [s["method"] for s in out["summaries"]] == list(fx.METHODS)
    accuracies = [m["accuracy"] for p in out["pairs"] for m in p["methods"] if m["method"] == "average"]
    average = out["summaries"][0]["accuracy"]
    assert average["mean"] == pytest.approx(sum(accuracies) / 2) and average["n"] == 2
    assert average["low"] <= average["mean"] <= average["high"]
    assert set(out["rotation_accuracy_gain"]) == {"weights", "activations"}
    assert out["verdict"] == fx.verdict({k: Interval(**v) for k, v in out["rotation_accuracy_gain"].items()})
    assert all(m["proved"] for p in out["pairs"] for m in p["methods"][1:])


@pytest.mark.parametrize("argv,message", [
    (["fuse"], "two models"),
    (["fuse", "--experiment", "--pairs", "1"], "--pairs"),
    (["fuse", "--experiment", "digits-vit"], "no models"),
    (["fuse", "--experiment", "--epochs", "0"], "--epochs"),
])
def test_cli_bad_experiment_input_exits_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
