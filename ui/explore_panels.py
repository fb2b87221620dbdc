"""Panels of the Explore page: each draws three columns or one key picture from computed tensors."""

from __future__ import annotations

import streamlit as st

from perm_core import figures
from perm_core.explore import bits_summary, cosine, format_bits, output_summary, permutation_of
from ui.sidebar import SYMMETRY_LABELS

TITLES = ("Original", "Scrambled", "Un-scrambled")


def three_heatmaps(name: str, tensors, title: str, x_title: str, y_title: str, attention: bool = False) -> None:
    """Same colour scale in all three columns, so equal pictures mean equal numbers."""
    arrays = [figures.to_numpy(t)[0] for t in tensors]
    zmax = float(abs(arrays[0]).max()) or 1.0
    cols = st.columns(3)
    for col, label, array in zip(cols, TITLES, arrays, strict=True):
        fig = figures.heatmap(array, f"{label}: {title}", x_title, y_title,
                              colorscale="Viridis" if attention else "RdBu", symmetric=not attention,
                              zmax=zmax)
        col.plotly_chart(fig, width="stretch", key=f"{name}-{label}")


def outputs(view, explorer, result) -> None:
    tokens = result.scramble.tokens
    n = explorer.n_tokens
    last = n - 1
    moved_last = tokens.index.tolist().index(last) if tokens is not None else last
    mask = view.inputs.get("attention_mask")
    scrambled_mask = mask[:, tokens.index] if (mask is not None and tokens is not None) else mask
    columns = (
        ({k: r.tensor for k, r in explorer.original.items()}, last, mask),
        ({k: r.tensor for k, r in result.scrambled.items()}, moved_last, scrambled_mask),
        (result.restored, last, mask),
    )
    summaries = [output_summary(t, view.loaded.labels, view.loaded.tokenizer, m, row) for t, row, m in columns]
    cols = st.columns(3)
    kind = summaries[0][0]
    reference = summaries[0][2]
    for index, (col, label, (_, names, values)) in enumerate(zip(cols, TITLES, summaries, strict=True)):
        if kind == "classes":
            fig = figures.bars(names, values, f"{label}: top classes", "probability")
        elif kind == "next-token":
            where = f"row {moved_last}" if index == 1 else f"row {last}"
            fig = figures.bars(names, values, f"{label}: next-token candidates ({where})", "probability")
        else:
            similarity = cosine(values, reference)
            fig = figures.heatmap(values[None], f"{label}: sentence embedding, cos to original {similarity:.6f}",
                                  "channel", "")
            fig.update_layout(height=170)
        col.plotly_chart(fig, width="stretch", key=f"output-{label}")
    if kind == "classes":
        st.latex(r"\text{the class token stays first and the head reads it: } y' = y")
    elif kind == "next-token":
        st.latex(r"\text{logits are per token: } Y' = P\,Y \;(\text{the vocabulary axis is not permuted})")
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
        fig = figures.permutation_figure(index, f"{SYMMETRY_LABELS[name]}{where}, key {view.keys[name]}")
        col.plotly_chart(fig, width="stretch", key=f"perm-{name}")
        col.caption(f"{format_bits(bits[name])} of transforms; its key: 64 bits")
    if "rotation" in view.keys:
        element = symmetries.build("rotation", view.keys["rotation"], explorer.geometry, explorer.n_tokens)
        block = element.spaces[("v", 0)][0].blocks[0]
        st.plotly_chart(figures.heatmap(block, "rotation S of head 0, block 0 (orthogonal: S S^T = I)",
                                        zmax=1.0), width="content", key="perm-rotation")
        st.caption("Rotations are continuous (infinitely many); the 64-bit key picks one of at most 2^64.")
    st.latex(r"P_\pi = \big[e_{\pi(1)} \cdots e_{\pi(n)}\big]^\top,\qquad P_\pi^{-1} = P_\pi^\top,"
             r"\qquad |S_n| = n! \;\Rightarrow\; \log_2 n! \text{ bits}")
