"""AppTest: the home page explains, shows computed pictures and links to the pages; the app shell works."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_home_renders_with_sidebar_and_links():
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Transformer Symmetry Explorer"
    assert len(at.get("imgs")) >= 1 or len(at.get("image")) >= 1
    assert len(at.latex) >= 2
    links = [link.proto.label for link in at.get("page_link")]
    assert any(label.startswith("Explore") for label in links) and any(label.startswith("Check") for label in links)
    # The shared sidebar is rendered with the default model and default keys, and the URL mirrors it.
    assert at.selectbox(key="model").value == "digits-vit"
    assert at.text_input(key="k_channels").value == "42"
    assert at.query_params["model"] in ("digits-vit", ["digits-vit"])


def test_model_load_error_is_a_message_and_home_keeps_working():
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.text_input(key="k_tokens").set_value("-1").run()
    assert not at.exception
    assert any("whole number" in e.value for e in at.error)
    assert at.title[0].value == "Transformer Symmetry Explorer"
