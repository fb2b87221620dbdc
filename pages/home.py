"""Home: what inter- and intra-token permutation are, why a Transformer does not care, and where to go.

The first page a just-started server shows: it imports neither torch nor the library (nor anything that does), so it
does not wait for them; its two pictures are the library's, kept as files (ui/home_pictures.py)."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

from pathlib import Path

import numpy
import streamlit as st

from ui.home_pictures import FILES, FOLDER, digit_class
from ui.state import publish
from ui.view import ensure_view


def main() -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals."""
    ensure_view("none")
    st.title("Transformer Symmetry Explorer")
    st.markdown(
        "A Transformer does not care **in which order** it gets its tokens, nor **in which order** the channels of "
        "each token are stored, as long as its weights are permuted to match. Scramble the input and the weights "
        "with a secret key, run the model, apply the inverse, and every hidden state, attention map, output and "
        "gradient comes back equal to float64 round-off: relative errors around 1e-15. Not bit for bit: the "
        "scrambled model adds the same terms in another order, so the last bits may differ. "
        f"In float32 (where Explore starts: it is faster) the same rounding shows as 1e-7 to 1e-5, because a float32 "
        f"keeps {numpy.finfo(numpy.float32).eps:.1e} of relative precision where a float64 keeps "
        f"{numpy.finfo(numpy.float64).eps:.1e}; switch the sidebar's dtype to float64 to see 1e-15.")

    left, right = st.columns(2)
    with left:
        st.subheader("Inter-token permutation")
        st.markdown("Shuffle the **tokens** (image patches, words) together with their positions. Every layer's "
                    "output is shuffled the same way: the model is *equivariant*.")
        st.latex(r"f(P X) = P\, f(X)")
        pictures = st.columns(2)  # the first held-out scikit-learn digit, and its patches shuffled with key 7
        captions = (f"a handwritten {digit_class()} (8x8 pixels) as 16 patches", "patches shuffled, key 7")
        for column, name, caption in zip(pictures, FILES, captions, strict=True):
            column.image(str(FOLDER / name), caption=caption)
    with right:
        st.subheader("Intra-token permutation")
        st.markdown("Shuffle the **channels** inside every token, and permute every weight matrix, norm and "
                    "embedding to match. The scrambled model computes the scrambled function, and un-permuting "
                    "its output gives the original one.")
        # two lines: fits 1024 px
        st.latex(r"\begin{gathered} W' = Q^\top W Q \\ f_{\theta'}(X Q) = f_\theta(X)\, Q \end{gathered}")
        st.markdown("The same holds for **attention heads**, **channels inside a head**, **MLP neurons**, and "
                    "(Zhang et al., ICML 2025) for **per-head rotations** of queries/keys and values/outputs.")

    st.subheader("Why")
    st.markdown(
        "Attention compares tokens only with each other ($QK^\\top$ and a row-wise softmax), norms and MLPs act on "
        "each token alone, and the positional information travels *with* its token. A permutation matrix $P$ is "
        "orthogonal ($PP^\\top=I$), so it cancels inside every product of weights. Xu et al. (CVPR 2024) turn this "
        "into privacy (split learning on scrambled features) and model authorization (a model that only works "
        "with the right key).")

    st.subheader("Where to go")
    links = (("pages/walk.py", "Guided walk: five steps to click through in a lecture", ":material/school:"),
             ("pages/explore.py", "Explore: scramble a model and watch every layer un-scramble", ":material/shuffle:"),
             ("pages/check.py", "Check: a full verification report for any zoo model", ":material/fact_check:"),
             ("pages/backward.py", "Backward: gradients un-permute too", ":material/undo:"),
             ("pages/authorization.py", "Authorization: a model keyed to its owner", ":material/key:"),
             ("pages/split_learning.py", "Split learning: what an attacker rebuilds", ":material/call_split:"),
             ("pages/rotation.py", "Rotation: the symmetry beyond permutations", ":material/rotate_right:"),
             ("pages/fusion.py", "Fusion: align, then average two models", ":material/merge:"),
             ("pages/matrix.py", "Symmetry matrix: every architecture against every symmetry", ":material/grid_on:"))
    root = Path(__file__).resolve().parent.parent
    for path, label, icon in links:
        if (root / path).exists():
            st.page_link(path, label=label, icon=icon)
    st.caption("Explore and Check take their model, input and keys from the sidebar; the other pages have their own "
               "controls on the page. The URL keeps your view, so you can share it. The sidebar's Projector switch "
               "enlarges every page for a lecture hall.")
    publish()


main()
