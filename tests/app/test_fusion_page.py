"""AppTest: the Fusion page fuses digits-vit and digits-vit-b four ways, with proofs and the barrier plots."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_fusion_page_default_run():
    at = AppTest.from_file(APP, default_timeout=240)
    at.run()
    at.switch_page("pages/fusion.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    proofs = [s.value for s in at.success]
    assert len(proofs) == 3 and all("broken, as it must be" in p for p in proofs)  # the three alignments
    assert any(i.value.startswith("average: averages A and B as they are") for i in at.info)  # nothing to prove
    table = at.dataframe[0].value
    average = table[table["model"] == "fused, average"].iloc[0]
    assert average["aligned B = B"].startswith("— (B itself")
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    loss_chart = next(c for c in charts if "test loss" in c["layout"]["title"]["text"])
    assert [t["name"] for t in loss_chart["data"]] == ["average", "permutation", "rotation", "permutation+rotation"]
    table = at.dataframe[0].value
    assert len(table) == 6  # A, B and four fused models
    markdown = " ".join(m.value for m in at.markdown)
    assert "Paper" in markdown and "This run" in markdown

    # No method picked: a clear message.
    at.multiselect(key="fusion_methods").set_value([]).run()
    assert not at.exception and at.error and "at least one method" in at.error[0].value


def test_the_same_model_twice_is_a_message_not_red_boxes():
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["fusion_a"] = "digits-vit"
    at.query_params["fusion_b"] = "digits-vit"
    at.run()
    at.switch_page("pages/fusion.py").run()
    assert not at.exception and not at.error and not at.success
    assert any("same model (digits-vit)" in w.value and "two different models" in w.value for w in at.warning)
    assert not at.get("plotly_chart")
