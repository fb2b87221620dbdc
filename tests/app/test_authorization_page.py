"""AppTest: the Model authorization page measures right key, no key, wrong keys; refuses a bad key."""

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from perm_core.engine.keys import permutation_bits
from perm_core.models.digits import evaluate_digits
from perm_core.models.registry import load_model
from ui.state import DEFAULT_KEYS

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "authorization.py")


def percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_digits_lock_numbers_and_histogram():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.query_params["au_attack_steps"] = "100"  # the attacker's fine-tuning sweep, short
    at.run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    accuracy, _ = evaluate_digits(load_model("digits-vit").model)
    assert abs(percent(shown["Right key"]) - accuracy) < 1e-3
    assert shown["Unlocked model"] == shown["Right key"]
    assert percent(shown["No key"]) < 0.3
    assert percent(shown["Wrong keys (mean of 20)"]) < 0.3
    key = DEFAULT_KEYS["channels"]  # the page starts from the app's channels key
    info = at.info[0].value
    assert f"Keys are 64-bit whole numbers, as on every page; this one needs {key.bit_length()} bits" in info
    assert f"finds it at guess {key + 1}: a key this small is no secret" in at.info[0].value
    assert "2^63 guesses on average" in at.info[0].value and "reach at most 2^64 of them" in at.info[0].value
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
    assert "from 0 to 2**64-1" in at.error[0].value  # the same words as every page's key
    assert not at.metric


def test_one_key_size_on_every_page_and_a_large_key_is_not_found_by_counting():
    """Keys are 64-bit here as on every page: 2**64 is refused, 2**64-1 unlocks and is no small number."""
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.query_params["au_attack_steps"] = "100"
    at.run()
    at.text_input(key="au_key").set_value(str(2**64)).run()
    assert "from 0 to 2**64-1" in at.error[0].value and not at.metric
    at.text_input(key="au_key").set_value(str(2**64 - 1)).run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert shown["Right key"] == shown["Unlocked model"] and percent(shown["No key"]) < 0.3
    assert "this one needs 64 bits" in at.info[0].value and f"guess {2**64:,}." in at.info[0].value
    assert "no secret" not in at.info[0].value


def test_minilm_retrieval():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.query_params["au_model"] = "minilm"
    at.run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert percent(shown["Right key"]) == percent(shown["Unlocked model"]) >= 0.9
    assert percent(shown["No key"]) < percent(shown["Right key"]) - 0.3
    # the attacker breaks the key of a text model too; the fine-tuning sweep needs the digits' training data
    assert shown["Key recovered"] == "exactly" and shown["Attacker's unlocked model"] == shown["Right key"]
    assert any("every one of the 384 channel positions" in w.value for w in at.warning)
    assert any("measured on the digits models" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 1


def test_the_attacker_recovers_the_key_and_the_sweep_chart_says_what_the_sentence_says():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.query_params["au_attack_steps"] = "100"
    at.run()
    assert not at.exception and not at.error
    shown = {m.label: m.value for m in at.metric}
    assert shown["Key recovered"] == "exactly"
    assert shown["Attacker's unlocked model"] == shown["Key holder's model"] == shown["Right key"]
    assert float(shown["Attacker's time"].removesuffix(" s")) > 0
    broken = next(w.value for w in at.warning if w.value.startswith("The key is broken"))
    assert "every one of the 64 channel positions" in broken and "differs from the locked one by 0.0e+00" in broken
    markdown = " ".join(m.value for m in at.markdown)
    assert "Hidden No More” (ICML 2025)" in markdown and "Shuffling Defense” (ACL 2026)" in markdown
    sweep = json.loads(at.get("plotly_chart")[1].proto.spec)
    traces = {t["name"]: t for t in sweep["data"]}
    share = traces["key recovered (share of its channel positions)"]
    assert share["x"] == ["0", "10", "30", "100"]
    attacker = traces["attacker's unlocked accuracy"]["y"]
    owner = traces["owner's accuracy (the fine-tuned model, with the key)"]["y"]
    assert f"{owner[0]:.1f}%" == shown["Right key"]  # k = 0 is the untouched lock
    sentence = next(m.value for m in at.markdown if m.value.startswith("After 100 steps"))
    assert (f"recovers {share['y'][-1]:.1f}% of the key and unlocks {attacker[-1]:.1f}%, against the owner's "
            f"{owner[-1]:.1f}%") in sentence
    assert traces["chance 10%"]["y"] == [10.0, 10.0]
    steps = at.table[0].value  # the expander's table: the chart's points, step by step
    assert list(steps.index.astype(str)) == share["x"]
    assert list(steps["attacker"]) == [f"{a:.1f}%" for a in attacker]


def test_a_faster_fine_tuning_hides_part_of_the_key_and_the_sentence_says_what_it_cost():
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.query_params["au_attack_steps"] = "100"
    at.query_params["au_attack_lr"] = "0.01"
    at.run()
    assert not at.exception and not at.error
    traces = {t["name"]: t["y"] for t in json.loads(at.get("plotly_chart")[1].proto.spec)["data"]}
    share = traces["key recovered (share of its channel positions)"]
    attacker = traces["attacker's unlocked accuracy"]
    owner = traces["owner's accuracy (the fine-tuned model, with the key)"]
    sentence = next(m.value for m in at.markdown if m.value.startswith("After 100 steps at learning rate 0.01"))
    assert f"recovers {share[-1]:.1f}% of the key and unlocks {attacker[-1]:.1f}%" in sentence
    if attacker[-1] < owner[-1] - 2:  # the page's reading: the attacker more than 2 points behind the owner
        cost = owner[0] - owner[-1]
        assert f"hides part of the key, at a cost of {cost:.1f} points of the owner's accuracy" in sentence
    else:
        assert sentence.endswith("fine-tuning does not protect the key.")
