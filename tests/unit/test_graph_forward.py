"""A key change's forward as one TorchScript graph (perm_core.fast.graph_forward): the eager forward's numbers bit for
bit in every family, on weights and inputs other than the ones it was traced on, with controls that show each
safeguard is needed (a graph keyed without its inputs' values, one traced while transformers knows it is
traced, one that draws random numbers)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from perm_core.explore.exploration import Exploration
from perm_core.families import family_names
from perm_core.fast import graph_forward
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.run.threads import TorchWorkCalls

KEYS = ({"tokens": 5, "channels": 3, "heads": 2, "mlp": 7}, {"tokens": 6, "channels": 11, "heads": 2, "mlp": 1})


def records_equal(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [name for name in a if not torch.equal(a[name].tensor, b[name].tensor)]


# A mixture of experts loops over the experts its router chose, a branch on the weights' values that a trace would
# bake in: it always runs eager (test_a_mixture_of_experts_is_never_traced).
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", [family for family in family_names() if family not in MOE])
def test_every_family_graph_gives_the_eager_numbers_bit_for_bit(family, dtype):
    """Random weights with non-trivial norms, biases and positions (and a padded last token); the second key set
    has another tokens key, and reuses the first's graph: the key holds the inputs' sorted values."""
    model, _ = build_random_model(family, dtype=dtype, seed=4)
    explorer = Exploration(model, random_inputs(family, model, seed=4))
    for keys in KEYS:
        scramble, _ = explorer.scramble_for(keys, None)
        params, _ = explorer.params_for(scramble, keys, None)
        eager = explorer.subject.trace(scramble, params=params)
        explorer.subject.trace(scramble, params=params, graph=True)  # a signature is traced when seen again
        graphed = explorer.subject.trace(scramble, params=params, graph=True)
        assert records_equal(eager, graphed) == []
        assert any(torch.count_nonzero(r.tensor) for r in graphed.values())
    graphs = graph_forward._graphs.get(model, {})
    assert graphs and all(g is not None for g in graphs.values()), "the graph was refused: nothing was compared"
    assert len(graphs) == 1  # both key sets ran one graph


@pytest.mark.parametrize("family", MOE)
def test_a_mixture_of_experts_is_never_traced(family):
    model, _ = build_random_model(family, dtype=torch.float64, seed=4)
    explorer = Exploration(model, random_inputs(family, model, seed=4))
    scramble, _ = explorer.scramble_for({"experts": 3}, None)
    params, _ = explorer.params_for(scramble, {"experts": 3}, None)
    eager = explorer.subject.trace(scramble, params=params)
    for _ in range(2):  # a dense model's signature is traced the second time
        assert records_equal(eager, explorer.subject.trace(scramble, params=params, graph=True)) == []
    assert not graph_forward._graphs.get(model) and not graph_forward._seen.get(model)


def test_the_graph_is_checked_against_eager_and_that_check_can_fail():
    """DINOv2 uses its position embeddings as they are unless torch.jit.is_tracing() says True; traced while
    transformers knows, the graph interpolates them and its numbers differ. The build check refuses it."""
    model, _ = build_random_model("dinov2", dtype=torch.float64, seed=3)
    explorer = Exploration(model, random_inputs("dinov2", model, seed=3))
    keys = {"channels": 3}
    scramble, _ = explorer.scramble_for(keys, None)
    params, _ = explorer.params_for(scramble, keys, None)
    kwargs = {"pixel_values": explorer.subject.inputs["pixel_values"].double(), "output_hidden_states": True,
              "output_attentions": True}
    assert isinstance(graph_forward.GraphForward(model, params, kwargs), graph_forward.GraphForward)
    original = graph_forward._as_eager
    graph_forward._as_eager = nullcontext
    try:
        with pytest.raises(graph_forward.GraphRefused, match="differ from the eager"):
            graph_forward.GraphForward(model, params, kwargs)
    finally:
        graph_forward._as_eager = original
    assert torch.jit.is_tracing is graph_forward._real_is_tracing and not torch.jit.is_tracing()


class Branching(torch.nn.Module):
    """Takes a Python branch on the value of its first token: permuting the tokens changes it."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.scale = torch.nn.Parameter(torch.tensor([2.0, 3.0, 4.0, 5.0]))

    def forward(self, input_ids, **_):
        hidden = self.embed(input_ids)
        if bool(input_ids[0, 0] > 4):
            hidden = hidden * self.scale
        return BaseModelOutput(last_hidden_state=hidden)


def test_a_forward_that_reads_a_value_stays_eager_and_would_be_wrong_as_a_graph(monkeypatch):
    """The key holds the sorted ids (a token key permutes them): right for the reads in READS, which a
    permutation cannot change, wrong for this one, so a trace that reads anywhere else is refused."""
    torch.manual_seed(0)
    model = Branching().eval()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    first, permuted = torch.tensor([[9, 0, 1]]), torch.tensor([[0, 1, 9]])  # one key: the same sorted ids

    def runs(ids):
        with torch.no_grad():
            eager = model(input_ids=ids).last_hidden_state
        graph_forward.forward(model, params, {"input_ids": ids})  # seen once: eager, not traced yet
        return eager, graph_forward.forward(model, params, {"input_ids": ids})

    for ids in (first, permuted):
        assert runs(ids)[1] is None
    assert list(graph_forward._graphs[model].values()) == [None]  # refused: the read is not in READS
    graph_forward._graphs.pop(model)
    monkeypatch.setattr(graph_forward, "READS", (*graph_forward.READS, ("test_graph_forward.py",
                                                                      "if bool(input_ids[0, 0] > 4):")))
    eager, graphed = runs(first)
    assert torch.equal(eager, graphed.last_hidden_state)
    eager, graphed = runs(permuted)  # the control: the first ids' branch is replayed
    assert not torch.equal(eager, graphed.last_hidden_state)
    graph_forward._graphs.pop(model)


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, input_ids, **_):
        return BaseModelOutput(last_hidden_state=self.weight * torch.rand(3))


def test_a_graph_whose_numbers_differ_from_eager_is_refused_and_the_forward_stays_eager():
    model = Noisy().eval()
    params = dict(model.named_parameters())
    for _ in range(3):
        assert graph_forward.forward(model, params, {"input_ids": torch.tensor([[1]])}) is None
    assert list(graph_forward._graphs[model].values()) == [None]  # not traced again for this signature


def test_a_parameter_off_alignment_is_packed_as_it_lies_and_others_stay_eager(monkeypatch):
    """The parameter cache hands out small tensors as slices of one batch: the graph's copy starts at the same
    place within a 64-byte line. Not dense, too large or training: eager."""
    model, _ = build_random_model("gpt2", seed=1)
    inputs = random_inputs("gpt2", model, seed=1)
    params = {name: p.detach() for name, p in model.named_parameters()}
    kwargs = {**inputs, "output_hidden_states": True}
    first = next(name for name, p in params.items() if p.dim() == 2)
    shifted = torch.empty(params[first].numel() + 3)[3:].view(params[first].shape)
    shifted.copy_(params[first] * 1.5)
    moved = {**params, first: shifted}
    with torch.no_grad():
        eager = model(**kwargs).hidden_states
    graph_forward.forward(model, moved, kwargs)
    graphed = graph_forward.forward(model, moved, kwargs)
    assert graph_forward._shift(shifted) == 3 and graphed is not None
    with torch.no_grad():
        from perm_core.run.stateless import functional_call
        expected = functional_call(model, moved, args=(), kwargs=kwargs).hidden_states
    assert all(map(torch.equal, graphed.hidden_states, expected))
    assert not torch.equal(graphed.hidden_states[-1], eager[-1])  # the moved weight mattered
    assert graph_forward.forward(model, {**params, first: params[first].t().contiguous().t()}, kwargs) is None
    monkeypatch.setattr(graph_forward, "GRAPH_MAX_BYTES", 1000)
    assert graph_forward.forward(model, params, kwargs) is None
    monkeypatch.undo()
    model.train()
    try:
        assert graph_forward.forward(model, params, kwargs) is None
    finally:
        model.eval()


def test_a_graph_forward_makes_two_torch_calls_where_eager_makes_dozens():
    """Each torch call made from Python waits for the GIL once under a classroom's load (benchmarks/
    gil_contention.py measures the seconds)."""
    model, _ = build_random_model("vit", seed=2)
    explorer = Exploration(model, random_inputs("vit", model, seed=2))
    keys = {"channels": 3}
    scramble, _ = explorer.scramble_for(keys, None)
    params, _ = explorer.params_for(scramble, keys, None)
    for _ in range(2):  # seen, then traced
        explorer.subject.trace(scramble, params=params, graph=True)
    with TorchWorkCalls() as eager:
        explorer.subject.trace(scramble, params=params)
    with TorchWorkCalls() as graphed:
        explorer.subject.trace(scramble, params=params, graph=True)
    assert eager.count > 50 and graphed.count <= 2, (eager.count, graphed.count)


def test_graphs_per_model_are_bounded():
    model, _ = build_random_model("bert", seed=5)
    params = {name: p.detach() for name, p in model.named_parameters()}
    for length in range(3, 4 + graph_forward.GRAPHS_PER_MODEL):
        ids = torch.arange(length)[None] % 50
        graph_forward.forward(model, params, {"input_ids": ids})
        assert graph_forward.forward(model, params, {"input_ids": ids}) is not None
    assert len(graph_forward._graphs[model]) == graph_forward.GRAPHS_PER_MODEL


def test_a_signature_seen_once_runs_eager_and_is_traced_when_it_comes_back():
    """A text's tokens key gives every key a signature of its own: tracing each would cost three forwards."""
    model, _ = build_random_model("llama", seed=7)
    params = {name: p.detach() for name, p in model.named_parameters()}
    ids = torch.arange(6)[None]
    assert graph_forward.forward(model, params, {"input_ids": ids}) is None
    assert model not in graph_forward._graphs or not graph_forward._graphs[model]
    assert graph_forward.forward(model, params, {"input_ids": ids}) is not None
    assert graph_forward.forward(model, params, {"input_ids": ids.flip(1)}) is not None  # a token key's: the same
    assert graph_forward.forward(model, params, {"input_ids": ids + 1}) is None  # another signature
    assert len(graph_forward._graphs[model]) == 1
