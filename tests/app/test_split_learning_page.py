"""AppTest: the split-learning page runs without an exception and shows its table and charts."""

import json
import re

import torch
from streamlit.testing.v1 import AppTest

from perm_core.applications import split_learning
from perm_core.engine import keys
from tests.app.conftest import APP
from ui.state import DEFAULT_KEYS


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
    table = at.table[0].value  # a static table: its cells wrap, every column in view at 1024 px
    table["SSIM"] = table["SSIM"].astype(float)
    assert len(table) == 9  # 4 decoder rows + 3 adaptive rows + 2 baselines
    assert set(table["attacker"]) == {"decoder", "adaptive", "—"}
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Plain: held-out accuracy"].endswith("%")

    # Every number in the texts is the one measured in this run (training is deterministic for its settings).
    run = split_learning.train_split(split_learning.DEFAULT_SEED, DEFAULT_KEYS["tokens"], 2,
                                     dtype=torch.float32)
    assert metrics["Plain: held-out accuracy"] == f"{run.final_plain_accuracy:.1%}"
    assert metrics["Scrambled: held-out accuracy"] == f"{run.final_scrambled_accuracy:.1%}"
    assert metrics["Max weight difference"] == f"{run.max_weight_difference:.1e}"
    captions = " ".join(c.value for c in at.caption)
    assert f"end of this float32 run, {run.max_weight_difference:.1e}." in captions
    # Why the curves part is said in full size above them, its numbers this run's; the chart's title says it too
    why = next(m.value for m in at.markdown if m.value.startswith("**Why the two curves can part.**"))
    gap = re.search(r"2 epochs of training amplify.*differ by at most \*\*([\d.]+%)\*\*", why).group(1)
    assert gap == f"{split_learning.accuracy_gap(run):.1%}"
    assert f"end **{run.max_weight_difference:.1e}** apart" in why
    assert f"at most {gap} apart in accuracy" in charts[0]["layout"]["title"]["text"].replace("<br>", " ")
    assert "1e-12" not in captions and "coincide" not in captions
    # No fixed accuracies or precisions in the help texts: they could not describe every run.
    assert not re.search(r"\d+ ?%", at.slider(key="sl_epochs").help or "")
    assert "1e-12" not in (at.selectbox(key="sl_dtype").help or "")
    # The key is a 64-bit integer; the permutation group is a separate, computed number.
    key_text = next(m.value for m in at.markdown if m.value.startswith("**The key**"))
    assert "64-bit integer" in key_text and "at most 2⁶⁴ guesses" in key_text
    assert f"64! ≈ 2^{keys.permutation_bits(64):.1f}" in key_text
    assert f"16! ≈ 2^{keys.permutation_bits(16):.1f}" in key_text
    # The attack claim lists exactly the protections whose SSIM is within the stated margin of the best
    # baseline, with that margin written in the sentence.
    claims = next(m.value for m in at.markdown if "push the reconstructions' SSIM" in m.value)
    best = table[table["attacker"] == "—"]["SSIM"].max()
    decoder = table[(table["attacker"] == "decoder") & (table.index > table.index[0])]
    margin = float(re.search(r"to within ([\d.]+) of the best baseline \(([\d.]+)\)", claims).group(1))
    assert re.search(r"best baseline \(([\d.]+)\)", claims).group(1) == f"{best:.3f}"
    listed = claims.split("or below: ")[1].split(".")[0]
    for _, row in decoder.iterrows():
        if abs(row["SSIM"] - (best + margin)) > 1e-3:  # clear of the rounding of the table's SSIM
            assert (row["protection"] in listed) == (row["SSIM"] <= best + margin), (row["protection"], claims)


def test_accuracy_gap_is_the_largest_difference_over_epochs():
    run = split_learning.SplitTraining(0, 1, 3, 32, 1e-3, plain_accuracy=[0.2, 0.5, 0.9],
                                       scrambled_accuracy=[0.2, 0.45, 0.91])
    assert abs(split_learning.accuracy_gap(run) - 0.05) < 1e-12
    run.scrambled_accuracy[0] = float("nan")
    assert split_learning.accuracy_gap(run) == float("inf")


def test_split_learning_page_rejects_a_bad_key():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("pages/split_learning.py")
    at.session_state["sl_key"] = "abc"
    at.run()
    assert not at.exception
    assert "whole number" in at.error[0].value
    assert not at.get("plotly_chart")
