"""Fusion: align B to A with exact symmetries, then average; one shipped pair, then seed pairs with intervals."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import pandas as pd
import streamlit as st

from perm_core.applications import fusion_experiment as fx
from perm_core.applications.fusion import fuse
from perm_core.applications.fusion_pairs import HELD_OUT, PairSettings
from perm_core.applications.matching import METHODS
from perm_core.models.registry import ModelLoadError
from perm_core.models.zoo import FUSION, serving
from ui.charts import figures_fusion as figs
from ui.charts import figures_fusion_experiment as fxfigs
from ui.errors import show_failure
from ui.export import chart
from ui.long_run import shared_result
from ui.runtime import PageRequest, page_run_bytes, page_runs, shared_model
from ui.sidebar import ensure_view
from ui.state import parse_bool, seed, seed_choice, seed_subset

DIGITS_MODELS = serving(FUSION)
WIDTHS = (32, 64, 128)
PAPER = "Zhang, Zheng, Chen, Li, ICML 2025"


def computed(runs, page: str, settings: tuple, what: str, compute, nbytes: int = 0):
    return shared_result(runs, PageRequest(page, settings, nbytes), what, compute)


def main(runs) -> None:
    """The page's data lives in this frame. runs: where the page's results come from (ui.runtime.page_runs)."""
    ensure_view("own")  # the sidebar says this page has its own controls; the URL keeps them
    st.title("Fusion: match, then average")
    st.markdown(
        "Two digits ViTs with the same architecture, trained from different seeds. Averaging their weights "
        "directly mixes unrelated coordinates. Matching B to A first with exact symmetries (permutations of the "
        "residual stream, heads and MLP neurons; per-head rotations of Q/K and V/O) gives a B that computes exactly "
        "the same function but lies closer to A. Each alignment is a perm_core scramble, proved below to leave B's "
        "function unchanged.")
    shipped_pair(runs)
    experiment(runs)


def shipped_pair(runs) -> None:
    st.header("One pair: digits-vit and digits-vit-b")
    cols = st.columns(3)
    seed_choice("fusion_a", DIGITS_MODELS, DIGITS_MODELS[0])
    name_a = cols[0].selectbox("Model A", DIGITS_MODELS, key="fusion_a")
    seed_choice("fusion_b", DIGITS_MODELS, DIGITS_MODELS[1])
    name_b = cols[1].selectbox("Model B", DIGITS_MODELS, key="fusion_b")
    seed_choice("fusion_points", range(11, 32, 2), 11, int)
    n_points = cols[2].slider("Path points", 11, 31, step=2, key="fusion_points")
    seed_subset("fusion_methods", METHODS, METHODS)
    # a row of its own: in a quarter of a 1024-pixel page the four chosen methods were cut to "permutati"
    methods = st.multiselect("Methods", METHODS, key="fusion_methods")
    if not methods:
        st.error("Pick at least one method.")
        return
    try:
        for name in (name_a, name_b):  # a bare call, not a tuple: Streamlit's magic would draw a tuple on the page
            shared_model(name)
    except (ModelLoadError, OSError, ValueError) as error:
        show_failure(error, "Cannot load the models")
        return
    if name_a == name_b:
        st.warning(f"A and B are the same model ({name_a}): matching finds the identity, every method returns A "
                   "itself, and a negative control built from the identity cannot break, so there is nothing to "
                   "show. Pick two different models.")
        return
    ordered = tuple(m for m in METHODS if m in methods)
    try:
        result = computed(runs, "fusion", (name_a, name_b, ordered, int(n_points)), "matching and fusing",
                          lambda p: fuse(shared_model(name_a), shared_model(name_b), ordered, n_points=int(n_points),
                                         progress=p), page_run_bytes(name_a, name_b))
    except ValueError as error:
        st.error(str(error))
        return
    pair_results(result)


def pair_results(result) -> None:
    # st.table wraps its cells: a data frame of these columns scrolled sideways at 1024 px, its last columns cut
    rows = [{"model": f"{who} = {name}", "test accuracy": f"{100 * acc:.1f}%", "test loss": f"{loss:.3f}",
             "loss barrier": "", "||A - B|| before → after": "", "aligned B = B": ""}
            for who, name, acc, loss in (("A", result.model_a, result.accuracy_a, result.loss_a),
                                         ("B", result.model_b, result.accuracy_b, result.loss_b))]
    for m in result.methods:
        rows.append({"model": f"fused, {m.method}", "test accuracy": f"{100 * m.accuracy:.1f}%",
                     "test loss": f"{m.loss:.3f}", "loss barrier": f"{m.barrier:.3f}",
                     "||A - B|| before → after": f"{m.distance_before:.2f} → {m.distance_after:.2f}"
                     + (" (residual matched)" if m.residual_matched else ""),
                     "aligned B = B": "— (B itself: nothing aligned)" if m.proof is None else
                     ("proved" if m.proof.passed and m.proof.control_broken else "FAILED")
                     + f" (max rel err {m.proof.max_rel_error:.1e})"})
    st.table(pd.DataFrame(rows).set_index("model"))
    left, right = st.columns(2)
    chart(figs.barrier_curves(result, "loss"), key="fusion_loss", where=left)
    chart(figs.barrier_curves(result, "accuracy"), key="fusion_accuracy", where=right)
    chart(figs.fused_bars(result), key="fusion_fused")
    chart(figs.distance_bars(result), key="fusion_distance")
    st.subheader("Proof: each aligned B is the same function as B")
    for m in result.methods:
        p = m.proof
        if p is None:
            st.info(f"{m.method}: averages A and B as they are, with no alignment, so there is no aligned B to "
                    "prove and no negative control.")
            continue
        (st.success if p.passed and p.control_broken else st.error)(
            f"{m.method}: every traced tensor of aligned B (hidden states, attention maps, logits; "
            f"{p.n_images} held-out digits) matches B after un-scrambling, worst relative error "
            f"{p.max_rel_error:.1e} (tolerance {p.tolerance:g}). Negative control, {p.control}: "
            f"{p.control_rel_error:.2f} ({'broken, as it must be' if p.control_broken else 'NOT broken'}).")
    by_method = {m.method: m for m in result.methods}
    if {"average", "permutation+rotation"} <= by_method.keys():
        avg, best = by_method["average"], by_method["permutation+rotation"]
        st.markdown(
            f"On this one pair, permutation + rotation moves the fused accuracy from {100 * avg.accuracy:.1f}% "
            f"(plain averaging) to {100 * best.accuracy:.1f}%, against {100 * result.accuracy_a:.1f}% and "
            f"{100 * result.accuracy_b:.1f}% for A and B, and the barrier from {avg.barrier:.2f} to "
            f"{best.barrier:.2f}. One pair of one seed each cannot say whether rotation adds anything: the "
            "experiment below repeats the merge over seed pairs.")


def experiment(runs) -> None:
    st.header("Does rotation add to permutation? Seed pairs with 95 % intervals")
    st.markdown(
        f"**Paper** ({PAPER}): attention has a rotation symmetry beyond permutations; matching heads by "
        "closed-form per-head rotations (orthogonal Procrustes: the rotation that best maps one set of vectors "
        "onto another, read off an SVD) on top of permutation matching brings "
        "independently trained Transformers closer and fuses them better. Their ViT pair on CIFAR-10 reached "
        "61.25 % merged with activation-based matching against 10.19 % for plain averaging, and rotation matching "
        "cut the distance to the anchor model from 651.57 to 613.63 (5.8 %) where Git Re-Basin (Ainsworth et al., "
        "ICLR 2023: permutation matching of the weights alone) cut it to 625.73.")
    defaults = PairSettings()
    cols = st.columns(3)
    seed_choice("fx_pairs", range(5, 11), 5, int)
    pairs = cols[0].slider("Seed pairs", 5, 10, key="fx_pairs")
    seed_choice("fx_width", WIDTHS, defaults.width, int)
    width = cols[1].selectbox("Width (residual channels)", WIDTHS, key="fx_width",
                              help="MLP 2 x width; 2 layers, 4 heads, 4x4-pixel patches")
    seed_choice("fx_epochs", range(1, 31), defaults.epochs, int)
    epochs = cols[2].slider("Training epochs", 1, 30, key="fx_epochs")
    settings = fx.ExperimentSettings(int(pairs), PairSettings(width=int(width), epochs=int(epochs)))
    st.caption(
        f"Each pair: two ViTs from seeds 2i and 2i + 1, trained on the digits training split less {HELD_OUT} "
        "images held out for activation matching; accuracy on the 360 test digits. Weight matching: every "
        "permutation (the residual stream's too) from the weights, alternating as Git Re-Basin does; activation "
        "matching: by the correlation of the units' activations on the held-out images (a linear sum assignment: "
        "the one-to-one pairing of units with the largest total correlation), rotations by Procrustes on the "
        "heads' activations. Every aligned B is proved to be B's function in float64.")
    key = (settings.pairs, width, epochs)
    seed("fx_run", False, parse_bool)  # a link with fx_run=1 opens with the experiment run
    if not st.session_state["fx_run"] and runs.finished(PageRequest("fusion/experiment", key)) is None:
        st.button(f"Run the experiment: train {2 * settings.pairs} ViTs", type="primary", key="fx_start",
                  on_click=lambda: st.session_state.update(fx_run=True))
        st.info("Nothing is trained until you press the button. The result is kept for everyone on this server: "
                "whoever opens these settings next sees it at once.")
        return
    result = computed(runs, "fusion/experiment", key, "the experiment",
                      lambda p: fx.run_experiment(settings, progress=p))
    st.markdown(f"**{result.verdict}**")
    experiment_table(result)
    chart(fxfigs.merged_accuracy(result), key="fx_accuracy")
    chart(fxfigs.barriers(result), key="fx_barrier")
    chart(fxfigs.distances(result), key="fx_distance")
    chart(fxfigs.mean_paths(result), key="fx_paths")
    st.caption(f"Reproduce: `python -m perm_core fuse --experiment --pairs {settings.pairs} --width {width} "
               f"--epochs {epochs} --json` ({result.seconds:.0f} s here).")


def experiment_table(result) -> None:
    def interval(i, scale=100.0, digits=1):
        return f"{scale * i.mean:.{digits}f} ({scale * i.low:.{digits}f} to {scale * i.high:.{digits}f})"

    rows = []
    for s in result.summaries:
        proofs = [r.proved for p in result.pairs for r in p.methods if r.method == s.method]
        rows.append({"method": s.method, "merged accuracy, % (95 % interval)": interval(s.accuracy),
                     "loss barrier": interval(s.barrier, 1.0, 3),
                     "||A - B|| before → after": f"{s.distance_before.mean:.2f} → {s.distance_after.mean:.2f}",
                     "distance cut, %": interval(s.distance_cut, 1.0),
                     "aligned B = B": "— (nothing aligned)" if all(p is None for p in proofs) else
                     f"proved {sum(p is True for p in proofs)}/{len(proofs)}"})
    st.table(pd.DataFrame(rows).set_index("method"))  # wraps its cells (see pair_results)
    e = result.endpoints
    st.caption(f"A and B themselves: {100 * e.mean:.1f}% ({100 * e.low:.1f} to {100 * e.high:.1f}) over "
               f"{e.n} models.")


with page_runs() as runs:  # each result's share of the run budget is held until the page is drawn
    main(runs)
