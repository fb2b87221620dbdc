"""Privacy-enhancing split learning: train through the split, then attack it with model inversion."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import streamlit as st

from perm_core.applications import inversion, split_learning
from perm_core.engine import keys
from perm_core.models.registry import DTYPES
from ui import state
from ui.charts import figures_split as fs
from ui.export import chart
from ui.long_run import shared_result
from ui.runtime import PageRequest, page_runs
from ui.sidebar import ensure_view
from ui.state import key_or_stop


def main(shared_runs) -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals. shared_runs: where the
    page's results come from (ui.runtime.page_runs)."""
    ensure_view("own")  # the sidebar says this page has its own controls; the URL keeps them
    st.title("Split learning: scrambled features, and what an attacker rebuilds from them")
    st.markdown(
        "**The protocol** (after Xu et al., CVPR 2024). The client keeps the ViT's embedding layer (patch "
        "embedding, [CLS], position embeddings) and a secret key; it sends the server token features "
        "[17 tokens × 64 channels] per digit. The server runs the Transformer blocks and the head. Protection: the "
        "client permutes the 64 **channels** with a fixed permutation from its key (the server's weights live in that "
        "permuted basis), and/or shuffles the 16 patch **tokens** in a fresh random order for every sample ([CLS] "
        "stays first; the blocks are token-equivariant, so the server needs no key for this).")
    channel_bits, token_bits = keys.permutation_bits(64), keys.permutation_bits(16)
    st.markdown(
        f"**The key** is a 64-bit integer (0 to 2⁶⁴ − 1): an attacker who tries keys needs at most 2⁶⁴ guesses. "
        f"Separately, the permutation group of the 64 channels has 64! ≈ 2^{channel_bits:.1f} elements; keys reach "
        f"at most 2⁶⁴ of them, so the key, not the group, bounds a key search. Each sample's token order is one "
        f"of 16! ≈ 2^{token_bits:.1f}.")

    def cached(kind, settings, compute):
        return shared_result(shared_runs, PageRequest("split_learning", (kind, settings)), kind.lower(), compute)

    cols = st.columns(4)
    state.seed_choice("sl_seed", range(10_001), split_learning.DEFAULT_SEED, int)
    seed = cols[0].number_input("Seed", 0, 10_000, key="sl_seed")
    state.seed("sl_key", state.lecture_key("tokens"))
    key_text = cols[1].text_input("Client's secret key", key="sl_key")
    state.seed_choice("sl_epochs", range(1, 61), split_learning.DEFAULT_EPOCHS, int)
    train_epochs = cols[2].slider("Training epochs", 1, 60, key="sl_epochs",
                                  help="The held-out accuracy this run reaches is measured below.")
    state.seed_choice("sl_dtype", ("float32", "float64"), "float32")
    dtype_name = cols[3].selectbox("Precision", ("float32", "float64"), key="sl_dtype",
                                   help="float64: less round-off; how far apart the two runs end is measured below.")
    key = key_or_stop(key_text)

    st.header("1. Training through the split: plain vs scrambled")
    dtype = DTYPES[dtype_name]
    training = cached("Training plain and scrambled", (seed, key, train_epochs, dtype_name),
                      lambda p: split_learning.train_split(seed, key, train_epochs, progress=p, dtype=dtype))
    m = st.columns(4)
    m[0].metric("Plain: held-out accuracy", f"{training.final_plain_accuracy:.1%}")
    m[1].metric("Scrambled: held-out accuracy", f"{training.final_scrambled_accuracy:.1%}",
                f"{(training.final_scrambled_accuracy - training.final_plain_accuracy) * 100:+.1f} points")
    m[2].metric("Max weight difference", f"{training.max_weight_difference:.1e}")
    m[3].metric("Both runs took", f"{training.seconds:.1f} s")
    st.caption(f"Max weight difference: the largest |un-scrambled server weight − plain server weight| at the end of "
               f"this {dtype_name} run, {training.max_weight_difference:.1e}.")
    gap = split_learning.accuracy_gap(training)
    # Said in full size above the curves, where a student sees them part (in small grey print under them it was
    # missed, beside the Backward page's "locked at about 1e-15")
    st.markdown(
        f"**Why the two curves can part.** Same seed, same batches; the scrambled server starts from the permuted "
        f"plain initialization, and in exact arithmetic every scrambled step is the permuted plain step (forward, "
        f"backward and AdamW are all equivariant: the Backward page shows one step exact to round-off). In floating "
        f"point the gathers change the summation order, and {train_epochs} epochs of training amplify that "
        f"round-off: in this {dtype_name} run the held-out accuracies differ by at most **{gap:.1%}**, and the server "
        f"weights end **{training.max_weight_difference:.1e}** apart. Not a broken symmetry: two runs of the same "
        "training, rounded differently.")
    chart(fs.training_curves(training, f"plain and scrambled training: at most {gap:.1%} apart in accuracy, "
                                       "round-off amplified by training"), width="stretch")

    st.header("2. The attacker: black-box model inversion")
    st.markdown(
        "**Threat model.** The server is honest but curious. It knows the architecture, the client's embedding "
        "weights (worst case: a public pretrained embedding; here digits-vit's), auxiliary images from the same "
        "distribution (the 1,437 training digits) and which protection is used; it does **not** know the channel key "
        "or the token orders. It sees the protected features of the victims (the held-out digits), never their "
        "images. **Decoder attacker** (the paper's attack): train a decoder features → image on auxiliary features "
        "as it can compute them without the secrets (plain channels; tokens shuffled by its own random orders when "
        "the client shuffles). **Adaptive attacker**: first undo what it can without the key — channels by matching "
        "each received channel's value distribution to an auxiliary channel, token order by the known embedding "
        "(each patch token is W·patch + b + pos_i, with only 4 pixels per patch) — then use the plain decoder.")
    cols = st.columns(3)
    state.seed_choice("sl_attack_epochs", range(1, 101), inversion.DEFAULT_EPOCHS, int)
    attack_epochs = cols[0].slider("Decoder epochs", 1, 100, key="sl_attack_epochs")
    state.seed_choice("sl_victims", range(10, 361), 360, int)
    n_victims = cols[1].slider("Victims (held-out digits)", 10, 360, key="sl_victims")
    state.seed_choice("sl_show", range(1, 17), 8, int)
    n_show = cols[2].slider("Digits shown", 1, 16, key="sl_show")
    attack = cached("Training the inversion decoders", (seed, key, attack_epochs, n_victims),
                    lambda p: inversion.run_attack(seed, key, attack_epochs, n_victims, n_show=16, progress=p))

    labels = [f"{inversion.PROTECTION_LABELS[r.protection]} — {r.attacker}" for r in attack.rows]
    table = [{"protection": inversion.PROTECTION_LABELS[r.protection], "attacker": r.attacker,
              "SSIM": f"{r.ssim:.3f}", "PSNR (dB)": f"{r.psnr:.2f}",
              "channels recovered": "" if r.channels_recovered is None else f"{r.channels_recovered}/64",
              "token orders recovered": "" if r.token_orders_recovered is None else f"{r.token_orders_recovered:.0%}"}
             for r in attack.rows]
    table += [{"protection": f"baseline: {b['name']}", "attacker": "—", "SSIM": f"{b['ssim']:.3f}",
               "PSNR (dB)": f"{b['psnr']:.2f}", "channels recovered": "", "token orders recovered": ""}
              for b in attack.baselines]
    st.table(table, hide_index=True)  # wraps its cells: every column stays in view in a 1024-pixel window
    chart(fs.ssim_bars(labels, [r.ssim for r in attack.rows], attack.baselines), width="stretch")

    mean_baseline = max(b["ssim"] for b in attack.baselines)
    BASELINE_MARGIN = 0.05  # SSIM; the sentence below states it, so 0.608 against a 0.577 baseline is not "below"
    helped = [inversion.PROTECTION_LABELS[r.protection] for r in attack.rows
              if r.attacker == "decoder" and r.protection != "none" and r.ssim <= mean_baseline + BASELINE_MARGIN]
    broken = [inversion.PROTECTION_LABELS[r.protection] for r in attack.rows
              if r.attacker == "adaptive" and r.ssim >= attack.rows[0].ssim - 0.02]
    st.subheader("What the measurements say")
    st.markdown(
        f"- Without protection the decoder's reconstructions reach SSIM {attack.rows[0].ssim:.3f} "
        f"(PSNR {attack.rows[0].psnr:.1f} dB); the best baseline image reaches SSIM {mean_baseline:.3f}.\n"
        f"- Against the paper's decoder attacker, these protections push the reconstructions' SSIM to within "
        f"{BASELINE_MARGIN} of the best baseline ({mean_baseline:.3f}) or below: {', '.join(helped) or 'none'}.\n"
        f"- The adaptive attacker, who undoes the scrambling from statistics and the known embedding, reconstructs "
        f"as well as without protection against: {', '.join(broken) or 'none'}. The permutation hides the "
        f"basis, not the information: with a known, nearly linear embedding the key is learnable from the data.")

    rows = [("original", attack.originals[:n_show])]
    rows += [(label, attack.reconstructions[f"{r.protection}/{r.attacker}"][:n_show])
             for label, r in zip(labels, attack.rows, strict=True)]
    chart(fs.image_grid(rows), width="stretch")
    st.caption(f"Reproduce: `python -m perm_core split-attack --seed {seed} --key {key} --epochs {attack_epochs} "
               f"--victims {n_victims} --train --train-epochs {train_epochs} --json` (training in float32). "
               f"Attack took {attack.seconds:.1f} s.")


with page_runs() as shared_runs:  # each result's share of the run budget is held until the page is drawn
    main(shared_runs)
