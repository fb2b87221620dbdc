"""Explore: original | scrambled | un-scrambled, for the input, hidden states, attention and outputs.

What reruns on a change: a key, the dtype, the input or the negative control reruns the whole page (each is a new
result); the followed token, channel or neuron reruns only path_panels (the input and the chosen block's panels,
where the path is drawn); the layer slider, its Back and Next buttons, each step of Play and the choice of the
block's view rerun only block_panels (the class token's overlays and the one view of the block the page shows:
hidden states with their difference map, attention, MLP neurons, experts or weights), the head slider only
attention_panel, the weight matrix only weight_panel and the followed head only head_grid_panel, each a slice of the
cached result of the page's last run (st.fragment), so the verdict, the outputs, the proof and the key stay as
drawn.

Play: block_panels reruns itself every PLAY_SECONDS (st.fragment's run_every: the browser asks for each step, so
no server thread waits between steps) and moves one block on, until the last. The browser drops such a timer only
at a full run, so pressing Play or Pause, and reaching the last block, take one full run that starts or stops it.
"""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import time
from dataclasses import replace

import streamlit as st

from perm_core.engine import symmetries
from perm_core.explore.exploration import BROKEN_AT, control_options, weight_names
from perm_core.explore.page_data import default_follow
from perm_core.explore.path import default_head
from perm_core.explore.routing import routing_views
from perm_core.models.input_spec import check_command
from perm_core.models.inputs import token_labels
from perm_core.run import trace_names
from ui import explore_panels as panels
from ui.charts.figures_input import mosaic_image, token_chips
from ui.charts.figures_proof import difference_map, error_chart
from ui.errors import show_unexpected
from ui.export import chart
from ui.runtime import ExploreRequest, exploration, explore, explore_block, explore_heads
from ui.sidebar import SYMMETRY_LABELS, ensure_view
from ui.state import picks_reset, publish, seed, seed_choice
from ui.summary import explore_summary

COLUMN_TITLES = ("Original", "Scrambled", "Un-scrambled")
PLAY_SECONDS = 1.5  # one block per step of Play
BLOCK_VIEWS = {"hidden": "Hidden states", "attention": "Attention", "mlp": "MLP neurons", "experts": "Experts chosen",
               "weights": "Weights"}


def main() -> None:
    """The page's data lives in this function's frame: nothing heavy outlives the run in the page's globals."""
    st.title("Explore: scramble a Transformer, then un\u2011scramble it")  # a hyphen no line breaks at
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
    if st.session_state.get("play_timer", False) and "play_layer" in st.session_state:
        # Play's timer ran until this full run (it starts or stops the timer): Play's own count of the block holds,
        # not the slider's value, which the browser may still report from before Play's last step (play_step).
        st.session_state["layer"] = st.session_state["play_layer"]
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
    result, control = data.result, data.result.control
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

    # Text: each map's axes name its tokens, in the order that map sees them (the scrambled map in the scrambled order).
    words = None if data.pictures is not None else token_labels(view.loaded, view.inputs["input_ids"][0].tolist())
    token_axes = None if words is None else (words, [words[i] for i in data.token_order], words)
    # The fragments get this run's own views for their first draw (popped there), so a session keeps no result.
    path_panels(view, request, words, token_axes, {"explorer": explorer, "block": data.block, "page_run": True})

    if data.heads is not None:
        st.subheader("Every head of every layer")
        head_grid_panel(view, request, {"explorer": explorer, "heads": data.heads})

    st.subheader("Outputs")
    panels.outputs(data.outputs)

    st.subheader("Proof: every layer, every tensor")
    chart_title = ("un-scrambled vs original" + (f" — control: {control.description}" if control else ""))
    proof_columns = st.columns([2, 1])
    chart(error_chart(data.proof_rows, chart_title, tolerance=result.tolerance,
                      broken_at=BROKEN_AT if control else None), width="stretch", where=proof_columns[0])
    proof_columns[1].caption(f"{len(result.errors)} tensors compared. Scrambled side took "
                             f"{sum(result.seconds.values()):.2f} s (parameters {result.seconds['params']:.2f} s, "
                             f"trace {result.seconds['trace']:.2f} s). The chosen block's output, cell by cell, is "
                             "in its Hidden states view above.")

    st.subheader("The key")
    panels.keys(view, explorer, symmetries)

    st.subheader("Take it home")
    keys_text = ", ".join(f"{SYMMETRY_LABELS[name].lower()} {key}" for name, key in view.keys.items()) or "none"
    command = check_command(view.model_name, view.dtype_name, dict(view.keys), view.input_spec, backward=False)
    st.markdown("The same model, input and keys from a terminal (the full check: each symmetry on its own and all "
                "together, and the negative controls" + (", with your image file where it says YOUR_FILE"
                                                         if view.input_spec is None else "") + "):")
    st.code(command, language="bash", wrap_lines=True)
    st.download_button("Take-home summary (Markdown)",
                       explore_summary(view.model_name, view.input_label, keys_text, result, verdict,
                                       data.proof_rows, command, routing_views(explorer, result)),
                       file_name=f"explore-{view.model_name.replace(':', '_')}-{view.dtype_name}.md",
                       mime="text/markdown", on_click="ignore")


def _handed(view, first: dict, name: str):
    """(explorer, the page run's views of `name` or None): a fragment's first draw uses what its page run handed it,
    a rerun of the fragment alone fetches again (the exploration is cached per model, input and dtype)."""
    explorer = first.pop("explorer", None) or exploration(view.model_name, view.dtype_name, view.device,
                                                          view.input_id, view.loaded.model, view.inputs)
    return explorer, first.pop(name, None)


def _current(request, explorer):
    """The request with the block, head and weight matrix the session shows now."""
    layer = st.session_state["layer"]
    names = weight_names(explorer, layer)
    weight = seed_choice("weight", names, names[0]) if names else None
    return replace(request, layer=layer, head=st.session_state["head"], weight=weight), names


@st.fragment
def path_panels(view, request, words, token_axes, first: dict) -> None:
    """What shows the followed token, channel and neuron: the choice of them, the input and the chosen block's
    panels. Choosing another reruns this function alone (the verdict, head grid, outputs, proof and key stay)."""
    try:
        explorer, block = _handed(view, first, "block")
        page_run = first.pop("page_run", False)
        if block is None:  # a rerun of this panel alone: the same result
            with explore_block(_current(request, explorer)[0], explorer, view.inputs) as block:
                _path(view, explorer, request, block, words, token_axes, page_run)
        else:
            _path(view, explorer, request, block, words, token_axes, page_run)
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


def _path(view, explorer, request, block, words, token_axes, page_run: bool) -> None:
    geometry = explorer.geometry
    st.subheader("The input")
    follow = follow_controls(view, explorer, block)
    cols = st.columns(3)
    tokens = block.tokens
    if block.pictures is not None:
        for i, (col, title, image) in enumerate(zip(cols, COLUMN_TITLES, block.pictures, strict=True)):
            patch = panels.followed_patch(tokens, follow, i, geometry.fixed_tokens)
            col.image(mosaic_image(image, geometry.patch_size, patch=patch),
                      caption=f"{title}: {view.input_label}")
            if patch is not None:
                stayed = patch == panels.followed_patch(tokens, follow, 0, geometry.fixed_tokens)
                col.caption(panels.patch_sentence(follow["token"], patch, image.shape[-1] // geometry.patch_size, i,
                                                  stayed))
        if view.credit:
            st.caption(f"{view.credit} Shown here resized to the model's input and cut into patches.")
    else:
        identity = list(range(len(words)))
        order = list(tokens.held) if tokens.held is not None else identity
        for i, (col, title, origins) in enumerate(zip(cols, COLUMN_TITLES, (identity, order, identity), strict=True)):
            col.markdown(f"**{title}**")
            col.markdown(token_chips([words[j] for j in origins], origins, follow.get("token")),
                         unsafe_allow_html=True)
            sentence = panels.token_sentence(tokens, follow, i)
            if sentence:
                col.caption(sentence)
    st.latex(r"\begin{gathered}\text{tokens: } X \mapsto P X,\qquad \text{channels: } X \mapsto X Q \\ "
             r"f_{\theta'}(P X Q) = P\, f_\theta(X)\, Q\end{gathered}")  # two lines: fits a 1024-pixel window
    # Play's timer is block_panels' own (a step reruns it alone); the browser drops a timer only at a full run.
    st.fragment(block_panels, run_every=play_every(page_run))(
        view, request, token_axes, {"explorer": explorer, "block": block, "page_run": page_run})


FOLLOW_HELP = ("Outlined in every view below, in each column where it is: the scrambled column's place is where "
               "the key sent it, and the inverse brings it back.")


def follow_controls(view, explorer, block) -> dict[str, int]:
    """The followed token, channel and MLP neuron (item -> original number): the app's picks (the patch the class
    token attends to most, the channel and the neuron with the largest mean |value|) until a student picks, and
    again for another model or input."""
    sizes = {"token": explorer.n_tokens, "channel": explorer.geometry.d_model}
    if block.mlp is not None:
        sizes["neuron"] = block.mlp.original.shape[-1]
    defaults = default_follow(explorer, view.inputs, block)
    changed = picks_reset("follow", f"{view.model_name}|{view.input_id}")
    labels = {"token": "Follow token", "channel": "Follow channel", "neuron": "Follow MLP neuron"}
    cols = st.columns(3)
    follow = {}
    for col, (item, size) in zip(cols, sizes.items(), strict=False):
        name = f"follow_{item}"
        seed(name, defaults[item], int, valid=lambda v, n=size: 0 <= v < n)
        if changed or not 0 <= st.session_state[name] < size:
            st.session_state[name] = defaults[item]
        follow[item] = int(col.number_input(labels[item], 0, size - 1, step=1, key=name, help=FOLLOW_HELP))
    columns = "the channel and the neuron" if "neuron" in sizes else "the channel"
    st.caption(f"Outlined in every view below: the token in black, {columns} in magenta, each where the keys put it. "
               "The app picked, of those the keys move, "
               + ("the patch the class token attends to most" if block.class_attention is not None
                  else "the first token")
               + (", the most active channel and neuron" if "neuron" in sizes else " and the most active channel")
               + "; pick others.")
    return follow


def play_every(page_run: bool) -> float | None:
    """block_panels' run_every: PLAY_SECONDS while playing. A page run records whether it set the timer; a rerun of
    a panel alone that finds Play started or stopped since takes a full run (the browser drops timers only then)."""
    playing = st.session_state.get("playing", False)
    if page_run:
        st.session_state["play_timer"] = playing
    elif st.session_state.get("play_timer", False) != playing:
        st.rerun()
    return PLAY_SECONDS if playing else None


def play_step(n_layers: int) -> None:
    """A rerun of the block panel alone while Play is on or its timer runs: Play's step, once per PLAY_SECONDS (the
    panel's other reruns, a widget's, step nothing). Play keeps its own count of the block (play_layer): the
    browser's slider reports the value it showed before a step for one more request, which would set the block back
    (and, as a change of the slider, fire its callbacks), so each such rerun sets it again from the count."""
    state = st.session_state
    if state.get("playing", False) or state.get("play_timer", False):  # (a count from another model: its last block)
        state["layer"] = min(state.get("play_layer", state["layer"]), n_layers - 1)
    play_every(False)  # Play just pressed, paused or at its end: a full run starts or stops the timer
    if state.get("playing", False) and time.monotonic() - state.get("play_stepped", 0.0) >= PLAY_SECONDS / 2:
        state["play_layer"], state["playing"] = panels.next_layer(state["layer"], n_layers)
        state["layer"], state["play_stepped"] = state["play_layer"], time.monotonic()


def _step(delta: int, n_layers: int) -> None:
    """Back or Next: one block, from the block Play counted if it was on (it stops)."""
    state = st.session_state
    start = state.get("play_layer", state["layer"]) if state.get("playing", False) else state["layer"]
    state["playing"] = False
    state["layer"] = state["play_layer"] = min(max(start + delta, 0), n_layers - 1)


def _play(n_layers: int) -> None:
    """Play (from block 0 when at the last block) or Pause."""
    state = st.session_state
    if state.get("playing", False):
        state["playing"] = False
        state["layer"] = min(state.get("play_layer", state["layer"]), n_layers - 1)
        return
    start = 0 if state["layer"] >= n_layers - 1 else state["layer"]
    state["playing"], state["layer"], state["play_layer"] = True, start, start
    state["play_stepped"] = time.monotonic()


def block_panels(view, request, token_axes, first: dict) -> None:
    """What depends on the chosen block: its class-token attention and the one view of it chosen (block_view_control:
    hidden state with the difference map, attention map, MLP neurons, experts or weights). A step of the layer slider
    (or of Play), or another view, reruns this function alone: path_panels makes it a fragment, with Play's timer."""
    try:
        explorer, block = _handed(view, first, "block")
        if not first.pop("page_run", False) and block is None:  # this panel's own rerun: Play's step, or a button
            play_step(explorer.geometry.n_layers)
        request, names = _current(request, explorer)
        if block is None or block.choice.layer != request.layer:  # this panel alone: the same result, another block
            with explore_block(request, explorer, view.inputs) as block:
                _block(view, explorer, request, block, token_axes, names)
        else:
            _block(view, explorer, request, block, token_axes, names)
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


def followed() -> dict[str, int]:
    """The followed items (follow_controls put them in session state, in range for this model and input)."""
    return {item: int(st.session_state[f"follow_{item}"]) for item in ("token", "channel", "neuron")
            if st.session_state.get(f"follow_{item}") is not None}


def _block(view, explorer, request, block, token_axes, names) -> None:
    geometry, layer = explorer.geometry, request.layer
    follow = followed()
    if block.class_attention is not None:
        st.subheader("Where the class token looks")  # right below the pictures: the heat moves with the patches
        layer_slider(geometry)
        panels.class_attention_overlays(block.pictures, block.class_attention, geometry, layer, block.tokens, follow)
        st.subheader(f"Inside block {layer}")
    else:
        st.subheader(f"Inside block {layer}")
        layer_slider(geometry)
    shown = block_view_control(block)
    if shown in ("hidden", "mlp"):
        seed("column_order", "stored", valid=lambda v: v in panels.ORDERS)
        order = st.radio("Channel and neuron columns", list(panels.ORDERS), format_func=panels.ORDERS.get,
                         horizontal=True, key="column_order", persist_state="page",
                         help="Sorted by their mean over the tokens, random-looking channels become a ramp: in the "
                              "original's order the scrambled channels leave it, each where its key put it; each in "
                              "its own order, the three ramps are the same.")
    if shown == "hidden":
        panels.three_heatmaps(trace_names.hidden(layer), block.hidden, f"hidden state after block {layer}",
                              "channel", "token", paths=block.hidden_paths, follow=follow, order=order)
        difference = st.columns([1, 2])
        chart(difference_map(block.hidden[0][0], block.hidden[2][0],
                             f"|un-scrambled − original|<br>relative, block {layer} output"), where=difference[0])
        difference[1].caption(f"The proof for block {layer}'s output, cell by cell: the un-scrambled hidden state "
                              "against the original, relative to the original's largest |value|. Every block's every "
                              "tensor is in the proof chart below.")
    elif shown == "attention":
        attention_panel(view, request, token_axes, {"explorer": explorer, "attention": block.attention,
                                                    "paths": block.attention_paths})
    elif shown == "mlp":
        panels.mlp_neurons(block.mlp, follow, order)
    elif shown == "experts":  # a mixture of experts: its block has no dense MLP to show
        panels.routing(block.routing, token_axes)
    elif shown == "weights":
        weight_panel(view, request, names, {"explorer": explorer, "weight": block.weight})


def block_view_control(block) -> str:
    """Which of the block's views the page draws (BLOCK_VIEWS): one at a time, so a step of the layer slider or of
    Play redraws that view's charts, not every chart of the block. The choice is in the URL."""
    views = [name for name, present in (("hidden", True), ("attention", True), ("mlp", block.mlp is not None),
                                         ("experts", block.routing is not None),
                                         ("weights", block.weight is not None)) if present]
    seed_choice("block_view", views, "hidden")
    st.segmented_control("Show", views, key="block_view", required=True, format_func=BLOCK_VIEWS.get,
                         help="One view of the chosen block at a time; each keeps the block when you step through "
                              "the layers.")
    return st.session_state["block_view"]


@st.fragment
def head_grid_panel(view, request, first: dict) -> None:
    """The layer x head grids with the followed head outlined; choosing another head reruns this function alone,
    from the page run's cached result (its request, whose block the run recorded: no model runs)."""
    try:
        explorer, grid = _handed(view, first, "heads")
        if grid is None:
            with explore_heads(request, explorer, view.inputs) as grid:
                _head_grids(view, explorer, grid)
        else:
            _head_grids(view, explorer, grid)
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


def _head_grids(view, explorer, grid) -> None:
    n_heads = explorer.geometry.n_heads
    default = default_head(n_heads, grid.paths[0] if grid.paths else None)
    seed("follow_head", default, int, valid=lambda v: 0 <= v < n_heads)
    if picks_reset("follow_head", f"{view.model_name}|{view.input_id}") or \
            not 0 <= st.session_state["follow_head"] < n_heads:
        st.session_state["follow_head"] = default
    head = int(st.columns(3)[0].number_input("Follow head", 0, n_heads - 1, step=1, key="follow_head",
                                             help="Outlined in both grids, in every layer, where the key put it. "
                                                  "The app picked the first head the key moves."))
    panels.head_grids(grid, explorer.geometry.n_layers, head)


@st.fragment
def attention_panel(view, request, token_axes, first: dict) -> None:
    """The chosen head's attention map in the chosen block; a step of the head slider reruns this function alone."""
    try:
        explorer, attention = _handed(view, first, "attention")
        paths = first.pop("paths", None)
        geometry = explorer.geometry
        if geometry.n_heads > 1:
            st.slider("Head", 0, geometry.n_heads - 1, key="head", persist_state="page")  # kept while not shown
        head = st.session_state["head"]
        if attention is None or head != request.head:
            with explore_block(replace(request, head=head), explorer, view.inputs) as block:
                attention, paths = block.attention, block.attention_paths
        panels.three_heatmaps(trace_names.attn(request.layer), attention,
                              f"attention, block {request.layer}, head {head}", "key token", "query token",
                              attention=True, token_labels=token_axes, paths=paths, follow=followed())
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
        panels.weights(weight, names, followed())
        publish()
    except Exception as error:  # noqa: BLE001 - app.py's handler does not see a fragment's own rerun
        show_unexpected(error)


def layer_slider(geometry) -> None:
    """The block slider, and Back, Play / Pause and Next under it; its value (in session state) chooses what
    block_panels draws of the run's result. Each button reruns block_panels alone (Play: see play_every)."""
    n = geometry.n_layers
    if n <= 1:
        return
    layer, playing = st.session_state["layer"], st.session_state.get("playing", False)
    st.slider("Layer (block)", 0, n - 1, key="layer", disabled=playing)
    row = st.container(horizontal=True, vertical_alignment="center")  # under the slider: each label in full at 1024 px
    row.button("Back", icon=":material/skip_previous:", key="layer_back", on_click=_step, args=(-1, n),
               disabled=layer == 0, help="The block before this one")
    row.button("Pause" if playing else "Play", icon=":material/pause:" if playing else ":material/play_arrow:",
               key="layer_play", on_click=_play, args=(n,),
               help=f"Step through the blocks, one every {PLAY_SECONDS:g} s" + (
                   " (from block 0)" if layer == n - 1 else ""))
    row.button("Next", icon=":material/skip_next:", key="layer_next", on_click=_step, args=(1, n),
               disabled=layer == n - 1, help="The block after this one")
    if playing:
        row.caption(f"Playing: block {layer} of {n - 1}, the next in {PLAY_SECONDS:g} s.")


main()
