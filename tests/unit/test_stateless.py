"""Two threads on one shared model: torch's functional_call leaves the model with a session's weights for good;
perm_core.run.stateless.functional_call keeps it, and each session computes with its own (found by
benchmarks/classroom.py)."""

import itertools
import threading
import time

import pytest
import torch
from torch.func import functional_call as torch_functional_call

from perm_core.run.stateless import functional_call, model_lock, own_dtype, own_parameters


class SlowLinear(torch.nn.Module):
    """A linear layer whose forward pauses mid-call (50 ms, or until `pause` returns) for another thread to step in."""

    def __init__(self, pause=lambda: time.sleep(0.05)):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.pause = pause

    def forward(self, x):
        self.pause()
        return self.linear(x)


def _two_sessions(call) -> tuple[SlowLinear, dict, dict]:
    """Session a's forward, then b's, overlapping by events, not by sleeps: a's forward waits (1 s at most) for b's
    to begin, and b's for a's call to end. Without a lock b swaps its weights in mid-call of a's and, ending last,
    puts back what it found (a's); with the lock b cannot begin, so a goes on after its 1 s and b runs after it."""
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    calls = itertools.count()

    def pause():
        if next(calls) == 0:
            first_in.set()
            second_in.wait(1)
        else:
            second_in.set()
            first_done.wait(10)

    torch.manual_seed(0)
    model = SlowLinear(pause)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 4)
    params = {name: {k: torch.randn_like(v) for k, v in original.items()} for name in ("a", "b")}
    outputs = {}

    def session(name):
        if name == "b":
            first_in.wait(10)
        with torch.no_grad():
            outputs[name] = call(model, params[name], (x,))
        if name == "a":
            first_done.set()

    threads = [threading.Thread(target=session, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = {name: x @ p["linear.weight"].T + p["linear.bias"] for name, p in params.items()}
    return model, original, {name: (outputs[name], expected[name]) for name in outputs}


def test_torch_functional_call_is_not_safe_for_a_shared_model():
    """The control: without the lock, the model is left holding a session's weights for good."""
    model, original, _ = _two_sessions(torch_functional_call)
    assert not torch.equal(model.state_dict()["linear.weight"], original["linear.weight"])


def test_locked_functional_call_keeps_the_model_and_each_sessions_weights():
    model, original, outputs = _two_sessions(functional_call)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    for name, (got, expected) in outputs.items():
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=name)


def test_one_lock_per_model_and_reentrant():
    a, b = SlowLinear(), SlowLinear()
    assert model_lock(a) is model_lock(a) and model_lock(a) is not model_lock(b)
    with model_lock(a):  # hooks installed under the lock, then a call on the same model in the same thread
        out = functional_call(a, dict(a.named_parameters()), (torch.ones(1, 4),))
    assert out.shape == (1, 3)


@pytest.mark.parametrize("dtype", [torch.float64])
def test_a_float64_call_leaves_a_float32_model_float32(dtype):
    model = SlowLinear()
    params = {k: v.to(dtype) for k, v in model.state_dict().items()}
    functional_call(model, params, (torch.ones(1, 4, dtype=dtype),))
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_readers_see_the_models_own_parameters_while_another_session_runs_float64():
    seen, entered, read = {}, threading.Event(), threading.Event()
    model = SlowLinear(pause=lambda: read.wait(10))  # the session stays mid-call until the reader has read
    own = dict(model.named_parameters())
    params = {k: v.detach().double() for k, v in own.items()}
    model.register_forward_pre_hook(lambda *_: entered.set())  # the swap is in place from here to the end

    def session():
        functional_call(model, params, (torch.ones(1, 4, dtype=torch.float64),))

    def reader():
        entered.wait(10)  # mid-call of the other session
        seen["unlocked"] = next(model.parameters()).dtype  # the control: what a bare read sees then
        read.set()  # the session may end now; the reads under the lock below wait for it
        seen["dtype"] = own_dtype(model)
        seen["params"] = own_parameters(model)

    threads = [threading.Thread(target=session), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["unlocked"] == torch.float64
    assert seen["dtype"] == torch.float32
    assert all(seen["params"][k] is own[k] for k in own)


def test_a_known_dtype_is_answered_while_another_session_holds_the_model():
    """Every rerun of an image page reads the model's dtype: once known, it must not wait for another session's
    forward (which holds the model's lock with float64 tensors swapped in)."""
    model = SlowLinear()
    assert own_dtype(model) == torch.float32  # learnt once, as shared_model does after loading
    holding, answered = threading.Event(), threading.Event()
    seen = {}

    def session():
        with model_lock(model):
            model.linear.weight.data = model.linear.weight.data.double()  # a swapped-in float64 copy
            holding.set()
            seen["answered while held"] = answered.wait(10)
            model.linear.weight.data = model.linear.weight.data.float()

    thread = threading.Thread(target=session)
    thread.start()
    holding.wait(10)
    seen["dtype"] = own_dtype(model)
    answered.set()
    thread.join()
    assert seen == {"dtype": torch.float32, "answered while held": True}
    fresh = SlowLinear().double()
    assert own_dtype(fresh) == torch.float64  # each model its own
