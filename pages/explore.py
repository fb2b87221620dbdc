"""Explore: original | scrambled | un-scrambled, for the input, hidden states, attention and outputs."""

import streamlit as st

from perm_core.engine import symmetries
from perm_core.engine.patches import shuffle_patches
from perm_core.explore.exploration import BROKEN_AT, control_options, kind_label, layer_of, patch_grid
from perm_core.models.inputs import token_labels
from ui import explore_panels as panels
from ui.charts import figures
from ui.export import chart
from ui.runtime import ExploreRequest, exploration, explore_run, mlp_result
from ui.sidebar import SYMMETRY_LABELS, ensure_view
from ui.state import publish, seed

st.title("Explore: scramble a Transformer, then un-scramble it")
st.caption("Left: the original model on the original input. Middle: the scrambled model (weights permuted by "
           "the keys in the sidebar) on the scrambled input. Right: the middle column with the inverse applied.")

view = ensure_view(page_globals=globals())
if view is None or not view.ready:
    if view is not None:
        view.show_messages()
    st.info("Fix the input or the keys in the sidebar to see the model.")
    st.stop()
view.show_messages()

with st.spinner("Running the original model (cached per model, input and dtype) ..."):
    explorer = exploration(view.model_name, view.dtype_name, view.device, view.input_id, view.loaded.model,
                           view.inputs)
geometry = explorer.geometry
options = control_options(explorer.subject, view.keys)
seed("control", "none", valid=lambda v: v == "none" or v in options)
if st.session_state.get("control") not in ("none", *options):
    st.session_state["control"] = "none"
control_names = ["none", *options]
top = st.columns([2, 3])
control = top[0].selectbox(
    "Negative control", control_names, key="control",
    format_func=lambda c: "none: apply the keys correctly" if c == "none" else
    f"{SYMMETRY_LABELS[options[c].symmetry]}: {options[c].description}",
    help="A near miss of a symmetry that must break the model; the charts below show the break.")
control = None if control == "none" else control

seed("layer", geometry.n_layers - 1, int, valid=lambda v: 0 <= v < geometry.n_layers)
seed("head", 0, int, valid=lambda v: 0 <= v < geometry.n_heads)
if st.session_state.get("layer", 0) >= geometry.n_layers:
    st.session_state["layer"] = geometry.n_layers - 1
if st.session_state.get("head", 0) >= geometry.n_heads:
    st.session_state["head"] = 0

request = ExploreRequest(view.model_name, view.dtype_name, view.device, view.input_id,
                         tuple(sorted(view.keys.items())), control, st.session_state["layer"])


def draw_page(result) -> None:
    """Everything the page shows of one result (the verdict, the input, the states, the proof, the key)."""
    verdict = result.verdict()
    if control:
        (top[1].error if result.worst_rel > BROKEN_AT else top[1].warning)(verdict)
    elif result.passed:
        top[1].success(verdict)
    elif result.expected_failure:  # the numbers are right: the model lacks a symmetry the sidebar switched on
        top[1].warning(verdict)
    else:
        top[1].error(verdict)
    if not result.scramble.is_identity:
        contrast = st.columns(3)
        contrast[0].metric("Scrambled differs from the original by", f"{result.moved:.2g}",
                           help=f"Relative change of what moved most: {result.moved_what}. Keys that move nothing "
                                "prove nothing, so a check needs at least 0.1.")
        contrast[1].metric("Un-scrambled differs by", f"{result.worst_rel:.1e}",
                           help="Worst relative error over every un-scrambled tensor (own scale).")
        contrast[2].metric("Tensors compared", f"{len(result.errors)}")

    restored, scrambled, original = result.restored, result.scrambled, explorer.original
    columns_titles = ("Original", "Scrambled", "Un-scrambled")

    # --- the input ---
    st.subheader("The input")
    cols = st.columns(3)
    tokens = result.scramble.tokens
    if geometry.input_kind == "image":
        pixels = view.inputs["pixel_values"]
        shuffled = shuffle_patches(pixels, tokens, geometry.patch_size) if tokens is not None else pixels
        back = shuffle_patches(shuffled, tokens.inverse(), geometry.patch_size) if tokens is not None else shuffled
        for col, title, image in zip(cols, columns_titles, (pixels, shuffled, back), strict=True):
            col.image(figures.mosaic_image(image, geometry.patch_size), caption=f"{title}: {view.input_label}")
        if view.credit:
            st.caption(f"{view.credit} Shown here resized to the model's input and cut into patches.")
    else:
        ids = view.inputs["input_ids"][0].tolist()
        words = token_labels(view.loaded, ids)  # the tokenizer's strings, or id chips like #17 without one
        order = tokens.index.tolist() if tokens is not None else list(range(len(ids)))
        for col, title, origins in zip(cols, columns_titles, (list(range(len(ids))), order, list(range(len(ids)))),
                                       strict=True):
            col.markdown(f"**{title}**")
            col.markdown(figures.token_chips([words[i] for i in origins], origins), unsafe_allow_html=True)
    st.latex(r"\begin{gathered}\text{tokens: } X \mapsto P X,\qquad \text{channels: } X \mapsto X Q \\ "
             r"f_{\theta'}(P X Q) = P\, f_\theta(X)\, Q\end{gathered}")  # two lines: fits a 1024-pixel window

    # --- hidden states and attention ---


    def layer_and_head() -> tuple[int, int]:
        pick = st.columns(2)
        last_layer, last_head = geometry.n_layers - 1, geometry.n_heads - 1
        chosen_layer = pick[0].slider("Layer (block)", 0, last_layer, key="layer") if last_layer > 0 else 0
        chosen_head = pick[1].slider("Head", 0, last_head, key="head") if last_head > 0 else 0
        return chosen_layer, chosen_head


    if geometry.input_kind == "image" and patch_grid(geometry, pixels.shape, explorer.n_tokens) is not None:
        st.subheader("Where the class token looks")  # right below the pictures: the heat moves with the patches
        layer, head = layer_and_head()
        panels.class_attention_overlays((pixels, shuffled, back), explorer, result, layer)
        st.subheader("Hidden states and attention")
    else:
        st.subheader("Hidden states and attention")
        layer, head = layer_and_head()
    panels.three_heatmaps(f"blocks.{layer}.hidden", (original[f"blocks.{layer}.hidden"].tensor, scrambled[
        f"blocks.{layer}.hidden"].tensor, restored[f"blocks.{layer}.hidden"]), "hidden state after block "
        f"{layer}", "channel", "token")
    attn = f"blocks.{layer}.attn"
    # Text: each map's axes name its tokens, in the order that map sees them (the scrambled map in the scrambled order).
    token_axes = None if geometry.input_kind == "image" else (words, [words[i] for i in order], words)
    panels.three_heatmaps(attn, tuple(t[0, head][None] for t in (original[attn].tensor, scrambled[attn].tensor,
                                                                 restored[attn])),
                          f"attention, block {layer}, head {head}", "key token", "query token", attention=True,
                          token_labels=token_axes)
    st.latex(r"A' = \mathrm{softmax}\!\Big(\tfrac{(PXQ)(Q^\top W_Q)(W_K^\top Q)(PXQ)^\top}{\sqrt{d}}\Big) "
             r"= P\,A\,P^\top \quad\text{since } QQ^\top = I")

    st.subheader(f"MLP neurons of block {layer}")
    panels.mlp_neurons(mlp_result(request, layer, explorer, result))

    st.subheader(f"Weights of block {layer}")
    panels.weights(explorer, result, view.keys, control, layer)

    if geometry.n_heads > 1:
        st.subheader("Every head of every layer")
        panels.head_grids(explorer, result)

    # --- outputs ---
    st.subheader("Outputs")
    panels.outputs(view, explorer, result)

    # --- the proof ---
    st.subheader("Proof: every layer, every tensor")
    rows = [{"layer": geometry.n_layers if layer_of(e.name) is None else layer_of(e.name), "kind": kind_label(e.name),
             "abs": e.max_abs_error, "rel": e.max_rel_error, "tolerance": e.tolerance} for e in result.errors]
    chart_title = ("un-scrambled vs original" + (f" — control: {result.control.description}" if control else ""))
    proof_columns = st.columns([2, 1])
    chart(figures.error_chart(rows, chart_title, tolerance=result.tolerance,
                              broken_at=BROKEN_AT if control else None), width="stretch", where=proof_columns[0])
    hidden = f"blocks.{layer}.hidden"
    chart(figures.difference_map(original[hidden].tensor[0], restored[hidden][0],
                                 f"|un-scrambled − original|<br>relative, block {layer} output"),
          where=proof_columns[1])
    st.caption(f"{len(result.errors)} tensors compared. Scrambled side took {sum(result.seconds.values()):.2f} s "
               f"(parameters {result.seconds['params']:.2f} s, trace {result.seconds['trace']:.2f} s).")

    # --- the key ---
    st.subheader("The key")
    panels.keys(view, explorer, symmetries)


# The run's share of the server's memory is held while the page is drawn, and given back however the run ends
with explore_run(request, explorer, computing=lambda: st.spinner("Running the scrambled model ...")) as result:
    draw_page(result)
publish()
