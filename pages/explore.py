"""Explore: original | scrambled | un-scrambled, for the input, hidden states, attention and outputs.

What reruns on a change: a key, the dtype, the input or the negative control reruns the whole page (each is a new
result); the layer slider reruns only block_panels (the chosen block's maps, MLP neurons, weights and difference
map), the head slider only attention_panel and the weight matrix only weight_panel, each a slice of the cached
result of the page's last run (st.fragment), so the verdict, the input, the head grid, the outputs, the proof and
the key stay as drawn.
"""

from dataclasses import replace

import streamlit as st

from perm_core.engine import symmetries
from perm_core.explore.exploration import BROKEN_AT, control_options, weight_names
from perm_core.models.inputs import token_labels
from perm_core.run import trace_names
from ui import explore_panels as panels
from ui.charts import figures
from ui.errors import show_unexpected
from ui.export import chart
from ui.runtime import ExploreRequest, exploration, explore, explore_block
from ui.sidebar import SYMMETRY_LABELS, ensure_view
from ui.state import publish, seed, seed_choice

COLUMN_TITLES = ("Original", "Scrambled", "Un-scrambled")


def main() -> None:
    """The page's data lives in this function's frame: nothing heavy outlives the run in the page's globals."""
    st.title("Explore: scramble a Transformer, then un-scramble it")
    st.caption("Left: the original model on the original input. Middle: the scrambled model (weights permuted by "
               "the keys in the sidebar) on the scrambled input. Right: the middle column with the inverse applied.")
    view = ensure_view()
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
    top = st.columns([2, 3])
    control = top[0].selectbox(
        "Negative control", ["none", *options], key="control",
        format_func=lambda c: "none: apply the keys correctly" if c == "none" else
        f"{SYMMETRY_LABELS[options[c].symmetry]}: {options[c].description}",
        help="A near miss of a symmetry that must break the model; the charts below show the break.")
    control = None if control == "none" else control

    # The block, head and weight shown are chosen before the run, so it computes everything the page draws.
    seed("layer", geometry.n_layers - 1, int, valid=lambda v: 0 <= v < geometry.n_layers)
    seed("head", 0, int, valid=lambda v: 0 <= v < geometry.n_heads)
    if st.session_state.get("layer", 0) >= geometry.n_layers:
        st.session_state["layer"] = geometry.n_layers - 1
    if st.session_state.get("head", 0) >= geometry.n_heads:
        st.session_state["head"] = 0
    layer = st.session_state["layer"]
    names = weight_names(explorer, layer)
    weight = seed_choice("weight", names, names[0]) if names else None
    request = ExploreRequest(view.model_name, view.dtype_name, view.device, view.input_id,
                             tuple(sorted(view.keys.items())), control, layer, st.session_state["head"], weight)
    # The run's share of the server's memory is held while the page is drawn, and given back however the run ends
    with explore(request, explorer, view.loaded, view.inputs,
                 computing=lambda: st.spinner("Running the scrambled model ...")) as data:
        draw(view, explorer, data, top[1], request)
    publish()


def draw(view, explorer, data, verdict_place, request) -> None:
    """Everything the page shows of one run (the verdict, the input, the states, the proof, the key), from tensors
    computed before the first chart."""
    result, geometry, control = data.result, explorer.geometry, data.result.control
    verdict = panels.verdict_line(result)
    if control:
        (verdict_place.error if result.worst_rel > BROKEN_AT else verdict_place.warning)(verdict)
    elif result.passed:
        verdict_place.success(verdict)
    elif result.expected_failure:  # the numbers are right: the model lacks a symmetry the sidebar switched on
        verdict_place.warning(verdict)
    else:
        verdict_place.error(verdict)
    if not result.scramble.is_identity:
        contrast = st.columns(3)
        contrast[0].metric("Scrambled differs from the original by", f"{result.moved:.2g}",
                           help=f"Relative change of what moved most: {result.moved_what}. Keys that move nothing "
                                "prove nothing, so a check needs at least 0.1.")
        contrast[1].metric("Un-scrambled differs by", f"{result.worst_rel:.1e}",
                           help="Worst relative error over every un-scrambled tensor (own scale).")
        contrast[2].metric("Tensors compared", f"{len(result.errors)}")

    st.subheader("The input")
    cols = st.columns(3)
    words = None
    if data.pictures is not None:
        for col, title, image in zip(cols, COLUMN_TITLES, data.pictures, strict=True):
            col.image(figures.mosaic_image(image, geometry.patch_size), caption=f"{title}: {view.input_label}")
        if view.credit:
            st.caption(f"{view.credit} Shown here resized to the model's input and cut into patches.")
    else:
        words = token_labels(view.loaded, view.inputs["input_ids"][0].tolist())  # id chips like #17 without one
        identity = list(range(len(words)))
        for col, title, origins in zip(cols, COLUMN_TITLES, (identity, data.token_order, identity), strict=True):
            col.markdown(f"**{title}**")
            col.markdown(figures.token_chips([words[i] for i in origins], origins), unsafe_allow_html=True)
    st.latex(r"\begin{gathered}\text{tokens: } X \mapsto P X,\qquad \text{channels: } X \mapsto X Q \\ "
             r"f_{\theta'}(P X Q) = P\, f_\theta(X)\, Q\end{gathered}")  # two lines: fits a 1024-pixel window

    # Text: each map's axes name its tokens, in the order that map sees them (the scrambled map in the scrambled order).
    token_axes = None if words is None else (words, [words[i] for i in data.token_order], words)
    # The fragments get this run's own views for their first draw (popped there), so a session keeps no result.
    block_panels(view, request, token_axes, {"explorer": explorer, "block": data.block})

    if data.heads is not None:
        st.subheader("Every head of every layer")
        panels.head_grids(data.heads, geometry.n_layers)

    st.subheader("Outputs")
    panels.outputs(data.outputs)

    st.subheader("Proof: every layer, every tensor")
    chart_title = ("un-scrambled vs original" + (f" — control: {control.description}" if control else ""))
    proof_columns = st.columns([2, 1])
    chart(figures.error_chart(data.proof_rows, chart_title, tolerance=result.tolerance,
                              broken_at=BROKEN_AT if control else None), width="stretch", where=proof_columns[0])
    proof_columns[1].caption(f"{len(result.errors)} tensors compared. Scrambled side took "
                             f"{sum(result.seconds.values()):.2f} s (parameters {result.seconds['params']:.2f} s, "
                             f"trace {result.seconds['trace']:.2f} s). The chosen block's output, cell by cell, is "
                             "under its hidden states above.")

    st.subheader("The key")
    panels.keys(view, explorer, symmetries)


def _handed(view, first: dict, name: str):
    """(explorer, the page run's views of `name` or None): a fragment's first draw uses what its page run handed it,
    a rerun of the fragment alone fetches again (the exploration is cached per model, input and dtype)."""
    explorer = first.pop("explorer", None) or exploration(view.model_name, view.dtype_name, view.device,
                                                          view.input_id, view.loaded.model, view.inputs)
    return explorer, first.pop(name, None)


@st.fragment
def block_panels(view, request, token_axes, first: dict) -> None:
    """What depends on the chosen block: its class-token attention, hidden state, attention map, difference map,
    MLP neurons and weights. A step of the layer slider reruns this function alone."""
    try:
        explorer, block = _handed(view, first, "block")
        layer = st.session_state["layer"]
        names = weight_names(explorer, layer)
        weight = seed_choice("weight", names, names[0]) if names else None
        request = replace(request, layer=layer, head=st.session_state["head"], weight=weight)
        if block is None:  # a rerun of this panel alone: the same result, another block
            with explore_block(request, explorer, view.inputs) as block:
                _block(view, explorer, request, block, token_axes, names)
        else:
            _block(view, explorer, request, block, token_axes, names)
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


def _block(view, explorer, request, block, token_axes, names) -> None:
    geometry, layer = explorer.geometry, request.layer
    if block.class_attention is not None:
        st.subheader("Where the class token looks")  # right below the pictures: the heat moves with the patches
        layer_slider(geometry)
        panels.class_attention_overlays(block.pictures, block.class_attention, geometry, layer)
        st.subheader("Hidden states and attention")
    else:
        st.subheader("Hidden states and attention")
        layer_slider(geometry)
    panels.three_heatmaps(trace_names.hidden(layer), block.hidden, f"hidden state after block {layer}", "channel",
                          "token")
    difference = st.columns([1, 2])
    chart(figures.difference_map(block.hidden[0][0], block.hidden[2][0],
                                 f"|un-scrambled − original|<br>relative, block {layer} output"), where=difference[0])
    difference[1].caption(f"The proof for block {layer}'s output, cell by cell: the un-scrambled hidden state against "
                          "the original, relative to the original's largest |value|. Every block's every tensor is "
                          "in the proof chart below.")
    attention_panel(view, request, token_axes, {"explorer": explorer, "attention": block.attention})
    if block.mlp is not None:
        st.subheader(f"MLP neurons of block {layer}")
        panels.mlp_neurons(block.mlp)
    if block.weight is not None:
        st.subheader(f"Weights of block {layer}")
        weight_panel(view, request, names, {"explorer": explorer, "weight": block.weight})


@st.fragment
def attention_panel(view, request, token_axes, first: dict) -> None:
    """The chosen head's attention map in the chosen block; a step of the head slider reruns this function alone."""
    try:
        explorer, attention = _handed(view, first, "attention")
        geometry = explorer.geometry
        if geometry.n_heads > 1:
            st.slider("Head", 0, geometry.n_heads - 1, key="head")
        head = st.session_state["head"]
        if attention is None or head != request.head:
            with explore_block(replace(request, head=head), explorer, view.inputs) as block:
                attention = block.attention
        panels.three_heatmaps(trace_names.attn(request.layer), attention,
                              f"attention, block {request.layer}, head {head}", "key token", "query token",
                              attention=True, token_labels=token_axes)
        st.latex(r"A' = \mathrm{softmax}\!\Big(\tfrac{(PXQ)(Q^\top W_Q)(W_K^\top Q)(PXQ)^\top}{\sqrt{d}}\Big) "
                 r"= P\,A\,P^\top \quad\text{since } QQ^\top = I")
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


@st.fragment
def weight_panel(view, request, names, first: dict) -> None:
    """One weight matrix of the chosen block; choosing another matrix reruns this function alone."""
    try:
        explorer, weight = _handed(view, first, "weight")
        chosen = seed_choice("weight", names, names[0])
        if weight is None or weight.name != chosen:
            with explore_block(replace(request, weight=chosen), explorer, view.inputs) as block:
                weight = block.weight
        panels.weights(weight, names)
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


def layer_slider(geometry) -> None:
    """The block slider; its value (in session state) chooses what block_panels draws of the run's result."""
    if geometry.n_layers > 1:
        st.slider("Layer (block)", 0, geometry.n_layers - 1, key="layer")


main()
