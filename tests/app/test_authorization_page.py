"""AppTest: the Model authorization page measures right key, no key, wrong keys; refuses a bad key."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from perm_core.engine.keys import permutation_bits
from perm_core.models.digits import evaluate_digits
from perm_core.models.registry import load_model
from ui.state import DEFAULT_KEYS

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "authorization.py")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_digits_lock_numbers_and_histogram():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    accuracy, _ = evaluate_digits(load_model("digits-vit").model)
    assert abs(percent(shown["Right key"]) - accuracy) < 1e-3
    assert shown["Unlocked model"] == shown["Right key"]
    assert percent(shown["No key"]) < 0.3
    assert percent(shown["Wrong keys (mean of 20)"]) < 0.3
    bits = DEFAULT_KEYS["channels"].bit_length()  # the page starts from the app's channels key
    assert f"Keys have up to 256 bits (this one needs {bits})" in at.info[0].value
    assert "at most 2^256 guesses" in at.info[0].value and "reach at most 2^256 of them" in at.info[0].value
    assert f"64! orderings of the residual channels, {permutation_bits(64):.0f} bits" in at.info[0].value
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    histogram = spec["data"][0]
    assert histogram["type"] == "histogram" and histogram["name"] == "20 wrong keys"
    # right key, no key and chance are lines named in the legend (labels on the plot covered the bars)
    lines = {d["name"].rsplit(" ", 1)[0]: float(d["name"].rsplit(" ", 1)[1]) for d in spec["data"][1:]}
    assert set(lines) == {"right key", "no key", "chance"} and not spec["layout"].get("annotations")
    assert lines["right key"] == float(f"{percent(shown['Right key']):.3g}") and lines["chance"] == 0.1


def test_bad_key_shows_an_error():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.text_input(key="au_key").set_value("-1").run()
    assert not at.exception
    assert "at most 256 bits" in at.error[0].value
    assert not at.metric


def test_a_hex_key_of_256_bits_unlocks_and_the_text_says_its_length():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.text_input(key="au_key").set_value("0x" + "a5" * 32).run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert shown["Right key"] == shown["Unlocked model"] and percent(shown["No key"]) < 0.3
    assert "this one needs 256" in at.info[0].value


def test_minilm_retrieval():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.run()
    at.selectbox(key="au_model").set_value("minilm").run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert percent(shown["Right key"]) == percent(shown["Unlocked model"]) >= 0.9
    assert percent(shown["No key"]) < percent(shown["Right key"]) - 0.3
