"""Rotation: per-head Q/K and V/O rotations change queries, keys and values but not what the model computes."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import pandas as pd
import streamlit as st
import torch

from perm_core.applications.rotation import residual_rotation, rope_rotations, rotation_demo
from perm_core.models.defaults import default_inputs
from perm_core.models.registry import ModelLoadError
from perm_core.models.zoo import ROPE_ROTATION, ROTATION, serving
from perm_core.verify.tolerances import worst_rel
from ui.charts import figures_fusion as figs
from ui.errors import show_failure
from ui.export import chart
from ui.runtime import PageRequest, page_run_bytes, page_runs, shared_model
from ui.sidebar import ensure_view
from ui.state import key_or_stop, lecture_key, seed, seed_choice

# the trained image model first (it opens the page), the random ones, then the trained text models
MODELS = (*serving(ROTATION, "image"), "random:vit", "random:bert", "random:gpt2", "random:llama",
          *serving(ROTATION, "text"))
ROPE_MODELS = ("random:llama", *serving(ROPE_ROTATION))


def main(shared_runs) -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals. shared_runs: where the
    page's results come from (ui.runtime.page_runs)."""
    ensure_view("own")  # the sidebar says this page has its own controls; the URL keeps them
    st.title("Rotation: a continuous symmetry of attention")
    st.markdown(
        "Inside every head, queries and keys enter attention only through the dot product q·k, and values only "
        "through W_O v. Rotate W_Q and W_K of a head by the same orthogonal R, W_V by S and W_O by Sᵀ: "
        "(Rq)·(Rk) = q·k and W_O Sᵀ S v = W_O v. So queries, keys and values change completely while attention "
        "scores, each head's output and the model's output stay the same (Zhang et al., ICML 2025).")

    top = st.columns([2, 1, 1, 1, 1])
    seed_choice("rotation_model", MODELS, MODELS[0])
    model_name = top[0].selectbox("Model", MODELS, key="rotation_model")
    seed("rotation_key", lecture_key("rotation"))
    key_text = top[1].text_input("Rotation key", key="rotation_key",
                                 help="An integer from 0 to 2**64-1; it seeds every (R, S) of every head.")
    key = key_or_stop(key_text)
    try:
        loaded = shared_model(model_name)
    except (ModelLoadError, OSError, ValueError) as error:
        show_failure(error, f"Could not load {model_name}")
        st.stop()
    config = loaded.model.config
    n_layers = config.num_hidden_layers
    n_heads = config.num_attention_heads
    seed_choice("rotation_layer", range(n_layers), 0, int)
    layer = top[2].number_input("Layer", 0, n_layers - 1, key="rotation_layer")
    seed_choice("rotation_head", range(n_heads), 0, int)
    head = top[3].number_input("Head", 0, n_heads - 1, key="rotation_head")
    inputs = default_inputs(loaded)
    top[4].caption(f"{loaded.info.family}, {n_layers} layers x {n_heads} heads; input: the default sample")

    def cached_demo(name: str, key: int, layer: int, head: int):
        return shared_runs.result(PageRequest("rotation", (name, key, layer, head), page_run_bytes(name)),
                           lambda: rotation_demo(shared_model(name).model, default_inputs(shared_model(name)), key,
                                                 layer, head))

    progress = st.progress(0.0, text="rotating every head and running both models")
    demo = cached_demo(model_name, key, int(layer), int(head))
    progress.progress(0.5, text="residual stream: permutation vs rotation")

    verdict = "the same function" if demo.passed else "NOT the same function"
    worst = worst_rel(demo.proof)
    control_worst = worst_rel(demo.control)
    (st.success if demo.passed and demo.control_broken else st.error)(
        f"Rotated model is {verdict}: worst relative error over every traced tensor {worst:.1e} "
        f"(tolerance {demo.tolerance:g}). Negative control (Q rotated by R, K by another R'): "
        f"{control_worst:.2f} — {'broken, as it must be' if demo.control_broken else 'NOT broken'}. "
        + precision_sentence(loaded.model))

    st.subheader(f"Layer {demo.examples['layer']}, head {demo.examples['head']}: side by side")
    cols = st.columns(2)
    labels = {"q": "queries", "k": "keys", "v": "values"}
    for i, role in enumerate(r for r in ("q", "k", "v") if r in demo.examples):
        chart(figs.side_by_side(*demo.examples[role], f"{labels[role]} (this head): change completely"),
              key=f"rot_{role}", where=cols[i % 2])
    chart(figs.side_by_side(*demo.examples["attention"],
                            "attention probabilities (softmax of q·k): identical", "key token"),
          key="rot_attention", where=cols[1])
    if "head_output" in demo.examples:
        chart(figs.side_by_side(*demo.examples["head_output"],
                                "this head's output W_O z (residual channels): identical"),
              key="rot_head_output", where=cols[0])
    chart(figs.side_by_side(*demo.examples["output"], f"model output ({demo.examples['output_name']}): "
                            "identical", "output index", ""), key="rot_output", where=cols[1])

    chart(figs.change_bars(demo.quantities), key="rot_changes")
    table = pd.DataFrame([{"layer": q.layer, "tensor": q.name, "expected": "unchanged" if q.invariant else "changes",
                           "relative change": f"{q.changed:.2e}",
                           "after un-rotating": "—" if q.invariant else f"{q.restored:.2e}"} for q in demo.quantities])
    with st.expander("Every layer: relative change, and the error after applying the inverse rotation"):
        st.dataframe(table, hide_index=True, width="stretch")

    st.subheader("Why the residual stream cannot be rotated")
    residual = shared_runs.result(PageRequest("rotation/residual", (model_name, key), in_slot=False),
                                  lambda: residual_rotation(loaded.model, inputs, key))
    progress.progress(0.8, text="RoPE models")
    st.markdown(
        "A permutation of the residual stream is a symmetry of a LayerNorm model: the norm's gain and bias move with "
        "the channels. A general rotation mixes channels with different gains, and LayerNorm subtracts the mean "
        "(the all-ones direction), which a rotation does not keep. Below: the whole model, and the first norm alone.")
    chart(figs.error_comparison(residual, residual.tolerance), key="rot_residual")
    kind = next(iter(residual.notes["kind"]))
    norm_rows = [{"first norm of the model": f"{kind}, {label}", "permutation error": f"{v['permutation']:.1e}",
                  "rotation error": f"{v['rotation']:.1e}"} for label, v in residual.notes.items() if label != "kind"]
    st.dataframe(pd.DataFrame(norm_rows), hide_index=True)

    st.subheader("RoPE models: which rotations survive")
    seed_choice("rotation_rope_model", ROPE_MODELS, ROPE_MODELS[0])
    rope_name = st.selectbox("RoPE model", ROPE_MODELS, key="rotation_rope_model",
                             help="smollm2-135m converts a GGUF on first load (~50 s), then loads from a cache.")
    try:
        rope_loaded = shared_model(rope_name)
    except (ModelLoadError, OSError, ValueError) as error:
        show_failure(error, f"Could not load {rope_name}")
        st.stop()
    rope = shared_runs.result(PageRequest("rotation/rope", (rope_name, key), in_slot=False),
                              lambda: rope_rotations(rope_loaded.model, default_inputs(rope_loaded), key))
    progress.progress(1.0, text="done")
    progress.empty()
    plane_worst = worst_rel(rope.symmetry)
    general_worst = worst_rel(rope.broken)
    st.markdown(
        f"Rotary embeddings rotate each query/key plane (channel i with i + head_dim/2) by a position-dependent angle. "
        f"A rotation inside those planes commutes with RoPE: worst error **{plane_worst:.1e}** "
        f"(tolerance {rope.tolerance:g}). A general Q/K rotation does not: worst error **{general_worst:.2f}**. "
        "V/O rotations stay general on every model (values carry no position).")
    chart(figs.error_comparison(rope, rope.tolerance), key="rot_rope")


def precision_sentence(model) -> str:
    """Why a float32 'same function' shows 1e-7 and not 1e-15, from the model's own dtype."""
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        return f"Computed in {str(dtype).removeprefix('torch.')}."
    return (f"Computed in float32, which keeps {torch.finfo(torch.float32).eps:.1e} of relative precision: errors of "
            f"1e-7 to 1e-5 are round-off there (float64, {torch.finfo(torch.float64).eps:.1e}, would show about "
            "1e-15).")


with page_runs() as shared_runs:  # each result's share of the run budget is held until the page is drawn
    main(shared_runs)
