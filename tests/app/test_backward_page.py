"""AppTest: the Backward page computes real gradients and SGD errors, and refuses a bad key."""

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "backward.py")


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_default_run_shows_exact_gradients_and_sgd_lockstep():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    assert not at.exception
    shown = metrics(at)
    assert shown["Loss, original world"] == shown["Loss, scrambled world"]
    assert float(shown["Max relative gradient error"]) < 1e-9
    assert float(shown["Update error"]) < 1e-9
    assert float(shown["Weight error"]) < 1e-9
    assert float(shown["Loss after 5 steps"]) < float(shown["Loss at step 0"])  # training really moved it
    assert len(at.success) == 2 and not at.error
    # "All N gradients": the input's and every parameter's, each compared and each on the error chart.
    from perm_core.models.registry import load_model

    n_params = len(list(load_model("digits-vit").model.parameters()))
    assert at.success[0].value.startswith(f"All {n_params + 1} gradients (the input's and every parameter's)")
    specs = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    errors_chart = next(s for s in specs
                        if s["layout"]["title"]["text"].startswith("Gradient error after un-scrambling"))
    assert len(errors_chart["data"][0]["x"]) == n_params + 1
    sgd = next(s for s in specs if "per SGD step" in s["layout"]["title"]["text"])
    assert [t["name"] for t in sgd["data"]] == ["correct scramble"]
    assert sgd["data"][0]["x"] == [1, 2, 3, 4, 5]  # step 0 trained nothing: never plotted
    lines = {shape["y0"] for shape in sgd["layout"]["shapes"]}
    assert lines == {1e-9, 1e-3}  # the tolerance and BROKEN_AT
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == 6  # steps 0..5


def test_bad_key_shows_an_error_not_a_traceback():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.text_input(key="bw_key").set_value("not a key").run()
    assert not at.exception
    assert "whole number" in at.error[0].value
    assert not at.metric


def test_text_model_with_negative_control():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.selectbox(key="bw_model").set_value("random:bert").run()
    at.selectbox(key="bw_control").set_value("norms_not_permuted").run()
    assert not at.exception
    shown = metrics(at)
    assert float(shown["Max relative gradient error"]) < 1e-9
    assert float(shown["Update error"]) < 1e-9
    warning = at.warning[0].value
    assert "broken, as it must be" in warning and "above 1e-03" in warning
    shown_error = float(warning.split("worst relative update error ")[1].split(",")[0])
    assert shown_error > 1e-3


def test_control_with_learning_rate_zero_is_not_broken():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.selectbox(key="bw_control").set_value("norms_not_permuted").run()
    assert "broken, as it must be" in at.warning[0].value  # trained: broken
    at.select_slider(key="bw_lr").set_value(0.0).run()
    assert not at.exception and not at.warning and not at.error
    infos = [i.value for i in at.info]
    assert any("nothing was trained" in i and "norms_not_permuted" in i and "not broken" in i for i in infos)
    assert any(i.startswith("Learning rate 0: nothing was trained") for i in infos)
    assert len(at.success) == 1  # the gradients' verdict only: SGD neither passed nor failed
