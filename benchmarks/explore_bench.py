"""The Explore page's compute for a key change vs a bare forward of the same model, and the chart payload.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/explore_bench.py [MODEL ...]

A key change costs: building the transformed parameters (a cache miss), the scrambled traced forward
(hidden states and attention maps), un-scrambling and comparing. The original trace is cached per
(model, input, dtype) and is not part of it. Payload: the bytes of every figure the page draws.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perm_core.engine.tokens import model_inputs  # noqa: E402
from perm_core.explore.exploration import Exploration  # noqa: E402
from perm_core.fast.param_cache import TENSORS  # noqa: E402
from perm_core.models.defaults import default_inputs  # noqa: E402
from perm_core.models.inputs import prepare_text  # noqa: E402
from perm_core.models.registry import load_model  # noqa: E402
from perm_core.models.zoo import DEFAULT_IMAGE_MODEL, DEFAULT_TEXT_MODEL, SMOLLM2  # noqa: E402
from perm_core.run import trace_names  # noqa: E402
from ui.charts import figures  # noqa: E402
from ui.charts.figures_heatmap import heatmap  # noqa: E402
from ui.charts.figures_path import permutation_figure  # noqa: E402
from ui.charts.figures_proof import error_chart  # noqa: E402

MODELS = (DEFAULT_IMAGE_MODEL, DEFAULT_TEXT_MODEL, SMOLLM2.name)
TEXT = "Shuffling the tokens of a sentence shuffles the hidden states of a Transformer in exactly the same way."


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def page_figures(explorer: Exploration, result) -> list:
    """The heatmaps and charts the Explore page draws for the last block and head 0."""
    layer = explorer.geometry.n_layers - 1
    figs = []
    for source in (explorer.original, result.scrambled, result.restored):
        hidden = source[trace_names.hidden(layer)]
        attn = source[trace_names.attn(layer)]
        hidden = getattr(hidden, "tensor", hidden)
        attn = getattr(attn, "tensor", attn)
        figs.append(heatmap(hidden[0], "hidden"))
        figs.append(heatmap(attn[0, 0], "attention", symmetric=False))
    rows = [{"layer": i, "kind": "hidden state", "abs": e.max_abs_error, "rel": e.max_rel_error}
            for i, e in enumerate(result.errors)]
    figs.append(error_chart(rows, "errors"))
    for index in (result.scramble.tokens.index, result.scramble.spaces[("resid", None)][0].index):
        figs.append(permutation_figure(index, "key"))
    return figs


def measure(name: str) -> dict:
    loaded = load_model(name)
    inputs = default_inputs(loaded)
    if loaded.tokenizer is not None:
        inputs, _ = prepare_text(TEXT, loaded)
    explorer = Exploration(loaded.model, inputs, model_id=name)
    kwargs = model_inputs(inputs, explorer.geometry, explorer.scramble_for({})[0], explorer.subject.dtype)
    with torch.no_grad():
        bare = best_of(lambda: loaded.model(**kwargs))
    keys = iter(range(1000, 2000))

    def key_change():
        TENSORS.clear()  # every key is new: a cache miss, the worst case
        k = next(keys)
        return explorer.run({"tokens": k, "channels": k})

    explore = best_of(key_change)
    result = key_change()
    payload = figures.payload_bytes(page_figures(explorer, result))
    return {"model": name, "tokens": explorer.n_tokens, "bare_s": bare, "explore_s": explore,
            "ratio": explore / bare, "params_s": result.seconds["params"], "payload_kb": payload / 1024,
            "worst_rel": result.worst_rel}


def main(names) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = [measure(n) for n in names]
    print(f"{'model':<14} {'tokens':>6} {'bare fwd':>9} {'key change':>10} {'ratio':>6} {'params':>7} "
          f"{'payload':>9} {'worst rel':>9}")
    for r in rows:
        print(f"{r['model']:<14} {r['tokens']:>6} {r['bare_s']:>8.3f}s {r['explore_s']:>9.3f}s {r['ratio']:>6.2f} "
              f"{r['params_s']:>6.3f}s {r['payload_kb']:>7.0f}KB {r['worst_rel']:>9.1e}")


if __name__ == "__main__":
    main(sys.argv[1:] or MODELS)
