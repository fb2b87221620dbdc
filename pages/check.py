"""Check: the full verification report (every symmetry forward and backward, negative controls) for a model."""

import json

import pandas as pd
import streamlit as st

from perm_core import figures
from perm_core.defaults import default_inputs
from perm_core.keys import InvalidKeyError, validate_key
from perm_core.symmetries import DESCRIPTIONS, SYMMETRIES
from perm_core.verify import check
from perm_core.zoo import ModelLoadError
from ui.long_run import long_run, stop_if_stopped
from ui.resources import shared_model
from ui.sidebar import ZOO, ensure_view
from ui.state import publish, seed

view = ensure_view()
st.title("Check: is this model exactly symmetric?")
st.markdown("For researchers: every symmetry is applied with the key, forward and backward, compared tensor by "
            "tensor against the original run, and every negative control must break. Uses the model's default "
            "input; the same report as `python -m perm_core check MODEL --json`.")

seed("check_model", view.model_name if view else ZOO[0], valid=lambda v: v in ZOO)
seed("check_dtype", "float64", valid=lambda v: v in ("float32", "float64"))
seed("check_key", "0")
cols = st.columns([2, 1, 1])
model_name = cols[0].selectbox("Model", ZOO, key="check_model")
dtype_name = cols[1].radio("dtype", ("float32", "float64"), key="check_dtype", horizontal=True)
raw_key = cols[2].text_input("Key", key="check_key")
chosen = st.multiselect("Symmetries", SYMMETRIES, default=list(SYMMETRIES), format_func=lambda s: s,
                        help="; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()))
backward = st.checkbox("Backward pass too (gradients of inputs and every weight)", value=True)

try:
    key = validate_key(raw_key)
except InvalidKeyError as error:
    st.error(str(error))
    publish()
    st.stop()
if not chosen:
    st.warning("Choose at least one symmetry.")
    publish()
    st.stop()

settings = (model_name, dtype_name, key, tuple(chosen), backward)


def request_check():
    st.session_state["check_requested"] = True


stop_if_stopped("check", settings, "the check", on_resume=request_check)
# on_click runs before the script, so the request survives any rerun of this run.
st.button("Run check", type="primary", on_click=request_check)
if st.session_state.pop("check_requested", False):
    try:
        loaded = shared_model(model_name, dtype_name)
    except ModelLoadError as error:
        st.error(str(error))
        publish()
        st.stop()
    with long_run("check", settings, "the check") as progress:
        report = check(loaded.model, default_inputs(loaded), chosen, key, model_name=model_name,
                       backward=backward, progress=progress)
    st.session_state["check_report"] = (settings, report)

stored = st.session_state.get("check_report")
if stored is None or stored[0] != settings:
    st.info("Press **Run check** (digits-vit takes a few seconds; minilm and smollm2 longer).")
    publish()
    st.stop()
report = stored[1]
SCIENTIFIC = {name: st.column_config.NumberColumn(format="%.1e") for name in
              ("max abs error", "max rel error", "tolerance", "max_abs_error", "max_rel_error")}
payload = report.to_json()
n_checks = len(report.checks)
n_passed = sum(c.passed for c in report.checks)
n_broken = sum(c.broken for c in report.controls)
summary = (f"{report.model} ({report.family}, {report.dtype}): {n_passed}/{n_checks} checks pass, "
           f"{n_broken}/{len(report.controls)} negative controls break.")
(st.success if report.passed else st.error)(("PASSED — " if report.passed else "FAILED — ") + summary)

st.dataframe(pd.DataFrame([{"symmetry": c.symmetry, "direction": c.direction, "max abs error": c.max_abs_error,
                            "max rel error": c.max_rel_error, "tolerance": c.tolerance,
                            "result": "pass" if c.passed else "FAIL"} for c in report.checks]),
             hide_index=True, width="stretch", column_config=SCIENTIFIC)
st.subheader("Negative controls")
st.dataframe(pd.DataFrame([{"control": f"{c.symmetry}: {c.description}", "max rel error": c.max_rel_error,
                            "result": "broken (as it must be)" if c.broken else "NOT BROKEN"}
                           for c in report.controls]), hide_index=True, width="stretch", column_config=SCIENTIFIC)

st.subheader("Per-tensor errors")
labels = [f"{c.symmetry} / {c.direction}" for c in report.checks]
picked = st.selectbox("Check", range(len(labels)), format_func=labels.__getitem__)
tensors = report.checks[picked].tensors
fig = figures.tensor_error_chart([t.name for t in tensors], [t.max_abs_error for t in tensors],
                                 [t.max_rel_error for t in tensors], f"{labels[picked]}: every tensor",
                                 report.checks[picked].tolerance)
st.plotly_chart(fig, width="stretch")
st.dataframe(pd.DataFrame([vars(t) for t in tensors]), hide_index=True, width="stretch", height=240,
             column_config=SCIENTIFIC)
st.download_button("Download the report (JSON)", json.dumps(payload, indent=2),
                   file_name=f"check-{model_name.replace(':', '_')}-{dtype_name}.json", mime="application/json")
publish()
