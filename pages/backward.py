"""Backward: gradients un-scramble exactly, and SGD in the scrambled world stays locked to the original."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import streamlit as st

from perm_core.applications import backward as bw
from perm_core.engine import symmetries
from perm_core.families import geometry_of
from perm_core.models.defaults import default_inputs
from perm_core.models.digits import digits_split
from perm_core.models.inputs import InputError, prepare_text
from perm_core.models.zoo import BACKWARD, DIGITS_VIT, serving
from perm_core.run import trace_names
from perm_core.verify.subject import Subject
from perm_core.verify.tolerances import BROKEN_AT
from ui.charts import figures_backward as fb
from ui.errors import show_failure
from ui.export import chart
from ui.long_run import long_run
from ui.runtime import PageRequest, page_run_bytes, page_runs, shared_model
from ui.sidebar import ensure_view
from ui.state import key_or_stop, lecture_key, seed, seed_choice, seed_subset

MODELS = (*serving(BACKWARD), "random:vit", "random:bert", "random:gpt2", "random:llama")
DEFAULT_TEXT = "A man is playing a guitar."
DEFAULT_REFERENCE = "Someone plays the guitar."
SGD_BATCH = 32  # digits training images per SGD step


def main(shared_runs) -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals. shared_runs: where the
    page's results come from (ui.runtime.page_runs)."""
    ensure_view("own")  # the sidebar says this page has its own controls; the URL keeps them
    st.title("Backward: gradients and training commute with the symmetries")
    st.caption("If a scramble g is a symmetry, the loss of the scrambled model on the scrambled input equals the "
               "original loss, so its gradient is the scrambled gradient, and an SGD step taken in the scrambled "
               "world lands exactly on the scrambled image of the original step.")

    top = st.columns([2, 1, 3, 1])
    seed_choice("bw_model", MODELS, MODELS[0])
    model_name = top[0].selectbox("Model", MODELS, key="bw_model")
    seed_choice("bw_dtype", ("float64", "float32"), "float64")
    dtype_name = top[1].radio("Precision", ("float64", "float32"), key="bw_dtype")
    seed_subset("bw_syms", symmetries.SYMMETRIES, ["tokens", "channels"])
    chosen = top[2].multiselect("Symmetries", symmetries.SYMMETRIES, key="bw_syms")
    seed("bw_key", lecture_key("channels"))
    key_text = top[3].text_input("Key", key="bw_key")
    key = key_or_stop(key_text)
    if not chosen:
        st.error("Pick at least one symmetry.")
        st.stop()
    keys_by_symmetry = {name: key for name in chosen}

    try:
        loaded = shared_model(model_name, dtype_name)
    except Exception as error:  # noqa: BLE001 - a one-line message, never a traceback
        show_failure(error, f"Could not load {model_name}")
        st.stop()

    # --- the loss and the input ---
    loss_kinds = bw.losses_for(loaded.model)
    row = st.columns([2, 3, 3])
    seed_choice("bw_loss", loss_kinds, loss_kinds[0])
    loss_kind = row[0].selectbox("Loss", loss_kinds, format_func=lambda k: bw.LOSSES[k], key="bw_loss")
    reference, target_class = None, 0
    if geometry_of(loaded.model).input_kind == "image":
        labels = loaded.labels or [str(i) for i in range(loaded.model.config.num_labels)]
        if model_name == DIGITS_VIT.name:  # the digits test images, and training batches for SGD
            test_x = digits_split()[2]
            seed_choice("bw_image", range(len(test_x)), 0, int)
            index = row[1].slider("Test image", 0, len(test_x) - 1, key="bw_image")
            inputs = {"pixel_values": test_x[index : index + 1]}
        else:
            inputs = default_inputs(loaded)
            row[1].caption("A random image (seed 0).")
        seed_choice("bw_class", range(len(labels)), 0, int)
        target_class = row[2].selectbox("Target class", range(len(labels)), format_func=lambda i: labels[i],
                                        key="bw_class")
    elif loaded.tokenizer is None:  # random text models have no tokenizer: random token ids
        inputs = default_inputs(loaded)
        row[1].caption(f"Random token ids (seed 0), {inputs['input_ids'].shape[1]} tokens.")
        if loss_kind == "similarity":
            reference = default_inputs(loaded, seed=1)
            row[2].caption("Reference: another random sequence (seed 1).")
    else:
        seed("bw_text", DEFAULT_TEXT)
        text = row[1].text_input("Input text", key="bw_text")
        try:
            inputs, notice = prepare_text(text, loaded, max_tokens=64)
            if notice:
                st.info(notice)
            if loss_kind == "similarity":
                seed("bw_ref", DEFAULT_REFERENCE)
                reference_text = row[2].text_input("Reference sentence", key="bw_ref")
                reference, _ = prepare_text(reference_text, loaded, max_tokens=64)
        except InputError as error:
            st.error(str(error))
            st.stop()
    weights = bw.weight_matrices(loaded.model)
    seed_choice("bw_weight", weights, weights[0])
    weight = st.selectbox("Weight matrix to show", weights, key="bw_weight")

    def gradient_comparison(model_name, dtype_name, settings, inputs, reference):
        """The gradient of the input and of every parameter, in both worlds (backprop computes them all anyway)."""
        def compute():
            loaded = shared_model(model_name, dtype_name)
            subject = Subject(loaded.model, inputs)
            loss = bw.make_loss(settings["loss"], subject, settings["class"], reference)
            shown = [trace_names.GRAD_INPUT, *map(trace_names.param_grad, bw.weight_matrices(loaded.model))]
            return bw.compare_gradients(loaded.model, inputs, loss, dict(settings["keys"]), keep=shown)

        return shared_runs.result(PageRequest("backward/gradients", (model_name, dtype_name, repr(settings)),
                                       page_run_bytes(model_name, dtype_name=dtype_name)), compute)

    settings = {"loss": loss_kind, "class": int(target_class), "keys": tuple(sorted(keys_by_symmetry.items())),
                "input": repr({k: v.tolist() for k, v in inputs.items()}),
                "reference": repr({k: v.tolist() for k, v in (reference or {}).items()})}
    with st.spinner("Computing gradients in both worlds ..."):
        comparison = gradient_comparison(model_name, dtype_name, settings, inputs, reference)

    cols = st.columns(4)
    cols[0].metric("Loss, original world", f"{comparison.loss_original:.6g}")
    cols[1].metric("Loss, scrambled world", f"{comparison.loss_scrambled:.6g}")
    cols[2].metric("Max relative gradient error", f"{comparison.max_rel_error:.2e}")
    cols[3].metric("Tolerance", f"{comparison.tolerance:.0e}")
    if comparison.passed:
        st.success(f"All {len(comparison.errors)} gradients (the input's and every parameter's) un-scramble to the "
                   f"original within {comparison.tolerance:.0e} (worst {comparison.max_rel_error:.2e}, "
                   f"{comparison.worst_name}).")
    else:
        st.error(f"Gradients do not un-scramble: worst relative error {comparison.max_rel_error:.2e} "
                 f"({comparison.worst_name}, of {len(comparison.errors)} gradients compared).")

    input_label = "d loss / d pixels" if "pixel_values" in inputs else "d loss / d input embeddings (tokens x channels)"
    weight_grad = trace_names.param_grad(weight)
    for name, label in ((trace_names.GRAD_INPUT, input_label), (weight_grad, f"d loss / d {weight}")):
        st.subheader(label)
        panels = fb.gradient_triptych(comparison.original[name], comparison.scrambled[name],
                                      comparison.unscrambled[name], label.split(" / ")[1][2:])
        # Two by two: four across left an 8x8 map tall and narrow and cut its colour bar's labels at 1024 px
        for pair in (panels[:2], panels[2:]):
            for column, figure in zip(st.columns(2), pair, strict=True):
                chart(figure, width="stretch", where=column)
    chart(fb.gradient_errors(comparison.errors, comparison.tolerance), width="stretch")

    # --- SGD in lock-step ---
    st.header("Training in both worlds")
    st.caption("Plain SGD on the same loss, each world on its own input. The scrambled world starts from g(θ₀), the "
               "scrambled original weights (with a negative control: from the control's wrongly scrambled weights). "
               "After every step its accumulated update θ'ₜ − θ'₀ is compared with g(θₜ − θ₀), the scrambled update "
               "of the original world, per tensor relative to that update's own size. For a symmetry the two "
               "trainings agree to round-off; a control's gradients differ, so its training diverges. With learning "
               "rate 0 nothing is trained and there is nothing to compare.")
    row = st.columns(3)
    seed_choice("bw_steps", range(1, 31), 5, int)
    steps = row[0].slider("SGD steps", 1, 30, key="bw_steps")
    RATES = (0.0, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)
    seed_choice("bw_lr", RATES, 0.001, float)
    lr = row[1].select_slider("Learning rate", RATES, key="bw_lr")
    shape = Subject(loaded.model, inputs)
    control_names = [c.name for name in chosen for c in symmetries.controls(name, key, shape.geometry, shape.n_tokens)]
    seed_choice("bw_control", ["none", *control_names], "none")
    control = row[2].selectbox("Negative control (must break)", ["none", *control_names], key="bw_control")
    if "pixel_values" in inputs and model_name == DIGITS_VIT.name:
        train_x, train_y, _, _ = digits_split()
        sgd_inputs, sgd_targets = {"pixel_values": train_x[:SGD_BATCH]}, train_y[:SGD_BATCH]
        st.caption(f"Each step: a batch of {SGD_BATCH} digits training images with their labels.")
    else:
        sgd_inputs, sgd_targets = inputs, None

    def lockstep(model_name, dtype_name, settings, inputs, targets, reference, steps, lr, control, progress):
        def compute():
            loaded = shared_model(model_name, dtype_name)
            subject = Subject(loaded.model, inputs)
            loss = bw.Loss("class", targets=targets) if targets is not None else \
                bw.make_loss(settings["loss"], subject, settings["class"], reference)
            return bw.sgd_lockstep(loaded.model, inputs, loss, dict(settings["keys"]), steps, lr,
                                   None if control == "none" else control, progress=progress)

        return shared_runs.result(PageRequest("backward/lockstep", (model_name, dtype_name, repr(settings), steps, lr,
                                                             control, targets is not None),
                                       page_run_bytes(model_name, dtype_name=dtype_name)), compute)

    share = 0.5 if control != "none" else 1.0  # of the bar, for the correct scramble's run
    with long_run("backward", (model_name, dtype_name, repr(settings), steps, lr, control), "SGD in both worlds") \
            as progress:
        runs = {"correct scramble": lockstep(model_name, dtype_name, settings, sgd_inputs, sgd_targets, reference,
                                             steps, lr, "none", lambda f, m: progress(f * share, m))}
        if control != "none":
            runs[f"control: {control}"] = lockstep(model_name, dtype_name, settings, sgd_inputs, sgd_targets, reference,
                                                   steps, lr, control,
                                                   lambda f, m: progress(0.5 + f / 2, f"control: {m}"))
    result = runs["correct scramble"]
    cols = st.columns(5)
    cols[0].metric("Update error", f"{result.max_rel_error:.2e}", help="The worst over steps 1 on: the verdict.")
    cols[1].metric("Weight error", f"{result.max_param_error:.2e}", help="The worst over every step, for reference.")
    cols[2].metric("Loss at step 0", f"{result.steps[0].loss_original:.4g}")
    cols[3].metric(f"Loss after {steps} steps", f"{result.steps[-1].loss_original:.4g}")
    cols[4].metric("Tolerance", f"{result.tolerance:.0e}")
    if not result.trained:
        st.info("Learning rate 0: nothing was trained, so there is no update to compare (neither passed nor broken).")
    elif result.passed:
        st.success(f"After each of {steps} steps the scrambled world's update equals the scrambled original update "
                   f"within {result.tolerance:.0e} (worst relative error {result.max_rel_error:.2e}).")
    else:
        st.error(f"The trainings drifted apart: worst relative update error {result.max_rel_error:.2e} "
                 f"(tolerance {result.tolerance:.0e}).")
    if control != "none":
        run = runs[f"control: {control}"]
        if not run.trained:
            st.info(f"Negative control {control}: nothing was trained (learning rate 0), so it is not broken.")
        elif run.broken:
            st.warning(f"Negative control {control}: worst relative update error {run.max_rel_error:.2e}, above "
                       f"{BROKEN_AT:.0e} (broken, as it must be).")
        else:
            st.error(f"Negative control {control}: worst relative update error {run.max_rel_error:.2e}, not above "
                     f"{BROKEN_AT:.0e} (NOT broken).")
    st.caption(f"Update error: the worst tensor of max |(θ'ₜ − θ'₀) − g(θₜ − θ₀)| / max |g(θₜ − θ₀)|, from step 1 on; "
               f"the verdicts rest on it (a symmetry passes within the tolerance, a control is broken above "
               f"{BROKEN_AT:.0e}). Weight error: g(θₜ) against θ'ₜ on each weight's own scale, shown for reference: "
               "an update is small next to the weights it moves, so the weight error understates a divergence.")
    left, right = st.columns(2)
    chart(fb.sgd_errors(runs, result.tolerance, BROKEN_AT), width="stretch", where=left)
    chart(fb.sgd_losses(result), width="stretch", where=right)
    st.dataframe([{"step": s.step, "loss (original)": s.loss_original, "loss (scrambled)": s.loss_scrambled,
                   "update rel error": s.update_rel_error if s.step else None,
                   "weight rel error": s.param_rel_error} for s in result.steps],
                 hide_index=True,  # errors as 3.1e-15, not 0.000000000000003; the numbers stay numbers
                 column_config={name: st.column_config.NumberColumn(format="%.2e") for name in (
                     "update rel error", "weight rel error")} | {
                     name: st.column_config.NumberColumn(format="%.6g") for name in (
                         "loss (original)", "loss (scrambled)")})


with page_runs() as shared_runs:  # each result's share of the run budget is held until the page is drawn
    main(shared_runs)
