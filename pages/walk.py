"""Guided walk: five steps a lecturer can click through, each a live figure with two computed sentences."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import streamlit as st

from perm_core.engine.keys import InvalidKeyError, validate_key
from perm_core.explore.exploration import Exploration
from perm_core.explore.walk import STEPS, TITLES, run_step
from perm_core.models.zoo import WALK, serving
from ui import explore_panels as panels
from ui import projector
from ui import walk_panels as followed
from ui.charts import figures
from ui.charts.figures_attention import head_grid_figure
from ui.charts.figures_heatmap import heatmap
from ui.export import chart
from ui.runtime import shared_model
from ui.sidebar import ensure_view
from ui.state import lecture_key, publish, seed

(MODEL,) = serving(WALK)  # shipped, tiny and trained: every step runs in well under a second
# A bold number never breaks across lines ("5.9e-" / "07" in projector mode). Projector mode's large text and charts
# come from ui.projector, on every page.
WALK_CSS = """<style>
[data-testid="stMainBlockContainer"] [data-testid="stMarkdown"] strong { white-space: nowrap; }
</style>"""


def main() -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals."""
    ensure_view("none")
    seed("walk_step", 1, int, valid=lambda v: 1 <= v <= len(STEPS))
    seed("walk_key", lecture_key("tokens"))

    def move(by: int) -> None:
        st.session_state["walk_step"] = min(max(st.session_state["walk_step"] + by, 1), len(STEPS))

    @st.cache_resource(show_spinner=False, max_entries=2)
    def walk_exploration(dtype_name: str) -> Exploration:
        from perm_core.models.defaults import default_inputs

        loaded = shared_model(MODEL, dtype_name)
        return Exploration(loaded.model, default_inputs(loaded), model_id=f"walk-{MODEL}-{dtype_name}")

    index = st.session_state["walk_step"]
    step = STEPS[index - 1]
    st.html(WALK_CSS)
    # The controls come first, above the title: a title that wraps (steps 2 and 5) pushed them down, and a lecturer
    # clicking Next in the same place missed it. Here they stay put on every step, at every width.
    with st.container(horizontal=True, vertical_alignment="bottom"):  # each control as wide as its label
        st.button("Previous", on_click=move, args=(-1,), disabled=index == 1, icon=":material/arrow_back:")
        st.button("Next", on_click=move, args=(1,), disabled=index == len(STEPS), icon=":material/arrow_forward:",
                  type="primary")
        key_text = st.text_input("Key", key="walk_key", width=160,
                                 help="any whole number 0 .. 2**64-1; each step uses it")
        projector.toggle(st, "projector_walk")
        st.caption(f"step {index} of {len(STEPS)} · {MODEL}, every number computed live")
    st.title(TITLES[step])
    show = chart  # in projector mode chart() enlarges every chart's texts (ui.projector)
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
        # In projector mode (the sidebar closed) the pictures and the bars share one row, all on the first screen;
        # otherwise the pictures go across the page and the bars under them: beside the bars each picture was about
        # 100 px wide at 1024 px with the sidebar open.
        row = st.columns([1, 1, 1, 2]) if projector.on() else [*st.columns(3), None]
        followed.followed_pictures(row[:3], x, g.patch_size, g.fixed_tokens, key)
        digits = [str(d) for d in range(len(x["original"]))]
        fig = figures.paired_bars(digits, x["original"].tolist(), x["scrambled"].tolist(), ("original", "shuffled"),
                                  "class probabilities")
        # the legend under the digits: above a narrow plot it ran into the title
        fig.update_layout(legend=figures.LEGEND_BELOW, margin_b=70)
        show(fig, width="stretch", where=row[3] or st.columns([3, 2])[0])
    elif step == "channels":
        st.markdown(f"Key {key} permutes the {g.d_model} channels of every token, and every weight, norm and bias is "
                    f"permuted to match. After block 0 the scrambled hidden state differs from the original by "
                    f"**{x['block0_moved']:.2f}** (relative); putting its columns back gives the original to "
                    f"**{x['block0_restored']:.1e}**.")
        columns = st.columns(3)
        zmax, _ = figures.robust_zmax(x["hidden"][0])
        for i, (column, matrix, title) in enumerate(zip(columns, x["hidden"], ("original", f"scrambled, key {key}",
                                                                                "un-scrambled"), strict=True)):
            rows_at, cols_at, sentence = followed.channel_heatmap_paths(x, i)
            # the column's name on a line of its own: three titles of as many lines, three plots at one height
            show(heatmap(matrix, f"block 0 hidden state:<br>{figures.wrap_title(title, 30)}", "channel", "token",
                         zmax=zmax, row_paths=rows_at, col_paths=cols_at), width="stretch", where=column,
                 caption=sentence)
    elif step == "heads":
        grid = x["grid"]
        n_stayed = sum(held == h for row in grid.holds for h, held in enumerate(row))
        n_maps = sum(len(row) for row in grid.holds)
        stayed = ("; a map without a number is a head the key left in its place "
                  f"({n_stayed} of the {n_maps} drawn)") if n_stayed else " (the key moved every head drawn)"
        st.markdown(f"Key {key} reorders the {g.n_heads} heads of every layer (with their query, key, value and output "
                    "weights). On the right each map sits in its new place, and the bold number says which original "
                    f"head it is{stayed}. Un-scrambled, every attention map matches the original to "
                    f"**{done.restored_error:.1e}**.")
        zmax = float(max(grid.original.max(), grid.scrambled.max()))
        columns = st.columns(2)
        head = x["follow"]["head"]
        for i, (column, maps, title, holds) in enumerate(zip(columns, (grid.original, grid.scrambled), (
                "original heads", f"heads swapped, key {key}"), (None, grid.holds), strict=True)):
            show(head_grid_figure(maps, grid.layers, title, holds, zmax=zmax,
                                  followed=panels.head_places(x["paths"], head, i)),
                 width="stretch", where=column, caption=panels.head_sentence(x["paths"], grid.layers, head, i))
    elif step == "rotation":
        before, after = x["weight"]
        st.markdown(f"Key {key} rotates the queries and keys of each head by one rotation R, the values by another S "
                    "and "
                    f"the output by S^T. The weight {x['weight_name']} changed by **{x['weight_change']:.2f}** of its "
                    "size, yet the attention scores are unchanged, because (QR)(KR)^T = QK^T: attention maps agree to "
                    f"**{x['attention_error']:.1e}**.")
        zmax, _ = figures.robust_zmax(before)
        columns = st.columns(2)
        show(heatmap(before, "W_Q as trained", "input channel", "output channel", zmax=zmax),
              width="stretch", where=columns[0])
        show(heatmap(after, f"W_Q rotated, key {key}", "input channel", "output channel",
                      zmax=zmax), width="stretch", where=columns[1])
        st.caption("Nothing is outlined here, as it is on the other steps: a rotation mixes every channel of a head "
                   "into every other, so no single channel goes to one place that could be followed.")
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
                                  # two lines on the left: the legend sits above the plot's right end
                                  figures.wrap_title(f"relative error of every tensor after un-scrambling (tokens "
                                                     f"and channels, key {key})", 50),
                                  log=True, height=340)
        fig.update_yaxes(title=f"relative error (0 drawn at {floor:.0e})")
        # the labels beside the plot, in its right margin: on the line they were drawn over the bars
        for name in ("float64", "float32"):
            tolerance = x[f"tolerance{name[-2:]}"]
            figures.threshold(fig, tolerance, f"{name} tolerance<br>{tolerance:.0e}", position="outside")
        fig.update_layout(margin_r=170)
        show(fig, width="stretch")

    publish()


main()
