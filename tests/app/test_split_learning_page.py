"""AppTest: the split-learning page runs without an exception and shows its table and charts."""

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_split_learning_page_renders_measurements():
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/split_learning.py")
    # Small settings keep the test short; the widgets read their first value from session state.
    at.session_state["sl_epochs"] = 2
    at.session_state["sl_attack_epochs"] = 2
    at.session_state["sl_victims"] = 30
    at.run()
    assert not at.exception
    assert not at.error
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 3  # training curves, SSIM bars, reconstructions
    assert len(charts[0]["data"]) == 4  # plain/scrambled x accuracy/loss
    table = at.dataframe[0].value
    assert len(table) == 9  # 4 decoder rows + 3 adaptive rows + 2 baselines
    assert set(table["attacker"]) == {"decoder", "adaptive", "—"}
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Plain: held-out accuracy"].endswith("%")


def test_split_learning_page_rejects_a_bad_key():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/split_learning.py")
    at.session_state["sl_key"] = "abc"
    at.run()
    assert not at.exception
    assert "whole number" in at.error[0].value
    assert not at.get("plotly_chart")
