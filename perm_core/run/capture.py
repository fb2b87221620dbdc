"""The input of one module, recorded in the calling thread only.

A shared model is run by many sessions at once, so a hook added for one run would see the others. Each module
that was ever asked for gets one permanent pre-hook that records only when the thread running it asked for that
module; other threads' forwards pass through it untouched, and no lock holds the model.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from perm_core.engine.tokens import model_inputs
from perm_core.run.stateless import functional_call

_WANTED = threading.local()  # .request: (module, box, stop) of the capture in progress in this thread
_HOOKING = threading.Lock()


class Captured(Exception):
    """Raised by the hook of a stopping capture once it holds the input: the rest of the forward (later blocks,
    a language model's head) would compute nothing that is shown."""


def _record(module, args):
    request = getattr(_WANTED, "request", None)
    if request is not None and request[0] is module:
        request[1]["input"] = args[0].detach()
        if request[2]:
            raise Captured


def _hooked(module: torch.nn.Module) -> None:
    with _HOOKING:
        if not getattr(module, "_tse_capture_hook", False):
            module.register_forward_pre_hook(_record)
            module._tse_capture_hook = True


@contextmanager
def capturing(model: torch.nn.Module, module_name: str, stop: bool = False):
    """Yields a dict whose "input" is the module's first input once the forward inside reached it; stop=True
    ends that forward there (catch Captured)."""
    with recording(model.get_submodule(module_name), stop) as box:
        yield box


@contextmanager
def recording(module: torch.nn.Module | None, stop: bool = False):
    """capturing, given the module itself; None: nothing is recorded in this thread meanwhile (a capture around
    it waits until the body is done)."""
    if module is not None:
        _hooked(module)
    box: dict[str, torch.Tensor] = {}
    previous = getattr(_WANTED, "request", None)
    _WANTED.request = (module, box, stop) if module is not None else None
    try:
        yield box
    finally:
        _WANTED.request = previous


def request_here():
    """(module, box, stop) of the capture in progress in this thread, or None."""
    return getattr(_WANTED, "request", None)


def output_projection(subject, layer: int) -> str:
    """The module of block `layer`'s MLP output projection (the spec's "mlp.out" weight): its input is the MLP's
    hidden activation, [B, T, d_mlp], in every dense family. A mixture of experts has none such: its experts run
    on tokens flattened to [B * T, d] (and Qwen2-MoE's shared expert too), so its blocks are told as MLP-less."""
    if subject.geometry.n_experts:
        raise ValueError(f"the blocks of {subject.family.name} are mixtures of experts: no dense MLP to view")
    for name, claim in subject.claims.items():
        if claim.layer == layer and claim.rule.tag == "mlp.out" and subject.params[name].dim() == 2:
            return name.rsplit(".", 1)[0]
    raise ValueError(f"block {layer} of {subject.family.name} has no MLP output projection")


def stopped_input(subject, params: dict, scramble, module_name: str, inputs: dict | None = None) -> torch.Tensor:
    """The module's input from one forward of `params` on the subject's input (or `inputs`) under `scramble`,
    stopped once it reached the module (nothing after it is computed)."""
    with capturing(subject.model, module_name, stop=True) as box:
        try:
            with torch.no_grad():
                kwargs = model_inputs(subject.inputs if inputs is None else inputs, subject.geometry, scramble,
                                      subject.dtype)
                functional_call(subject.model, params, args=(), kwargs=kwargs, strict=False)
        except Captured:
            pass
    if "input" not in box:
        raise RuntimeError(f"{module_name} was not called in the forward pass")
    return box["input"]


_CALLS = threading.local()  # .boxes: {module: box} of the call recordings in progress in this thread


def _record_call(module, args):
    box = (getattr(_CALLS, "boxes", None) or {}).get(module)
    if box is not None:
        box["args"] = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)


@contextmanager
def recording_calls(model: torch.nn.Module, module_names):
    """{name: box} for several modules at once, beside any capture: each box's "args" are the positional arguments
    of that module's last call in this thread meanwhile (a forward that never calls it leaves its box empty). The
    hooks are permanent and pass other threads' calls through untouched, as capturing's do."""
    modules = {name: model.get_submodule(name) for name in module_names}
    with _HOOKING:
        for module in modules.values():
            if not getattr(module, "_tse_call_hook", False):
                module.register_forward_pre_hook(_record_call)
                module._tse_call_hook = True
    boxes = {name: {} for name in modules}
    previous = getattr(_CALLS, "boxes", None)
    _CALLS.boxes = {**(previous or {}), **{modules[name]: boxes[name] for name in modules}}
    try:
        yield boxes
    finally:
        _CALLS.boxes = previous
