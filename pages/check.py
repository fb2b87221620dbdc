"""Check: the full verification report (every symmetry forward and backward, negative controls) for the
sidebar's model, input and keys."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import json

import pandas as pd
import streamlit as st
import torch

from perm_core.models.input_spec import check_command
from perm_core.verify.check import check
from perm_core.verify.expert_blocks import block_notes
from perm_core.verify.experts import expert_columns
from ui.charts.figures_proof import stage_chart, tensor_error_chart
from ui.export import chart
from ui.long_run import long_run, stop_if_stopped
from ui.runtime import CHECK_WEIGHT_COPIES, model_on, page_run_bytes, page_slot
from ui.sidebar import SYMMETRY_LABELS, ensure_view
from ui.state import parse_bool, publish, seed
from ui.summary import check_summary


def main() -> None:
    """The page's data lives in this frame: nothing of a run outlives it in the page's globals."""
    view = ensure_view()
    st.title("Check: is this model exactly symmetric?")
    st.markdown("For researchers: every symmetry switched on in the sidebar is applied with its key to the sidebar's "
                "model and input, forward and backward, and compared tensor by tensor with the original run; every "
                "negative control must break. `python -m perm_core check MODEL --json` gives the same report on the "
                "model's default input, with one key for every symmetry.")
    view.show_messages()
    if not view.ready:
        publish()
        st.stop()
    if not view.keys:
        st.warning("Switch on at least one symmetry in the sidebar.")
        publish()
        st.stop()

    seed("check_backward", True, parse_bool)
    backward = st.checkbox("Backward pass too (gradients of inputs and every weight)", key="check_backward")
    keys_text = ", ".join(f"{SYMMETRY_LABELS[name].lower()} {key}" for name, key in view.keys.items())
    st.caption(f"**{view.model_name}** in {view.dtype_name} on {view.device} · input: {view.input_label} · "
               f"keys: {keys_text} (all from the sidebar)")
    settings = (view.model_name, view.dtype_name, view.device, view.input_id, tuple(view.keys.items()), backward)

    def request_check():
        st.session_state["check_requested"] = True

    stop_if_stopped("check", settings, "the check", on_resume=request_check)
    # on_click runs before the script, so the request survives any rerun of this run.
    st.button("Run check", type="primary", on_click=request_check)
    if st.session_state.pop("check_requested", False):
        model = model_on(view.model_name, view.dtype_name, view.device, view.loaded.model)
        inputs = {k: v.to(view.device) if isinstance(v, torch.Tensor) else v for k, v in view.inputs.items()}
        held = page_run_bytes(view.model_name, dtype_name=view.dtype_name,  # of the run budget, while it computes
                              copies=CHECK_WEIGHT_COPIES[backward])
        with page_slot(held), long_run("check", settings, "the check") as progress:
            report = check(model, inputs, list(view.keys), dict(view.keys), model_name=view.model_name,
                           backward=backward, progress=progress)
        st.session_state["check_report"] = (settings, report)

    stored = st.session_state.get("check_report")
    if stored is None or stored[0] != settings:
        st.info("Press **Run check**: digits-vit takes a few seconds, the real models up to minutes (the bar shows "
                "the time left, and the run can be stopped).")
        publish()
        st.stop()
    report = stored[1]
    FLOOR_COLUMN = "judged by |x| because"
    SCIENTIFIC = {name: st.column_config.NumberColumn(format="%.1e", width=75) for name in
                  ("max abs error", "max rel error", "tolerance", "max_abs_error", "max_rel_error")}
    # Pixel widths that fit the main column at 1024 px beside the sidebar (minilm's and dinov2-s's long names and
    # reasons scrolled the table sideways there): a longer name or reason is cut in its cell, whole on hover.
    TENSOR_TABLE_WIDTHS = {"tensor": st.column_config.TextColumn(width=160),
                           "finite": st.column_config.CheckboxColumn(width=45),
                           FLOOR_COLUMN: st.column_config.TextColumn(width=110)}
    payload = report.to_json()
    n_checks = len(report.checks)
    n_passed = sum(c.passed for c in report.checks)
    n_broken = sum(c.broken for c in report.controls)
    uninformative = [c for c in report.controls if not c.informative]
    summary = (f"{report.model} ({report.family}, {report.dtype}): {n_passed}/{n_checks} checks pass, "
               f"{n_broken}/{len(report.controls)} negative controls break"
               + (f" ({len(uninformative)} cannot bite on this checkpoint, see below)." if uninformative else ".")
               # a switched-on symmetry the architecture lacks is in no check: say so beside the verdict, not only below
               + "".join(f" {SYMMETRY_LABELS[n.symmetry]} is NOT a symmetry of this architecture: its standard element "
                         f"changes the output by {n.max_rel_error:.1e}" + (" (as claimed)." if n.broken else ".")
                         for n in report.not_symmetries))
    verdict = ("PASSED — " if report.passed else "FAILED — ") + summary
    (st.success if report.passed else st.error)(verdict)
    if report.oracle is not None:
        o = report.oracle
        (st.caption if o.passed else st.error)(
            f"Oracle: the original run's {o.output} equals transformers' own forward ({o.attention} attention) to "
            f"{o.max_rel_error:.1e} (relative; tolerance {o.tolerance:.0e})" if o.passed else
            f"Oracle FAILED: the original run's {o.output} differs from transformers' own forward by "
            f"{o.max_rel_error:.1e} (tolerance {o.tolerance:.0e}): the traced run is not the stock model.")

    st.dataframe(pd.DataFrame([{"symmetry": c.symmetry, "direction": c.direction, "max abs error": c.max_abs_error,
                                "max rel error": c.max_rel_error, "in eps": round(c.max_rel_error_eps, 1),
                                "tolerance": c.tolerance, "result": "pass" if c.passed else "FAIL",
                                # the column only when some check broke: a narrow window keeps the rest in view
                                **({"first breaks at": c.first_break} if not report.passed else {})}
                               for c in report.checks]),
                 hide_index=True, width="stretch", column_config=SCIENTIFIC)
    floored = {name for c in report.checks for name in c.floored}
    if floored:
        largest = max(c.floored_max_abs_error for c in report.checks)
        st.caption(f"Errors above leave out {len(floored)} tensor(s) that are zero in exact arithmetic (key-bias "
                   f"gradients): what is left in them is round-off, |x| ≤ {largest:.1e}. \"in eps\": the relative "
                   f"error in units of {report.dtype} machine epsilon.")
    failing = [c for c in report.checks if c.first_break]
    if failing:
        st.subheader("Where it first breaks")
        st.markdown("\n".join(f"- **{c.symmetry} / {c.direction}**: first tensor over its tolerance, in the order the "
                              f"run computed them: `{c.first_break}`" for c in failing))
        st.caption("The first failing check is picked under Per-tensor errors below, with its error place by place.")
    expert_notes = [f"- **{c.symmetry} / {c.direction}**: {note}" for c in report.checks
                    for note in block_notes(c.experts)]
    if expert_notes:  # a mixture of experts: the first block listed is where its experts or its routing broke
        st.markdown("Which experts broke, block by block (each expert run on every token of its block's input):\n"
                    + "\n".join(expert_notes))
    st.subheader("Negative controls")
    # A static table wraps long control names and results instead of clipping them in a narrow window.
    st.table(pd.DataFrame([{"control": f"{c.symmetry}: {c.description}", "max rel error": f"{c.max_rel_error:.1e}",
                            "measured on": c.measured_on,
                            "result": "broken, as it must" if c.broken else
                            "cannot bite here" if not c.informative else "NOT BROKEN",
                            **({"where in the experts": " ".join(block_notes(c.experts, most=1))}
                               if any(other.experts for other in report.controls) else {})} for c in report.controls]),
             hide_index=True)
    for c in uninformative:
        st.caption(f"**{c.symmetry}: {c.description}** — {c.note}.")
    if report.restricted:
        st.subheader("Checked in a restricted form")
        st.markdown("\n".join(f"- **{SYMMETRY_LABELS[name]}**: {reason}" for name, reason in report.restricted.items()))
    if report.not_symmetries:
        st.subheader("Symmetries this architecture does not have")
        st.markdown("\n".join(
            f"- **{SYMMETRY_LABELS[n.symmetry]}**: {n.reason} Measured: the standard element changes the output by "
            f"{n.max_rel_error:.1e} (relative), " + ("broken as claimed." if n.broken else
                                                    "which is NOT a break: the claim is wrong.")
            for n in report.not_symmetries))

    st.subheader("Per-tensor errors")
    labels = [f"{c.symmetry} / {c.direction}" for c in report.checks]
    first_failing = next((i for i, c in enumerate(report.checks) if not c.passed), 0)
    picked = st.selectbox("Check", range(len(labels)), index=first_failing, format_func=labels.__getitem__)
    tensors = report.checks[picked].tensors
    chart(stage_chart(report.checks[picked].stages, f"{labels[picked]}: worst error over tolerance, place by "
                                                    "place"), width="stretch")
    fig = tensor_error_chart([t.name for t in tensors], [t.max_abs_error for t in tensors],
                             [t.max_rel_error for t in tensors], f"{labels[picked]}: every tensor",
                             report.checks[picked].tolerance, tolerances=[t.tolerance for t in tensors])
    chart(fig, width="stretch")
    # Headers in words (not the report's field names); where no floor applies the reason is empty, not "None".
    st.dataframe(pd.DataFrame([{"tensor": t.name, "max abs error": t.max_abs_error, "max rel error": t.max_rel_error,
                                "tolerance": t.tolerance, "finite": t.finite,
                                FLOOR_COLUMN: t.floor_reason or "", **expert_columns(t, tensors)}
                               for t in tensors]), hide_index=True,
                 width="stretch", height=240,
                 column_config=SCIENTIFIC | TENSOR_TABLE_WIDTHS)
    st.caption(f"\"{FLOOR_COLUMN}\": a tensor that is zero in exact arithmetic has no relative error to speak of; it "
               "is judged by its absolute size instead, and this column says why.")
    command = check_command(view.model_name, view.dtype_name, dict(view.keys), view.input_spec, backward)
    payload["reproduce"] = command
    st.markdown("The same report from a terminal" + (" (name your image file where it says YOUR_FILE)"
                                                     if view.input_spec is None else "") + ":")
    st.code(command, language="bash", wrap_lines=True)
    st.download_button("Download the report (JSON)", json.dumps(payload, indent=2),
                       file_name=f"check-{view.model_name.replace(':', '_')}-{view.dtype_name}.json",
                       mime="application/json")
    # A take-home page for a student or a lecture's notes: what was run, the verdict, the numbers, the command
    st.download_button("Take-home summary (Markdown)",
                       check_summary(report, verdict, view.input_label, keys_text, command),
                       file_name=f"check-{view.model_name.replace(':', '_')}-{view.dtype_name}.md",
                       mime="text/markdown")
    publish()


main()
