"""A stock model's forward as one TorchScript graph, so that a run lets the GIL go once instead of once per op.

Why: an app server is one Python process. Every torch call made from Python releases the GIL for its work and
must win it back; beside sessions that draw charts (pure Python), each return waits for them, so an eager
dinov2-s forward (about 450 calls) took 10-13 s beside four busy threads where it takes 0.06 s alone. A traced
graph runs all its ops in C++. Its inputs are one flat buffer per dtype, sliced inside the graph: a tensor
that Python owns (each parameter) costs a GIL round trip whenever the graph takes or drops a reference to it.

Exactness: the graph runs the same ATen ops on the same tensors, with the graph optimizer off (no fusion, no
reordering), and each graph, when built, must equal the eager forward on its parameters bit for bit, or it is
never used.

A trace records the ops one input ran, with every Python branch the model took baked in. Python reads a
tensor's value only where torch warns (TracerWarning), so every such read during a trace is checked against
READS: places that read a shape, or a value that permuting the tokens cannot change (a mask's all()). A trace
with a read anywhere else is refused. So a graph is kept per model and signature: the parameters' names,
shapes and dtypes and each input's shape and dtype, and for inputs other than the image the sorted values
(a token key permutes a text's ids, masks and positions, and each key would otherwise be a trace of its own).
A signature is traced the second time it is asked for (graph_for says why). tests/unit/test_graph_forward.py
runs each family's graph on other weights, keys and inputs against the eager forward, bit for bit.
"""

from __future__ import annotations

import threading
import traceback
import warnings
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import torch
from torch.nn.utils.stateless import _reparametrize_module

from perm_core.run import capture
from perm_core.run.stateless import functional_call, model_lock

GRAPHS_PER_MODEL = 8
SIGNATURES_REMEMBERED = 64  # per model: signatures asked for once, not traced yet
_graphs: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict] = weakref.WeakKeyDictionary()
_seen: weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict] = weakref.WeakKeyDictionary()
_guard = threading.Lock()
# One trace at a time in the process: each swaps the warnings module's process-wide filters and showwarning,
# and two at once would restore each other's. Traces are rare (one per signature).
_TRACING = threading.Lock()
torch._C._set_graph_executor_optimize(False)  # the graph runs its recorded ops as they are (see module doc)


class GraphRefused(Exception):
    """The model's forward cannot be one graph (it reads tensor values, or its graph differs from eager)."""


_real_is_tracing = torch.jit.is_tracing


@contextmanager
def _as_eager():
    """While a graph is traced (one at a time: _TRACING), torch.jit.is_tracing() says False: transformers takes
    other paths when it is True (DINOv2 and ViT then interpolate position embeddings that an eager forward uses
    as they are), and the graph must record the eager forward's ops. Other threads are never tracing, so False
    is true for them."""
    torch.jit.is_tracing = lambda: False
    try:
        yield
    finally:
        torch.jit.is_tracing = _real_is_tracing


# Where Python reads a tensor during a trace of the zoo's families (file, start of the line), each a shape or a value
# that a permutation of the tokens leaves as it is: the sorted values in the key then decide every branch.
READS = (
    ("masking_utils.py", "if (padding_length := kv_length + kv_offset - attention_mask.shape[-1]) > 0:"),
    ("masking_utils.py", "and (padding_mask is None or padding_mask.all())"),  # all(): the same, permuted
    ("numerics.py", "if groups > 1:"),  # query.shape[1] // key.shape[1]
    ("cache_utils.py", "if not self.is_initialized or self.keys.numel() == 0:"),
    ("functional.py", "if padding_idx >= weight.size(0):"),
    ("modeling_vit.py", "if num_channels != self.num_channels:"),
    ("modeling_vit.py", "if height != self.image_size[0] or width != self.image_size[1]:"),
    ("modeling_dinov2.py", "if num_channels != self.num_channels:"),
    ("modeling_dinov2.py", "if not torch.jit.is_tracing() and num_patches == num_positions and height == width:"),
    ("modeling_deit.py", "if num_channels != self.num_channels:"),
    ("modeling_deit.py", "if height != self.image_size[0] or width != self.image_size[1]:"),
)
_TORCH_INTERNALS = ("/warnings.py", "/torch/_tensor.py", "/torch/jit/_trace.py", "/torch/overrides.py")


def _read_site(message) -> tuple[str, str] | None:
    """(file, line) of the code that read a tensor's value, or None for a constant (torch.tensor of a Python
    value: fixed whatever the inputs)."""
    if "registered as constants" in str(message):
        return None
    frames = [f for f in traceback.extract_stack() if not f.filename.endswith(_TORCH_INTERNALS)
              and "perm_core/fast/graph_forward.py" not in f.filename]
    if not frames:
        return ("?", "")
    return frames[-1].filename.rsplit("/", 1)[-1], (frames[-1].line or "").strip()


def unlisted_reads(sites) -> list[tuple[str, str]]:
    return [site for site in sites if not any(site[0] == file and site[1].startswith(line) for file, line in READS)]


def _input_key(name: str, value):
    """The image by shape and dtype (its values feed a convolution); any other input by its sorted values too:
    READS has every value a trace may branch on, each unchanged when the tokens are permuted."""
    if isinstance(value, dict):  # masks per attention kind
        return tuple((key, _input_key(name, v)) for key, v in value.items())
    if not torch.is_tensor(value):
        return value
    if name == "pixel_values":
        return (tuple(value.shape), value.dtype)
    array = value.numpy() if value.device.type == "cpu" else value.cpu().numpy()  # numpy() keeps the GIL
    return (tuple(value.shape), value.dtype, np.sort(array, axis=None).tobytes())


def _signature(params: dict, kwargs: dict, module) -> tuple:
    return (tuple((n, tuple(t.shape), t.dtype, _shift(t)) for n, t in params.items()),
            tuple((n, _input_key(n, v)) for n, v in kwargs.items()),
            id(module) if module is not None else None)


ALIGN_BYTES = 64  # the widest vector a kernel may align to: its loops split at other places off that alignment


def _shift(tensor: torch.Tensor) -> int:
    """Where the tensor starts within a 64-byte line, in elements: the parameter cache hands out small
    tensors as slices of one batch, off torch's alignment."""
    return tensor.data_ptr() % ALIGN_BYTES // tensor.element_size()


class Packing:
    """Where each parameter lies in its dtype's flat buffer: in order, each starting at the same place within a
    64-byte line as the parameter itself, so every kernel sees memory aligned as in the eager forward."""

    def __init__(self, params: dict):
        self.dtypes: list[torch.dtype] = []
        self.spans: list[tuple[str, torch.dtype, tuple, int, int]] = []  # name, dtype, shape, start, size
        self._pieces: dict[torch.dtype, list] = {}  # per dtype: parameter names and padding tensors, in order
        ends: dict[torch.dtype, int] = {}
        for name, tensor in params.items():
            dtype = tensor.dtype
            if dtype not in ends:
                self.dtypes.append(dtype)
                ends[dtype], self._pieces[dtype] = 0, []
            line = max(1, ALIGN_BYTES // tensor.element_size())
            pad = (_shift(tensor) - ends[dtype]) % line
            if pad:
                self._pieces[dtype].append(torch.zeros(pad, dtype=dtype))
            start = ends[dtype] + pad
            self.spans.append((name, dtype, tuple(tensor.shape), start, tensor.numel()))
            self._pieces[dtype].append(name)
            ends[dtype] = start + tensor.numel()

    def buffers(self, params: dict) -> list[torch.Tensor]:
        """One flat copy per dtype, each made by one torch call (a call per tensor, even a detach, would wait
        for the GIL once per tensor)."""
        with torch.no_grad():
            return [torch._C._nn.flatten_dense_tensors([params[p] if isinstance(p, str) else p for p in pieces])
                    for pieces in (self._pieces[d] for d in self.dtypes)]

    def views(self, buffers) -> dict[str, torch.Tensor]:
        bases = dict(zip(self.dtypes, buffers, strict=True))
        return {name: bases[dtype][start:start + size].view(shape) for name, dtype, shape, start, size in self.spans}


def eligible(params: dict) -> bool:
    """Each parameter dense, starting on a whole element: then its packed copy can sit as it does."""
    return all(t.is_contiguous() and t.data_ptr() % t.element_size() == 0 for t in params.values())


class GraphForward:
    """One traced forward for one signature: call(params, kwargs) -> (the model output's fields, captured)."""

    def __init__(self, model: torch.nn.Module, params: dict, kwargs: dict, module=None):
        self.packing = Packing(params)
        # Where each tensor input sits: (name, None) for a keyword, (name, key) inside a dict of masks
        self.tensor_kwargs = [(n, None) for n, v in kwargs.items() if torch.is_tensor(v)] + [
            (n, k) for n, v in kwargs.items() if isinstance(v, dict) for k in v]
        fixed_kwargs = {n: v for n, v in kwargs.items() if not torch.is_tensor(v) and not isinstance(v, dict)}
        self.module = module
        self.layout: list[tuple[str, int | None]] = []  # the output's fields, set when traced (_output_tensors)
        inputs = (*self.packing.buffers(params), *self._tensor_inputs(kwargs))
        n_buffers = len(self.packing.dtypes)

        def forward(*tensors):
            views = self.packing.views(tensors[:n_buffers])  # aliases made in the graph: Python never holds them
            call_kwargs: dict = {}
            for (name, key), tensor in zip(self.tensor_kwargs, tensors[n_buffers:], strict=True):
                if key is None:
                    call_kwargs[name] = tensor
                else:
                    call_kwargs.setdefault(name, {})[key] = tensor
            with capture.recording(module) as box, _reparametrize_module(model, views, tie_weights=True,
                                                                          strict=False):
                out = model(**call_kwargs, **fixed_kwargs)
            flat, self.layout = _output_tensors(out)
            return tuple(flat + ([box["input"]] if module is not None else []))

        sites: list = []
        with _TRACING, model_lock(model), torch.no_grad(), warnings.catch_warnings(), _as_eager():
            warnings.simplefilter("always", torch.jit.TracerWarning)
            # Only TracerWarnings count (another thread's warning meanwhile is not this trace's read)
            warnings.showwarning = lambda message, category, *_, **__: sites.append(
                _read_site(message) if issubclass(category, torch.jit.TracerWarning) else None)
            try:
                self.graph = torch.jit.trace(forward, inputs, check_trace=False)
            except Exception as error:  # noqa: BLE001 - any failure to trace leaves the forward eager
                raise GraphRefused(f"{type(error).__name__}: {error}") from error
            unlisted = unlisted_reads(site for site in sites if site is not None)
            if unlisted:
                raise GraphRefused(f"the forward reads tensor values at {unlisted[0][0]}: {unlisted[0][1]}")
            expected = _eager(model, params, kwargs, module)
        replay = self.graph(*inputs)
        if len(replay) != len(expected) or not all(torch.equal(a, b) for a, b in zip(replay, expected, strict=True)):
            raise GraphRefused("the graph's numbers differ from the eager forward's")

    def _tensor_inputs(self, kwargs: dict) -> list[torch.Tensor]:
        return [kwargs[name] if key is None else kwargs[name][key] for name, key in self.tensor_kwargs]

    def __call__(self, params: dict, kwargs: dict):
        with torch.no_grad():
            flat = self.graph(*self.packing.buffers(params), *self._tensor_inputs(kwargs))
        fields, at = {}, 0
        for field, count in self.layout:
            fields[field] = flat[at] if count is None else tuple(flat[at:at + count])
            at += 1 if count is None else count
        captured = flat[at] if self.module is not None else None
        return SimpleNamespace(**fields), captured


def _output_tensors(out) -> tuple[list[torch.Tensor], list[tuple[str, int | None]]]:
    """A model output's tensors in order, and its layout: (field, None) for a tensor, (field, n) for a tuple
    of n; a key-value cache and the like are not part of what is recorded."""
    flat, layout = [], []
    for field, value in out.items():
        if torch.is_tensor(value):
            flat.append(value)
            layout.append((field, None))
        elif isinstance(value, tuple) and value and all(torch.is_tensor(v) for v in value):
            flat.extend(value)
            layout.append((field, len(value)))
    return flat, layout


def _eager(model, params: dict, kwargs: dict, module) -> list[torch.Tensor]:
    """What the eager forward gives for these parameters (the caller holds the model's lock), flattened as a
    graph's outputs are."""
    with capture.recording(module) as box:
        out = functional_call(model, params, args=(), kwargs=kwargs, strict=False)
    return _output_tensors(out)[0] + ([box["input"]] if module is not None else [])


def graph_for(model: torch.nn.Module, params: dict, kwargs: dict, module=None) -> GraphForward | None:
    """The model's graph for this signature, traced the second time the signature is asked for; None before
    that, and where the model refused to be traced (then it is not tried again for this signature). A trace
    costs about three eager forwards under the model's lock, and a signature seen once may never come back (a
    visitor's one-off text)."""
    key = _signature(params, kwargs, module)
    with _guard:
        graphs = _graphs.setdefault(model, OrderedDict())
        if key in graphs:
            graphs.move_to_end(key)
            return graphs[key]
        seen = _seen.setdefault(model, OrderedDict())
        if key not in seen:
            seen[key] = True
            while len(seen) > SIGNATURES_REMEMBERED:
                seen.popitem(last=False)
            return None
        del seen[key]
    try:
        graph = GraphForward(model, params, kwargs, module)
    except GraphRefused:
        graph = None
    with _guard:
        graphs[key] = graph
        while len(graphs) > GRAPHS_PER_MODEL:
            graphs.popitem(last=False)
    return graph


GRAPH_MAX_BYTES = 256 << 20  # each run copies the parameters into flat buffers: small models only


def fits_a_graph(params: dict) -> bool:
    """Whether a forward on these parameters may run as a graph: small enough to pack on every run, and eligible."""
    return sum(p.numel() * p.element_size() for p in params.values()) <= GRAPH_MAX_BYTES and eligible(params)


def forward(model: torch.nn.Module, params: dict, kwargs: dict):
    """The model's output fields from its graph (with a capture.capturing request of this thread answered), or
    None where there is no graph: a large model, a stopping capture, or a model that refused to be traced."""
    if model.training:  # dropout draws random numbers per run
        return None
    config = getattr(model, "config", None)
    if getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0):
        return None  # a mixture of experts loops over the experts its router chose: a branch on the weights' values
    if not fits_a_graph(params):
        return None
    if not all(torch.is_tensor(v) or isinstance(v, (bool, int, float, str, type(None))) or isinstance(v, dict)
               and all(map(torch.is_tensor, v.values())) for v in kwargs.values()):
        return None  # an input the key cannot hold: kept eager
    request = capture.request_here()
    if request is not None and request[2]:
        return None
    module = request[0] if request is not None else None
    graph = graph_for(model, params, kwargs, module)
    if graph is None:
        return None
    with model_lock(model):  # one run of a model at a time, as eager: each holds a packed copy of the weights
        out, captured = graph(params, kwargs)
    if module is not None:
        request[1]["input"] = captured
    return out
