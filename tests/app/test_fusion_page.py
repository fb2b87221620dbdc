"""AppTest: the Fusion page fuses digits-vit and digits-vit-b four ways, with proofs and the barrier plots; and the
experiment over seed pairs, whose sentence, table and charts carry the same computed numbers."""

import base64
import json

import numpy as np
from streamlit.testing.v1 import AppTest

from perm_core.applications.fusion_experiment import METHODS as EXPERIMENT_METHODS
from perm_core.applications.intervals import paired_difference
from tests.app.conftest import APP

# five pairs of 32-wide ViTs, one epoch each (seconds), run at once as a link with fx_run=1 asks
TINY_EXPERIMENT = {"fx_width": "32", "fx_epochs": "1", "fx_run": "1"}


def decode(values) -> list[float]:
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"])).tolist()
    return list(values)


def fusion_page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in {**TINY_EXPERIMENT, **query}.items():
        at.query_params[name] = value
    at.run()
    at.switch_page("pages/fusion.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def table(at, index: int):
    """The page's st.table as a data frame with its first column (model or method) as a column again."""
    frame = at.table[index].value
    return frame if frame.index.name is None else frame.reset_index()


def title(chart: dict) -> str:
    return chart["layout"].get("title", {}).get("text", "")


def test_fusion_page_default_run():
    at = fusion_page()
    assert not at.error, [e.value for e in at.error]
    assert not at.get("doc_string") and not at.get("json")  # nothing drawn by Streamlit's magic
    proofs = [s.value for s in at.success]
    assert len(proofs) == 3 and all("broken, as it must be" in p for p in proofs)  # the three alignments
    assert any(i.value.startswith("average: averages A and B as they are") for i in at.info)  # nothing to prove
    pair = table(at, 0)
    average = pair[pair["model"] == "fused, average"].iloc[0]
    assert average["aligned B = B"].startswith("— (B itself")
    loss_chart = next(c for c in charts(at) if "test loss" in title(c))
    assert [t["name"] for t in loss_chart["data"]] == ["average", "permutation", "rotation", "permutation+rotation"]
    assert len(pair) == 6  # A, B and four fused models
    fused = {row["model"]: row["test accuracy"] for _, row in pair.iterrows()}
    one_pair = next(m.value for m in at.markdown if m.value.startswith("On this one pair"))
    assert (f"from {fused['fused, average']} (plain averaging) to {fused['fused, permutation+rotation']}"
            in one_pair)

    # No method picked: a clear message, and the experiment still runs below it.
    at.multiselect(key="fusion_methods").set_value([]).run()
    assert not at.exception and at.error and "at least one method" in at.error[0].value
    assert any(m.value.startswith("**Over 5 seed pairs") for m in at.markdown)


def test_the_experiment_says_from_its_intervals_whether_rotation_adds():
    at = fusion_page()
    markdown = " ".join(m.value for m in at.markdown)
    assert "Paper" in markdown and "651.57 to 613.63" in markdown
    summary = table(at, 1)
    assert list(summary["method"]) == list(EXPERIMENT_METHODS)
    assert list(summary["aligned B = B"]) == ["— (nothing aligned)"] + ["proved 5/5"] * 4
    accuracy = next(c for c in charts(at) if title(c).startswith("Test accuracy of (A + aligned"))
    bars, points = accuracy["data"][0], accuracy["data"][1]
    means = dict(zip(bars["y"], decode(bars["x"]), strict=True))
    for _, row in summary.iterrows():  # the table's means are the chart's bars
        assert row["merged accuracy, % (95 % interval)"].startswith(f"{means[row['method']]:.1f} (")
    # the sentence: the paired interval of (permutation+rotation) - (permutation), from each pair's chart points
    each = {}
    for method, value in zip(points["y"], decode(points["x"]), strict=True):
        each.setdefault(method, []).append(value)
    assert all(len(values) == 5 for values in each.values())
    verdict = next(m.value for m in at.markdown if m.value.startswith("**Over 5 seed pairs"))
    for kind in ("activations", "weights"):
        gain = paired_difference(each[f"{kind}: permutation+rotation"], each[f"{kind}: permutation"])
        reading = ("rotation adds" if gain.low > 0 else "rotation costs" if gain.high < 0 else
                   "no difference this many pairs can show")
        assert (f"{gain.mean:+.1f} points with {kind[:-1]} matching (95 % interval {gain.low:+.1f} to "
                f"{gain.high:+.1f}: {reading})") in verdict
    assert any("fuse --experiment --pairs 5 --width 32 --epochs 1 --json" in c.value for c in at.caption)


def test_the_same_model_twice_is_a_message_not_red_boxes():
    at = fusion_page(fusion_a="digits-vit", fusion_b="digits-vit")
    assert not at.error and not at.success
    assert any("same model (digits-vit)" in w.value and "two different models" in w.value for w in at.warning)
    assert not any("test loss (cross-entropy)" in title(c) for c in charts(at))


def test_the_experiment_trains_nothing_until_asked_then_runs_and_is_kept_for_the_next_visitor(monkeypatch):
    from perm_core.applications import fusion_experiment

    calls = []
    real = fusion_experiment.run_experiment
    monkeypatch.setattr(fusion_experiment, "run_experiment", lambda *a, **k: calls.append(1) or real(*a, **k))
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update({"fx_width": "32", "fx_epochs": "2"})  # settings no other test computed
    at.run()
    at.switch_page("pages/fusion.py")
    at.run()
    assert not at.exception and calls == [] and not any(m.value.startswith("**Over 5 seed pairs") for m in at.markdown)
    assert at.button(key="fx_start").label == "Run the experiment: train 10 ViTs"
    at.button(key="fx_start").click().run()
    assert calls == [1] and any(m.value.startswith("**Over 5 seed pairs") for m in at.markdown)
    assert at.query_params["fx_run"] in ("true", ["true"], "1", ["1"])  # the link now opens with it run
    again = AppTest.from_file(APP, default_timeout=300)  # the next visitor, without fx_run: shown at once
    again.query_params.update({"fx_width": "32", "fx_epochs": "2"})
    again.run()
    again.switch_page("pages/fusion.py")
    again.run()
    assert calls == [1] and any(m.value.startswith("**Over 5 seed pairs") for m in again.markdown)
