"""AppTest: the Rotation page proves the rotated model is the same function and shows the near misses."""

import json

from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP


def test_rotation_page_default_run():
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/rotation.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    verdict = at.success[0].value
    assert "same function" in verdict and "broken, as it must be" in verdict
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    titles = [c["layout"].get("title", {}).get("text", "") for c in charts]
    assert any("queries" in t for t in titles) and any(t.startswith("attention probabilities") for t in titles)
    assert not any("scores" in t for t in titles)  # the chart shows softmax probabilities, not q·k scores
    assert any("RoPE" in t for t in titles) and any("residual stream" in t for t in titles)
    assert "0.0001" in verdict  # float32 tolerance of the default digits-vit
    # one sentence at the verdict says why float32 shows 1e-7, from the dtype's own unit round-off
    assert "Computed in float32, which keeps 1.2e-07 of relative precision" in verdict

    # A bad key is a clear message, not a traceback.
    at.text_input(key="rotation_key").input("-1").run()
    assert not at.exception
    assert at.error and "whole number" in at.error[0].value
