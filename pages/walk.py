"""Guided walk: five steps a lecturer can click through, each a live figure with two computed sentences."""

import streamlit as st

from perm_core.engine.keys import InvalidKeyError, validate_key
from perm_core.engine.patches import shuffle_patches
from perm_core.explore.exploration import Exploration
from perm_core.explore.walk import STEPS, TITLES, run_step
from perm_core.models.zoo import WALK, serving
from ui.charts import figures
from ui.export import chart
from ui.runtime import shared_model
from ui.sidebar import ensure_view
from ui.state import lecture_key, parse_bool, publish, seed

(MODEL,) = serving(WALK)  # shipped, tiny and trained: every step runs in well under a second
# Large text, and the page starts near the top, so each step's first chart is whole on a 1024 x 768 projector
PROJECTOR_CSS = """<style>
[data-testid="stMainBlockContainer"] { padding-top: 3rem; }
[data-testid="stMainBlockContainer"] [data-testid="stMarkdown"] p { font-size: 1.45rem; }
[data-testid="stMainBlockContainer"] h1 { font-size: 2.6rem; padding-top: 0; }
</style>"""


def main() -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals."""
    ensure_view("none")
    seed("walk_step", 1, int, valid=lambda v: 1 <= v <= len(STEPS))
    seed("walk_key", lecture_key("tokens"))
    seed("walk_projector", False, parse_bool)

    def move(by: int) -> None:
        st.session_state["walk_step"] = min(max(st.session_state["walk_step"] + by, 1), len(STEPS))

    @st.cache_resource(show_spinner=False, max_entries=2)
    def walk_exploration(dtype_name: str) -> Exploration:
        from perm_core.models.defaults import default_inputs

        loaded = shared_model(MODEL, dtype_name)
        return Exploration(loaded.model, default_inputs(loaded), model_id=f"walk-{MODEL}-{dtype_name}")

    index = st.session_state["walk_step"]
    step = STEPS[index - 1]
    st.title(TITLES[step])
    with st.container(horizontal=True, vertical_alignment="bottom"):  # each control as wide as its label
        st.button("Previous", on_click=move, args=(-1,), disabled=index == 1, icon=":material/arrow_back:")
        st.button("Next", on_click=move, args=(1,), disabled=index == len(STEPS), icon=":material/arrow_forward:",
                  type="primary")
        key_text = st.text_input("Key", key="walk_key", width=160,
                                 help="any whole number 0 .. 2**64-1; each step uses it")
        st.toggle("Projector", key="walk_projector", help="large text for a lecture hall")
        st.caption(f"step {index} of {len(STEPS)} · {MODEL}, every number computed live")
    projector = st.session_state["walk_projector"]
    if projector:
        st.html(PROJECTOR_CSS)

    def show(fig, **options) -> None:
        """A chart, its texts enlarged in projector mode (the CSS above reaches paragraphs, not a chart's own fonts)."""
        chart(figures.for_projector(fig) if projector else fig, **options)
    try:
        key = validate_key(key_text)
    except InvalidKeyError as error:
        st.error(f"{error} The walk keeps going with key 7.")
        key = 7

    explorer = walk_exploration("float64")
    done = run_step(explorer, step, key, walk_exploration("float32") if step == "exact" else None)
    x = done.extra
    g = explorer.geometry

    if step == "tokens":
        st.markdown(f"Key {key} shuffles the {explorer.n_tokens - 1} patches of this digit, and every patch takes its "
                    f"position embedding along: the model sees the same set of (patch, position) pairs in another "
                    "order. "
                    f"It still answers **{x['predicted_scrambled']}** (first answer: {x['predicted']}), and the two "
                    f"probability vectors differ by at most **{x['probability_gap']:.1e}**.")
        pictures = st.columns([1, 1, 2])
        pixels = explorer.subject.inputs["pixel_values"]
        pictures[0].image(figures.mosaic_image(pixels, g.patch_size, 220), caption="the digit")
        pictures[1].image(figures.mosaic_image(shuffle_patches(pixels, done.result.scramble.tokens, g.patch_size),
                                               g.patch_size, 220), caption=f"its patches shuffled, key {key}")
        digits = [str(d) for d in range(len(x["original"]))]
        show(figures.paired_bars(digits, x["original"].tolist(), x["scrambled"].tolist(),
                                  ("original", "shuffled"), "class probabilities"), width="stretch", where=pictures[2])
    elif step == "channels":
        st.markdown(f"Key {key} permutes the {g.d_model} channels of every token, and every weight, norm and bias is "
                    f"permuted to match. After block 0 the scrambled hidden state differs from the original by "
                    f"**{x['block0_moved']:.2f}** (relative); putting its columns back gives the original to "
                    f"**{x['block0_restored']:.1e}**.")
        columns = st.columns(3)
        zmax, _ = figures.robust_zmax(x["hidden"][0])
        for column, matrix, title in zip(columns, x["hidden"], ("original", f"scrambled, key {key}", "un-scrambled"),
                                         strict=True):
            show(figures.heatmap(matrix, f"block 0 hidden state: {title}", "channel", "token",
                                  zmax=zmax, wrap=30), width="stretch", where=column)
    elif step == "heads":
        grid = x["grid"]
        st.markdown(f"Key {key} reorders the {g.n_heads} heads of every layer (with their query, key, value and output "
                    "weights). On the right each map sits in its new place, and the bold number says which original "
                    f"head it is. Un-scrambled, every attention map matches the original to "
                    f"**{done.restored_error:.1e}**.")
        zmax = float(max(grid.original.max(), grid.scrambled.max()))
        columns = st.columns(2)
        show(figures.head_grid_figure(grid.original, grid.layers, "original heads", zmax=zmax),
              width="stretch", where=columns[0])
        show(figures.head_grid_figure(grid.scrambled, grid.layers, f"heads swapped, key {key}",
                                       grid.holds, zmax=zmax), width="stretch", where=columns[1])
    elif step == "rotation":
        before, after = x["weight"]
        st.markdown(f"Key {key} rotates the queries and keys of each head by one rotation R, the values by another S "
                    "and "
                    f"the output by S^T. The weight {x['weight_name']} changed by **{x['weight_change']:.2f}** of its "
                    "size, yet the attention scores are unchanged, because (QR)(KR)^T = QK^T: attention maps agree to "
                    f"**{x['attention_error']:.1e}**.")
        zmax, _ = figures.robust_zmax(before)
        columns = st.columns(2)
        show(figures.heatmap(before, "W_Q as trained", "input channel", "output channel", zmax=zmax),
              width="stretch", where=columns[0])
        show(figures.heatmap(after, f"W_Q rotated, key {key}", "input channel", "output channel",
                              zmax=zmax), width="stretch", where=columns[1])
    else:
        single = x["float32"]
        st.markdown("The scrambled model adds the same products in another order, and floating point rounds each sum "
                    f"a little differently. In float64 the worst relative error is **{done.restored_error:.1e}**, in "
                    f"float32 **{single.worst_rel:.1e}**, each far below its tolerance ({x['tolerance64']:.0e} and "
                    f"{x['tolerance32']:.0e}); {x['identical_bits']} of {x['n_tensors']} float64 tensors came back bit "
                    "for bit identical.")
        names = [e.name for e in done.result.errors]
        rel32 = {e.name: e.max_rel_error for e in single.errors}
        floor = 1e-18  # a bar of exactly zero has no height on a log axis
        fig = figures.paired_bars(names, [max(e.max_rel_error, floor) for e in done.result.errors],
                                  [max(rel32[n], floor) for n in names], ("float64", "float32"),
                                  figures.wrap_title(f"relative error of every tensor after un-scrambling (tokens and "
                                                     f"channels, key {key}; exact zeros drawn at {floor:.0e})", 60),
                                  log=True, height=340)
        figures.threshold(fig, x["tolerance64"], f"float64 tolerance {x['tolerance64']:.0e}")
        figures.threshold(fig, x["tolerance32"], f"float32 tolerance {x['tolerance32']:.0e}")
        show(fig, width="stretch")

    publish()


main()
