"""AppTest: the Check page runs the full report on a zoo model, shows tables and per-tensor errors, offers JSON."""

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def check_page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in query.items():
        at.query_params[name] = str(value)
    at.run()
    at.switch_page("pages/check.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_check_digits_float64_passes_and_offers_json():
    at = check_page(check_key="5", model="digits-vit")  # the Check page starts on the sidebar's model
    assert at.selectbox(key="check_model").value == "digits-vit"
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    verdict = at.success[0].value
    assert verdict.startswith("PASSED") and "digits-vit (vit, float64)" in verdict
    checks, controls = at.dataframe[0].value, at.dataframe[1].value
    assert set(checks["direction"]) == {"forward", "backward"}
    assert (checks["max rel error"] <= 1e-9).all() and (checks["result"] == "pass").all()
    assert (controls["max rel error"] > 1e-3).all() and len(controls) >= 5
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert chart["layout"]["yaxis"]["type"] == "log"
    downloads = at.get("download_button")
    assert downloads and downloads[0].proto.label == "Download the report (JSON)"


def test_check_bad_key_and_no_symmetry_are_messages():
    at = check_page(check_key=str(10**30))
    assert any("whole number" in e.value for e in at.error) and not at.button
    at.text_input(key="check_key").set_value("3").run()
    assert not at.error and at.button
    at.multiselect[0].set_value([]).run()
    assert any("at least one" in w.value for w in at.warning)


def test_check_text_model_single_symmetry_float32():
    at = check_page(check_model="random:gpt2", check_dtype="float32")
    at.multiselect[0].set_value(["tokens"]).run()
    at.button[0].click().run()
    assert not at.exception
    assert at.success[0].value.startswith("PASSED") and "float32" in at.success[0].value
    checks = at.dataframe[0].value
    assert list(checks["symmetry"]) == ["tokens", "tokens"] and (checks["max rel error"] <= 1e-4).all()


def test_a_stopped_check_says_so_and_runs_again_on_request():
    at = check_page(check_model="random:gpt2", check_dtype="float64", check_key="4")
    at.multiselect[0].set_value(["mlp"]).run()
    at.session_state["_check_stopped"] = ("random:gpt2", "float64", 4, ("mlp",), True)  # what Stop leaves
    at.run()
    assert any(w.value.startswith("Stopped: the check") for w in at.warning) and not at.success
    assert [b.label for b in at.button] == ["Run the check again"]
    at.button[0].click().run()
    assert not at.exception and not at.warning
    assert at.success[0].value.startswith("PASSED") and "random:gpt2 (gpt2, float64)" in at.success[0].value
