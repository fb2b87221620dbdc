"""Panels of the Explore page: each draws three columns or one key picture from computed tensors; and the verdict
as the page words it."""

from __future__ import annotations

import streamlit as st

from perm_core.explore.exploration import ExploreResult, bits_summary, format_bits, permutation_of
from perm_core.explore.path import column_order
from perm_core.explore.routing import choice_sentences, weight_sentences
from ui.charts import figures, figures_routing
from ui.charts.figures_attention import attention_overlay, head_grid_figure
from ui.charts.figures_heatmap import heatmap
from ui.charts.figures_input import pixels_to_rgb
from ui.charts.figures_path import permutation_figure
from ui.export import chart
from ui.sidebar import SYMMETRY_LABELS

TITLES = ("Original", "Scrambled", "Un-scrambled")
# What the visitor can do about a verdict, by its outcome: perm_core's verdict says only what was measured
NEXT_STEP = {"moved nothing": "Choose another key.", "lacks a symmetry": "Switch {names} off to check the others."}


def next_layer(layer: int, n_layers: int) -> tuple[int, bool]:
    """One step of the layer slider's Play: (the next block, whether Play goes on after it: not past the last)."""
    step = min(layer + 1, n_layers - 1)
    return step, step < n_layers - 1


def verdict_line(result: ExploreResult) -> str:
    """The run's verdict, and what to do about it where the sidebar can change it."""
    next_step = NEXT_STEP.get(result.outcome)
    if next_step is None:
        return result.verdict()
    return f"{result.verdict()} {next_step.format(names=' and '.join(result.not_holding))}"


# How the columns of a channel or neuron map are ordered: as the tensors store them, or sorted by their mean over the
# tokens (perm_core.explore.path.column_order), so that channels that look random show as a ramp
ORDERS = {"stored": "as stored", "original": "sorted by the original's means",
          "own": "each sorted by its own means"}
WORDS = {"token": "token", "channel": "channel", "neuron": "neuron"}


def column_orders(arrays, order: str) -> tuple | None:
    """Each column's display order of a map's columns (stored column numbers, left to right), or None as stored.
    "original": all three in the original's sort, so a scrambled channel leaves the ramp at its key's place;
    "own": each in its own sort, so the three draw the same ramp (a permutation keeps every channel's mean)."""
    if order == "original":
        return (column_order(arrays[0]),) * 3
    if order == "own":
        return tuple(column_order(array) for array in arrays)
    return None


def placed(paths, follow: dict, column: int, orders=None) -> tuple[list, list]:
    """([(item, row)], [(item, column)]): where each followed item is drawn in one column (0 original, 1 scrambled,
    2 un-scrambled) of a map whose rows and columns are `paths` (perm_core.explore.path.AxisPath): the position the
    element's own permutation gives (AxisPath.path), then its place in the column's display order. An item the
    element mixes (a rotation) or that this map does not hold is left out."""
    rows, cols = stored_places(paths, follow, column)
    if orders is not None:
        cols = [(item, orders[column].index(position)) for item, position in cols]
    return rows, cols


def stored_places(paths, follow: dict, column: int) -> tuple[list, list]:
    """placed() in the tensors' own order (before any display sort)."""
    found = ([], [])
    if paths is None:
        return found
    for path, out in zip(paths, found, strict=True):
        item = path.item
        if item not in follow or not 0 <= follow[item] < path.size:
            continue
        position = path.path(follow[item])[column]
        if position is not None:
            out.append((item, position))
    return found


def path_sentence(paths, follow: dict, column: int, orders=None) -> str:
    """One plain sentence of where the followed items are in this column, from the same positions the outlines use."""
    def places(at: int) -> dict:
        """(item, stored position) -> (its axes, the position drawn): an attention map holds a token as both."""
        found: dict = {}
        drawn = placed(paths, follow, at, orders)
        for axis, pairs, shown in zip(("row", "column"), stored_places(paths, follow, at), drawn, strict=True):
            for (item, position), (_, at_drawn) in zip(pairs, shown, strict=True):
                found.setdefault((item, position), ([], at_drawn))[0].append(axis)
        return found

    here, before = places(column), places(0)
    groups: dict[str, list[str]] = {}  # verb -> its phrases, so that a sentence says each verb once
    for (item, position), (axes, drawn) in here.items():
        what = f"{WORDS[item]} {follow[item]}"
        where = f"{' and '.join(axes)} {drawn}" + (f" ({axes[-1]} {position} as stored)" if drawn != position else "")
        if column == 0:
            groups.setdefault("", []).append(f"{what} is {where}")
        elif column == 1 and (item, position) in before:
            groups.setdefault("left", []).append(f"{what} in {where}")
        elif column == 1:
            groups.setdefault("moved", []).append(f"{what} to {where}")
        else:
            groups.setdefault("puts", []).append(f"{what} back in {where}")
    lead = {0: "In the original,", 1: "The keys", 2: "The inverse"}[column]
    text = (lead + " " + " and ".join(f"{verb} {_and(phrases)}".strip() for verb, phrases in groups.items()) + "."
            if groups else "")
    mixed = [] if paths is None else list(dict.fromkeys(
        p.item for p in paths if p.item in follow and 0 <= follow[p.item] < p.size and p.held is None))
    if mixed and column == 1:
        text += f" The keys rotate the {' and '.join(mixed)}s together: no single place to outline."
    return text.strip()


def _and(parts) -> str:
    parts = list(parts)
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def three_heatmaps(name: str, tensors, title: str, x_title: str, y_title: str, attention: bool = False,
                   token_labels=None, paths=None, follow=None, order: str = "stored") -> None:
    """Same colour scale in all three columns, so equal pictures mean equal numbers. Hidden states: the scale
    clips at a percentile of the original's |values| (said under the charts), so outlier channels do not
    wash the rest out; attention probabilities use their full range. paths: the map's (rows, columns)
    AxisPaths; follow: item -> the followed original item, outlined in each column where the element put it, with
    a sentence saying where; order: the columns' display order (ORDERS; channel and neuron maps)."""
    arrays = [figures.to_numpy(t)[0] for t in tensors]
    if attention:
        zmax = largest = float(abs(arrays[0]).max()) or 1.0
    else:
        zmax, largest = figures.robust_zmax(arrays[0])
    sorts = column_orders(arrays, order) if not attention else None
    follow = follow or {}
    cols = st.columns(3)
    for i, (col, label, array) in enumerate(zip(cols, TITLES, arrays, strict=True)):
        labels = token_labels[i] if token_labels else None
        shown = array[:, list(sorts[i])] if sorts is not None else array
        rows_at, cols_at = placed(paths, follow, i, sorts)
        fig = heatmap(shown, f"{label}:<br>{title}", x_title + (" (sorted)" if sorts else ""), y_title,
                      colorscale="Viridis" if attention else "RdBu", symmetric=not attention,
                      zmax=zmax, y_labels=labels, x_labels=labels, row_paths=rows_at, col_paths=cols_at)
        chart(fig, width="stretch", key=f"{name}-{label}", where=col, caption=path_sentence(paths, follow, i, sorts))
    if zmax < largest:
        st.caption(f"Colours clip at ±{zmax:.3g}, the {figures.CLIP_PERCENTILE:g}th percentile of the original's "
                   f"|values| (the largest is {largest:.3g}): a few outlier channels would otherwise wash every "
                   "other cell out. Hover a cell for its exact value.")
    if sorts is not None:
        what = f"{x_title}s"
        st.caption(f"The {what} " + (f"in the original's order of their means (smallest first) in all three: the "
                                     f"scrambled model's {what} leave the ramp, each where its key put it."
                                     if order == "original" else
                                     "each sorted by their own means (smallest first): the three ramps are the same, "
                                     f"because a permutation moves {what} without changing them.")
                   + " Hover a cell for its value; its column number is its place in this order.")


def followed_patch(tokens, follow: dict, column: int, fixed_tokens: int) -> int | None:
    """The patch (row-major number) that holds the followed token in one column, from the element's own token
    permutation (tokens: the input's AxisPath); None when no patch token is followed."""
    token = follow.get("token")
    if tokens is None or token is None or not fixed_tokens <= token < tokens.size:
        return None
    position = tokens.path(token)[column]
    return None if position is None or position < fixed_tokens else position - fixed_tokens


def class_attention_overlays(pictures, grids, geometry, layer: int, tokens=None, follow=None) -> None:
    """Below each of the three pictures, the class token's attention to every patch (mean of the heads) in
    `layer`, drawn over that picture. pictures: three pixel batches (original, scrambled, un-scrambled); grids:
    the three attention grids [rows, cols] (perm_core.explore.page_data); tokens, follow: the input's token path
    and the followed token, its patch outlined in each column."""
    grids = [figures.to_numpy(g) for g in grids]
    zmax = float(grids[0].max()) or 1.0  # one colour scale for all three: equal colours mean equal numbers
    heads = f"mean of {geometry.n_heads} heads" if geometry.n_heads > 1 else "one head"
    cols = st.columns(3)
    for i, (col, label, pixels, values) in enumerate(zip(cols, TITLES, pictures, grids, strict=True)):
        patch = followed_patch(tokens, follow or {}, i, geometry.fixed_tokens)
        fig = attention_overlay(pixels_to_rgb(pixels), values, geometry.patch_size,
                                f"{label}:<br>class token's attention<br>block {layer}", zmax=zmax,
                                name=f"class token's attention to each patch ({heads})", patch=patch)
        chart(fig, width="stretch", key=f"cls-attention-{label}", where=col,
              caption=None if patch is None else patch_sentence(
                  follow["token"], patch, values.shape[1], i,
                  stayed=patch == followed_patch(tokens, follow or {}, 0, geometry.fixed_tokens)))
    st.caption(f"Heat: how much the class token attends to each patch in block {layer} ({heads}; the class "
               "token's attention to itself is left out). The heat travels with its patch in the scrambled "
               "model and returns to its place after un-scrambling. Hover a cell for its value.")


def token_sentence(tokens, follow: dict, column: int) -> str:
    """Where the followed token is among the input's chips in one column (places numbered from 0, as its chip's tip
    says), from the element's own token permutation (tokens: the input's AxisPath)."""
    token = follow.get("token")
    if tokens is None or token is None or not 0 <= token < tokens.size:
        return ""
    position = tokens.path(token)[column]
    if position is None:
        return ""
    return (f"In the original, token {token} is at place {position}.",
            f"The keys {'left' if position == token else 'moved'} token {token} "
            f"{'at' if position == token else 'to'} place {position}.",
            f"The inverse puts token {token} back at place {position}.")[column]


def patch_sentence(token: int, patch: int, grid_columns: int, column: int, stayed: bool = False) -> str:
    """Where the followed token's patch is in one column, in words (row and column of the patch grid, from 1);
    stayed: the keys left it where it was."""
    row, col = divmod(patch, grid_columns)
    where = f"patch {patch} (row {row + 1}, column {col + 1} of the grid)"
    return (f"Token {token} is {where}.",
            f"The keys {'left' if stayed else 'moved'} token {token} {'in' if stayed else 'to'} {where}.",
            f"The inverse puts token {token} back in {where}.")[column]


def outputs(shown) -> None:
    """The model's output in the three columns (perm_core.explore.page_data.Outputs)."""
    cols = st.columns(3)
    kind = shown.kind
    for index, (col, label, (names, values)) in enumerate(zip(cols, TITLES, shown.summaries, strict=True)):
        if kind == "classes":
            fig = figures.bars(names, values, f"{label}:<br>top classes", "probability")
        elif kind == "next-token":
            fig = figures.bars(names, values, f"{label}:<br>next-token candidates<br>(row {shown.rows[index]})",
                               "probability")
        else:
            what = "class-token embedding" if kind == "image-embedding" else "sentence embedding"
            fig = heatmap(values[None], f"{label}:<br>{what}<br>cos to original {shown.cosines[index]:.6f}",
                          f"channel (of {len(values)})", "", height=170, y_ticks=False)
        chart(fig, width="stretch", key=f"output-{label}", where=col)
    if kind == "classes":
        st.latex(r"\text{the class token stays first and the head reads it: } y' = y")
    elif kind == "next-token":
        st.latex(r"\begin{gathered}\text{logits are per token: } Y' = P\,Y \\ "
                 r"\text{(the vocabulary axis is not permuted)}\end{gathered}")  # two lines: fits 1024 px
    elif kind == "image-embedding":
        st.caption("No classifier: the backbone's output is the class token's final embedding (after the last "
                   "norm). The scrambled model returns it with its channels permuted, so its cosine to the "
                   "original is low until the inverse permutation is applied.")
        st.latex(r"\text{the class token stays first: } e' = \mathrm{LN}'(h'_0) = e\,Q \;\Rightarrow\; "
                 r"\cos(e' Q^\top, e) = 1")
    else:
        st.latex(r"e' = \tfrac{1}{T}\textstyle\sum_t (PXQ)_t = e\,Q \;\Rightarrow\; \cos(e' Q^\top, e) = 1")


def keys(view, explorer, symmetries) -> None:
    if not view.keys:
        st.info("Switch on a symmetry in the sidebar to see its permutation.")
        return
    bits = bits_summary(view.keys, explorer.geometry, explorer.n_tokens)
    extra = ", plus a continuous family of rotations" if "rotation" in view.keys else ""
    n_keys = len(view.keys)
    integers = f"{n_keys} 64-bit integer{'s' if n_keys > 1 else ''}"
    st.markdown(f"The switched-on permutations can form **{format_bits(bits['total'])}** of distinct transforms "
                f"together{extra} (log2 of their number; log2 n! for a permutation of n items). The keys are "
                f"{integers}, one per symmetry: at most 2^{64 * n_keys} choices, so a key search faces at most "
                f"{64 * n_keys} bits, not the size of the group.")
    drawable = [n for n in view.keys if n != "rotation"]
    cols = st.columns(max(len(drawable), 1) if drawable else 1)
    for col, name in zip(cols, drawable, strict=False):
        element = symmetries.build(name, view.keys[name], explorer.geometry, explorer.n_tokens)
        index = permutation_of(element, name)
        if index is None:
            continue
        where = " (block 0)" if name in ("heads", "mlp", "head_channels") else ""
        fig = permutation_figure(index, f"{SYMMETRY_LABELS[name]}{where}, key {view.keys[name]}")
        chart(fig, width="stretch", key=f"perm-{name}", where=col)
        col.caption(f"{format_bits(bits[name])} of transforms; its key: 64 bits")
    if "rotation" in view.keys:
        element = symmetries.build("rotation", view.keys["rotation"], explorer.geometry, explorer.n_tokens)
        block = element.spaces[("v", 0)][0].blocks[0]
        chart(heatmap(block, "rotation S of head 0, block 0 (orthogonal: S S^T = I)",
                      zmax=1.0), width="content", key="perm-rotation")
        st.caption("Rotations are continuous (infinitely many); the 64-bit key picks one of at most 2^64.")
    st.latex(r"P_\pi = \big[e_{\pi(1)} \cdots e_{\pi(n)}\big]^\top,\qquad P_\pi^{-1} = P_\pi^\top,"
             r"\qquad |S_n| = n! \;\Rightarrow\; \log_2 n! \text{ bits}")


def head_grids(grid, n_layers: int, head: int) -> None:
    """Original and scrambled layer x head grids of attention maps (perm_core.explore.exploration.HeadGrid), the
    scrambled one in the original token order: a head permutation shows as heads changing places (each moved
    head labelled with the original head it holds). head: the followed original head, outlined in every drawn layer
    where the element put it (the grid's own head paths)."""
    zmax = float(max(grid.original.max(), grid.scrambled.max())) or 1.0
    moved = sum(h != g for row in grid.holds for h, g in enumerate(row))
    shown = f"layers {', '.join(map(str, grid.layers))}" if len(grid.layers) < n_layers else "every layer"
    left, right = st.columns(2)
    for i, (where, maps, title, holds, key) in enumerate((
            (left, grid.original, "Original: every head", None, "head-grid-original"),
            (right, grid.scrambled, "Scrambled (token order undone):<br>heads change places", grid.holds,
             "head-grid-scrambled"))):
        chart(head_grid_figure(maps, grid.layers, title, holds, zmax=zmax,
                               followed=head_places(grid.paths, head, i)),
              width="stretch", key=key, where=where)
        sentence = head_sentence(grid.paths, grid.layers, head, i)
        if sentence:
            where.caption(sentence)
    st.caption(f"Each tile is one head's attention map ({shown}; pooled to {grid.original.shape[-1]}x"
               f"{grid.original.shape[-1]}). On the right the token permutation is undone and nothing else, so a "
               f"tile differs from its left twin only where the head permutation moved a head: a white number is "
               f"the original head that tile holds ({moved} of {len(grid.layers) * grid.original.shape[1]} "
               f"moved). Channel, head-channel, MLP and rotation keys do not change any map.")


def head_places(paths, head: int, column: int) -> list[tuple[int, int]]:
    """(row of the head grid, place) of the followed head in one column (0 original, 1 scrambled, 2 un-scrambled):
    each drawn layer's own head path (paths[row]) says where its element put that head."""
    places = []
    for row, path in enumerate(paths):
        place = path.path(head)[column] if path.item == "head" and 0 <= head < path.size else None
        if place is not None:
            places.append((row, place))
    return places


def head_sentence(paths, layers, head: int, column: int) -> str:
    """One plain sentence of where the followed head is in a column of head grids, from the places outlined there."""
    here = head_places(paths, head, column)
    if column == 0:
        return f"Head {head} of every layer is outlined." if here else ""
    moved = [(layers[row], place) for row, place in here if place != head]
    back = {place for _, place in head_places(paths, head, 2)}
    if not moved:
        return f"The key left head {head} in its place in every layer."
    places = [f"{place} in layer {layer}" for layer, place in moved]
    where = "place " + (places[0] if len(places) == 1 else ", ".join(places[:-1]) + " and " + places[-1])
    stayed = len(here) - len(moved)
    tail = f" (it stayed in {stayed} layer{'s' if stayed != 1 else ''})" if stayed else ""
    comes_back = f"; the inverse puts it back in place {back.pop()}" if len(back) == 1 else ""
    return f"The key moved head {head} to {where}{tail}{comes_back}."


def weights(weight, names, follow=None) -> None:
    """One weight matrix of the chosen block (perm_core.explore.page_data.WeightTriple): as trained, as the
    scrambled model holds it, and given back by the inverse, on one colour scale. names: the block's matrices;
    follow: the followed channel and neuron, outlined where the matrix's rows or columns hold them."""
    st.selectbox("Weight matrix", names, key="weight", persist_state="page",  # kept while another view is shown
                 help="The matrices of the block chosen with the layer slider above.")
    original, scrambled, back = weight.tensors
    zmax, largest = figures.robust_zmax(original)
    cols = st.columns(3)
    titles = ("W: as trained", "W′: what the scrambled model holds", "W′ with the inverse applied")
    follow = {k: v for k, v in (follow or {}).items() if k != "token"}  # a weight has no token axis
    for i, (col, title, matrix) in enumerate(zip(cols, titles, (original, scrambled, back), strict=True)):
        rows_at, cols_at = placed(weight.paths, follow, i)
        chart(heatmap(matrix, title, "input axis", "output axis", zmax=zmax, wrap=30, row_paths=rows_at,
                      col_paths=cols_at), width="stretch", key=f"weight-{title}", where=col,
              caption=path_sentence(weight.paths, follow, i))
    st.caption(f"{weight.name} {tuple(original.shape)}: the scrambled model's copy differs from the trained one by "
               f"up to {weight.changed:.3g}, and the inverse gives it back to {weight.restored:.1e}"
               f"{' (exactly)' if weight.restored == 0 else ''}. Colours clip at ±{zmax:.3g} (largest |value| "
               f"{largest:.3g}).")


def mlp_neurons(view, follow=None, order: str = "stored") -> None:
    """The MLP's hidden activations in the chosen block (perm_core.explore.mlp_view.MlpView): the MLP symmetry moves
    whole neuron columns. follow, order: as three_heatmaps."""
    layer = view.layer
    three_heatmaps(f"mlp-{layer}", (view.original[None], view.scrambled[None], view.restored[None]),
                   f"MLP neurons of block {layer}", "neuron", "token", paths=view.paths, follow=follow, order=order)
    moved = [] if view.held is None else [(new, old) for new, old in enumerate(view.held.tolist()) if new != old]
    if view.held is None:
        what = "The MLP key is off here: the neurons keep their columns."
    elif not moved:
        what = "The MLP key left every neuron of this block in place."
    else:
        examples = "; ".join(f"column {new} holds neuron {old}" for new, old in moved[:3])
        what = f"The MLP key moved {len(moved)} of {len(view.held)} neurons: {examples}" + (
            ", and so on." if len(moved) > 3 else ".")
    st.caption(f"{what} Measured at the input of {view.module}; un-scrambled, the activations match the "
               f"original to {view.max_rel_error:.1e} (relative).")


def routing(view, token_labels=None) -> None:
    """A mixture-of-experts block's routing (perm_core.explore.routing.RoutingView): which experts each token chose,
    then the weight the router gave each choice, every column with the sentence its numbers give. token_labels: the
    words of each column's rows, as three_heatmaps'."""
    zmax = float(view.weights[0].max()) or 1.0
    rows = (("choice", view.chosen, choice_sentences(view), "experts chosen",
             lambda m, title, words: figures_routing.choice_map(m, title, words)),
            ("weight", view.weights, weight_sentences(view), "routing weights",
             lambda m, title, words: figures_routing.weight_map(m, title, zmax, words)))
    for kind, maps, sentences, what, draw in rows:
        cols = st.columns(3)
        for i, (col, label, tensor, sentence) in enumerate(zip(cols, TITLES, maps, sentences, strict=True)):
            words = token_labels[i] if token_labels else None
            chart(draw(tensor, f"{label}:<br>{what}, block {view.layer}", words), width="stretch",
                  key=f"routing-{view.layer}-{kind}-{label}", where=col, caption=sentence)
