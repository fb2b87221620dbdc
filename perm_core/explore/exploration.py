"""The Explore page's compute: original, scrambled and un-scrambled traces of one model on one input.

The original trace depends only on (model, input, dtype), so an `Exploration` holds it once and every
key change recomputes only the scrambled side. Transformed parameters come tensor by tensor from
perm_core.fast.param_cache (bounded by bytes, shared by all sessions): a key change rebuilds only the
tensors its symmetry reaches.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import torch

from perm_core.engine import symmetries
from perm_core.engine.spec import Scramble
from perm_core.explore.path import axis_path
from perm_core.explore.routing import recording_routing
from perm_core.fast import param_cache
from perm_core.run import trace_names
from perm_core.run.capture import capturing, output_projection
from perm_core.run.trace import Record
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT, MOVED_AT, TOLERANCE, TensorError, worst_abs, worst_rel


@dataclass
class ExploreResult:
    scramble: Scramble
    scrambled: dict[str, Record]  # the transformed model on the scrambled input
    restored: Mapping[str, torch.Tensor]  # the inverse applied to what the scrambled run produced (Unscrambled)
    errors: list[TensorError]
    dtype: torch.dtype
    control: symmetries.Control | None = None
    seconds: dict = field(default_factory=dict)
    moved: float = 0.0  # how far the scrambled world is from the original before un-scrambling (relative)
    moved_what: str = ""
    mlp_inputs: dict[int, torch.Tensor] = field(default_factory=dict)  # block -> MLP activation, recorded in the run
    not_holding: dict[str, str] = field(default_factory=dict)  # switched-on symmetries this model lacks -> why
    # MoE block -> (experts each token chose [N, k], their weights [N, k]) as the scrambled run's routers gave them
    routing: dict[int, tuple] = field(default_factory=dict)
    # What a page derives from this result and keeps with it (the head grid): every session that asks for the same
    # keys shares the result, so a class opening one link derives it once.
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def expected_failure(self) -> bool:
        """Not identical, and a switched-on symmetry is one this model is known not to have."""
        return self.control is None and bool(self.not_holding) and not self.passed

    @property
    def worst_rel(self) -> float:
        return worst_rel(self.errors)

    @property
    def worst_abs(self) -> float:
        return worst_abs(self.errors)

    @property
    def non_finite(self) -> list[str]:
        return [e.name for e in self.errors if not e.finite]

    @property
    def tolerance(self) -> float:
        return TOLERANCE.get(self.dtype, 1e-4)

    @property
    def moved_enough(self) -> bool:
        return self.scramble.is_identity or self.moved >= MOVED_AT

    @property
    def passed(self) -> bool:
        return bool(self.errors) and all(e.passed for e in self.errors) and self.moved_enough

    @property
    def outcome(self) -> str:
        """Which verdict the numbers give: "control", "non-finite", "nothing switched on", "moved nothing",
        "identical", "not identical", or "lacks a symmetry" (not identical, and expected_failure)."""
        if self.control is not None:
            return "control"
        if self.non_finite:
            return "non-finite"
        if self.scramble.is_identity:
            return "nothing switched on"
        if not self.moved_enough:
            return "moved nothing"
        if self.passed:
            return "identical"
        return "lacks a symmetry" if self.expected_failure else "not identical"

    def verdict(self) -> str:
        """One line of what was measured, computed from the numbers (a page adds what to do about it)."""
        dtype = str(self.dtype).split(".")[-1]
        n = len(self.errors)
        outcome = self.outcome
        if outcome == "control":
            state = "breaks, as it must" if self.worst_rel > BROKEN_AT else "does NOT break (unexpected)"
            return (f"Negative control '{self.control.description}' {state}: un-scrambled tensors differ from "
                    f"the original by up to {self.worst_rel:.1e} (relative), {self.worst_abs:.1e} (absolute).")
        if outcome == "non-finite":
            return (f"NOT identical: non-finite values (NaN or inf) in {', '.join(self.non_finite[:3])}"
                    f"{' ...' if len(self.non_finite) > 3 else ''}.")
        if outcome == "nothing switched on":
            return f"No symmetry switched on: all {n} tensors identical to {self.worst_rel:.1e} in {dtype}."
        contrast = f"Scrambled differs by {self.moved:.2g} ({self.moved_what}); un-scrambled by {self.worst_rel:.1e}"
        if outcome == "moved nothing":
            return f"{contrast}: the keys moved nothing (below {MOVED_AT}), so this proves nothing."
        if outcome == "identical":
            raised = ", raised per tensor to its measured float32 round-off" if self.raised else ""
            return (f"{contrast} in {dtype}: all {n} un-scrambled tensors match the original "
                    f"(tolerance {self.tolerance:.0e}{raised}).")
        failed = (f"{contrast}: NOT identical, the worst relative error exceeds the {dtype} tolerance "
                  f"{self.tolerance:.0e}.")
        if outcome == "not identical":
            return failed
        names = " and ".join(self.not_holding)
        return (f"{failed} As expected: {names} {'is' if len(self.not_holding) == 1 else 'are'} not a symmetry of "
                f"this model. {' '.join(self.not_holding.values())}")

    @property
    def raised(self) -> bool:
        return any(e.tolerance > self.tolerance for e in self.errors)


def control_options(subject: Subject, active_keys: dict[str, int]) -> dict[str, symmetries.Control]:
    """'symmetry/name' -> control, for every symmetry (built with its key, or 0 if it is switched off)."""
    found = {}
    for name in symmetries.SYMMETRIES:
        for control in symmetries.controls(name, active_keys.get(name, 0), subject.geometry, subject.n_tokens):
            found[f"{control.symmetry}/{control.name}"] = control
    return found


def layer_of(name: str) -> int | None:
    """A forward trace name -> its block's index; embed is -1, outputs (and a decoder's embed) None."""
    return -1 if name == trace_names.EMBED else trace_names.parse(name).layer


_KIND_LABELS = {"hidden": "hidden state", "attn": "attention map", "cross_attn": "cross-attention map"}


def kind_label(name: str) -> str:
    """What a forward trace name holds, in words: "hidden state", "attention map", "output logits", ..."""
    parts = trace_names.parse(name)
    if name == trace_names.EMBED:
        return _KIND_LABELS["hidden"]
    if parts.layer is not None:
        return _KIND_LABELS[parts.kind]
    return f"output {parts.field}" if parts.kind == "output" else name


def weights_id(model) -> str:
    """A cache identity for a model object's weights, unique per object (ids of dead objects get reused)."""
    if not hasattr(model, "_perm_core_weights_id"):
        import uuid

        model._perm_core_weights_id = f"{type(model).__name__}-{uuid.uuid4().hex}"
    return model._perm_core_weights_id


class Exploration:
    """One model on one input: the subject and its original trace, computed once."""

    def __init__(self, model, inputs: dict, model_id: str = ""):
        self.subject = Subject(model, inputs)
        self.model_id = model_id or weights_id(model)
        with recording_routing(self.subject) as routing:  # {} for a dense model
            self.original: dict[str, Record] = self.subject.trace()
        self.original_routing: dict[int, tuple] = routing  # perm_core.explore.routing, as ExploreResult.routing
        # The original model's MLP activations of the blocks viewed so far (perm_core.explore.mlp_view), by module.
        self.mlp_originals: dict[str, torch.Tensor] = {}
        # The original's attention maps pooled for the head grid, by (layer, tile size): the same for every key.
        self.pooled_heads: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def geometry(self):
        return self.subject.geometry

    @property
    def n_tokens(self) -> int:
        return self.subject.n_tokens

    @cached_property
    def trace_bytes(self) -> int:
        """The bytes of the original trace: a run's result holds a trace of the same tensors, as large."""
        return param_cache.tensor_bytes(self.original)

    @cached_property
    def compute_bytes(self) -> int:
        """What a run holds while it computes, beside its trace: a transformed parameter set and the graph's packed
        copy of it (perm_core.fast.graph_forward), each the size of the weights."""
        return 2 * sum(t.numel() * t.element_size() for t in self.subject.params.values())

    def scramble_for(self, keys_by_symmetry: dict[str, int], control: str | None = None):
        """The element to apply: every active symmetry in canonical order, the control replacing its own."""
        chosen = control_options(self.subject, keys_by_symmetry)[control] if control else None
        element = Scramble()
        for name in symmetries.SYMMETRIES:
            if chosen is not None and name == chosen.symmetry:
                element = element.then(chosen.scramble)
            elif name in keys_by_symmetry:
                element = element.then(symmetries.build(name, keys_by_symmetry[name], self.geometry,
                                                        self.n_tokens))
        return element, chosen

    def params_for(self, scramble: Scramble, keys_by_symmetry: dict[str, int], control: str | None, names=None):
        """(transformed params, a callable measuring how far they moved): tensors come from the shared
        byte-bounded cache, so changing one key rebuilds only the tensors that key reaches. names: only these."""
        if scramble.is_identity:
            return ({n: self.subject.params[n] for n in names} if names is not None else self.subject.params), {}
        keys = dict(keys_by_symmetry)
        if control:  # a control's symmetry acts even when the sidebar has it switched off
            keys.setdefault(control.split("/")[0], 0)
        scope = (self.model_id, str(self.subject.dtype), self.n_tokens, control)
        params = param_cache.transformed_params(self.subject, scramble, keys, scope, names=names)
        return params, lambda: self.subject.weight_movement(params)

    def _mlp_module(self, layer: int | None) -> str | None:
        if layer is None or not 0 <= layer < self.geometry.n_layers:
            return None
        try:
            return output_projection(self.subject, layer)
        except ValueError:  # a block without an MLP: nothing to record
            return None

    def run(self, keys_by_symmetry: dict[str, int], control: str | None = None,
            mlp_layer: int | None = None) -> ExploreResult:
        """mlp_layer: also record that block's MLP activation in the traced run (the MLP-neuron view's, which
        would otherwise take a forward of its own)."""
        import time

        started = time.perf_counter()
        scramble, chosen = self.scramble_for(keys_by_symmetry, control)
        params, weights_moved = self.params_for(scramble, keys_by_symmetry, control)
        built = time.perf_counter()
        mlp_inputs = {}
        module = self._mlp_module(mlp_layer)
        # A key change repeats this forward on one input: as one graph it waits for the GIL once, not per op
        with recording_routing(self.subject) as routing:
            if module is None:
                scrambled = self.subject.trace(scramble, params=params, graph=True)
            else:
                with capturing(self.subject.model, module) as box:
                    scrambled = self.subject.trace(scramble, params=params, graph=True)
                mlp_inputs[mlp_layer] = box["input"]
        traced = time.perf_counter()
        restored = self.subject.unscramble_lazily(scrambled, scramble)  # kept: each tensor redrawn when shown
        errors = self.subject.errors(self.original, restored, scramble)  # each built, compared and dropped
        moved, what = self.subject.movement(self.original, scrambled, weights_moved)
        done = time.perf_counter()
        lacking = {name: why for name, why in self.geometry.not_holding().items() if name in keys_by_symmetry}
        return ExploreResult(scramble, scrambled, restored, errors, self.subject.dtype, chosen,
                             {"params": built - started, "trace": traced - built, "compare": done - traced},
                             moved, what, mlp_inputs, lacking, routing)


def bits_summary(keys_by_symmetry: dict[str, int], geometry, n_tokens: int) -> dict[str, float]:
    """Key-space size in bits of each active symmetry, plus the total of the discrete ones."""
    bits = {name: symmetries.key_space_bits(name, geometry, n_tokens) for name in keys_by_symmetry}
    bits["total"] = sum(b for b in bits.values() if not math.isinf(b))  # rotations are continuous
    return bits


def format_bits(bits: float) -> str:
    if math.isinf(bits):
        return "continuous (infinite)"
    return f"{bits:,.0f} bits"


def permutation_of(scramble: Scramble, symmetry: str) -> torch.Tensor | None:
    """The index array to draw for a symmetry (first block for per-block ones), if it is a permutation."""
    from perm_core.engine.transforms import Permutation

    if symmetry == "tokens":
        return scramble.tokens.index if scramble.tokens is not None else None
    role = {"channels": ("resid", None), "heads": ("heads", 0), "mlp": ("mlp", 0),
            "head_channels": ("o", 0)}.get(symmetry)
    chain = scramble.spaces.get(role, ()) if role else ()
    perms = [t for t in chain if isinstance(t, Permutation)]
    return perms[-1].index if perms else None


def patch_grid(geometry, pixels_shape, n_tokens: int) -> tuple[int, int] | None:
    """(rows, cols) of image patches when the tokens are [fixed tokens (class, distillation), patches in row-major
    order], else None."""
    if geometry.input_kind != "image" or not geometry.fixed_tokens or not geometry.patch_size:
        return None
    rows, cols = pixels_shape[-2] // geometry.patch_size, pixels_shape[-1] // geometry.patch_size
    return (rows, cols) if rows * cols == n_tokens - geometry.fixed_tokens else None


def class_attention_grid(attention: torch.Tensor, grid: tuple[int, int], fixed_tokens: int = 1) -> torch.Tensor:
    """Attention probabilities [1, H, T, T] -> how much the class token (query 0) attends to each patch,
    averaged over the heads, laid out as the patch grid [rows, cols] (the class token's own share left out).

    The mean over heads does not depend on the order of the heads, so a head permutation leaves it unchanged;
    a token permutation moves each value with its patch. The patches follow the `fixed_tokens` leading tokens."""
    return attention[0, :, 0, fixed_tokens:].mean(dim=0).reshape(grid)


def output_summary(tensors: dict, task_labels, tokenizer, attention_mask, row: int | None, top_k: int = 5,
                   image: bool = False):
    """What a model's output means, from one column's tensors -> (kind, labels, values).

    kind "classes" (top-k class probabilities), "next-token" (top-k candidates of one row),
    "image-embedding" (an image backbone without a head: the class token's final embedding, the pooler
    output, as a vector), or "embedding" (the mean-pooled sentence embedding, as a vector).
    """
    from perm_core.models.registry import mean_pool

    logits = tensors.get(trace_names.LOGITS)
    if logits is not None and logits.dim() == 2:
        probs = torch.softmax(logits[0].double(), -1)
        top = torch.topk(probs, min(top_k, len(probs)))
        labels = [task_labels[i] if task_labels and i < len(task_labels) else f"class {i}"
                  for i in top.indices.tolist()]
        return "classes", labels, top.values.tolist()
    if logits is not None and logits.dim() == 3:
        probs = torch.softmax(logits[0, row].double(), -1)
        top = torch.topk(probs, min(top_k, len(probs)))
        labels = [repr(tokenizer.decode([i])) if tokenizer else f"#{i}" for i in top.indices.tolist()]
        return "next-token", labels, top.values.tolist()
    last = tensors.get(trace_names.LAST_HIDDEN)
    if image:
        pooled = tensors.get(trace_names.POOLER)
        return "image-embedding", None, (pooled if pooled is not None else last[:, 0])[0]
    mask = attention_mask if attention_mask is not None else torch.ones(last.shape[:2])
    return "embedding", None, mean_pool(last, mask.to(last.dtype))[0]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0).item()


@dataclass
class HeadGrid:
    """Every head's attention map in (up to) a dozen layers, original and scrambled, for the layer x head grid.

    The scrambled maps are drawn in the original token order (only the token permutation is undone), so what
    differs between the two grids is where each head sits: scrambled head h of layer l holds original head
    holds[l][h]. Maps are average-pooled to cells x cells so the grid stays light."""

    layers: list[int]
    original: torch.Tensor  # [L, H, cells, cells]
    scrambled: torch.Tensor  # [L, H, cells, cells], tokens back in their original order, heads not
    holds: list[list[int]]
    paths: tuple = ()  # per drawn layer, the element's head path (perm_core.explore.path.AxisPath): a followed head


def head_grid(explorer: Exploration, result: ExploreResult, max_layers: int = 12, cells: int = 12) -> HeadGrid:
    """The result's head grid (HeadGrid), derived once per result and kept with it (ExploreResult.derived); two
    sessions deriving it at once make equal grids, and one of them is kept."""
    key = ("head_grid", max_layers, cells)
    grid = result.derived.get(key)
    return grid if grid is not None else result.derived.setdefault(key, _head_grid(explorer, result, max_layers,
                                                                                    cells))


def _head_grid(explorer: Exploration, result: ExploreResult, max_layers: int, cells: int) -> HeadGrid:
    from perm_core.engine.spec import apply_axes
    from perm_core.engine.transforms import Permutation

    n_layers = explorer.geometry.n_layers
    layers = sorted({round(i * (n_layers - 1) / max(min(max_layers, n_layers) - 1, 1))
                     for i in range(min(max_layers, n_layers))})
    only_tokens = Scramble(tokens=result.scramble.tokens).inverse()

    # One tile size for every layer: an encoder-decoder's decoder maps are smaller than its encoder's.
    size = min([cells] + [explorer.original[trace_names.attn(layer)].tensor.shape[-1] for layer in layers])

    def pooled(maps: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool2d(maps[0].double(), size)

    original, scrambled, holds = [], [], []
    for layer in layers:
        name = trace_names.attn(layer)
        record = result.scrambled[name]
        in_order = apply_axes(record.tensor, record.axes, only_tokens, record.layer, explorer.geometry.patch_size)
        if (layer, size) not in explorer.pooled_heads:
            explorer.pooled_heads[(layer, size)] = pooled(explorer.original[name].tensor)
        original.append(explorer.pooled_heads[(layer, size)])
        scrambled.append(pooled(in_order))
        chain = result.scramble.chain("heads", layer)
        n_heads = record.tensor.shape[1]
        if len(chain) == 1 and isinstance(chain[0], Permutation):
            holds.append(chain[0].index.tolist())  # new position h holds old position index[h]
        else:
            holds.append(list(range(n_heads)))
    paths = tuple(axis_path(("heads", layer), explorer.geometry.n_heads, result.scramble) for layer in layers)
    return HeadGrid(layers, torch.stack(original), torch.stack(scrambled), holds, paths)


def weight_names(explorer: Exploration, layer: int) -> list[str]:
    """The matrices of one block (2-D parameters claimed for that layer), the weights a viewer can compare."""
    return [name for name, claim in explorer.subject.claims.items()
            if claim.layer == layer and explorer.subject.params[name].dim() == 2]


def weight_view(explorer: Exploration, result: ExploreResult, keys_by_symmetry: dict[str, int],
                control: str | None, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W, W' as the scrambled model holds it, W' with the inverse applied): the weights really change, and the
    inverse gives them back."""
    from perm_core.engine.spec import restore_param

    params, _ = explorer.params_for(result.scramble, keys_by_symmetry, control, names={name})
    claim = explorer.subject.claims[name]
    scrambled = params[name]
    back = restore_param(scrambled, claim, result.scramble, explorer.geometry.patch_size)
    return explorer.subject.params[name], scrambled, back
