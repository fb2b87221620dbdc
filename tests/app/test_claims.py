"""Every number in a sentence or a metric equals what the chart beside it draws: each test reads the chart's data
from the page and the number from the sentence. Each claim is compared by one function, and a control shows that
the function fails when a page's sentence and its chart disagree."""

import base64
import json
import re

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from perm_core.explore.exploration import ExploreResult
from tests.app.conftest import APP


def open_page(page: str, **params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    at.switch_page(f"pages/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def specs(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def title(spec: dict) -> str:
    """The chart's title as one line (a title wrapped for a narrow column breaks with <br>)."""
    return spec["layout"].get("title", {}).get("text", "").replace("<br>", " ")


def array(values) -> np.ndarray:
    """A chart's array as plotly sends it: a list, or a typed array {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(values, dict):
        flat = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
        shape = [int(n) for n in str(values.get("shape", len(flat))).split(",")]
        return flat.reshape(shape).astype(np.float64)
    return np.asarray(values, dtype=np.float64)


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def explore_claims(at) -> dict[str, tuple[str, str]]:
    """Each Explore claim: (what the page says, what its chart draws, formatted the same way)."""
    charts = specs(at)
    proof = next(s for s in charts if title(s).startswith("un-scrambled vs original"))
    relative = [y for trace in proof["data"] if trace["name"].endswith("(relative)") for y in array(trace["y"])]
    weights = {title(s): array(s["data"][0]["z"]) for s in charts
               if title(s).startswith(("W: as trained", "W′: what the scrambled", "W′ with the inverse"))}
    trained, held, back = (weights[t] for t in ("W: as trained", "W′: what the scrambled model holds",
                                                "W′ with the inverse applied"))
    caption = next(c.value for c in at.caption if "the scrambled model's copy differs" in c.value)
    changed, restored = re.search(r"by up to ([0-9.e+-]+), and the inverse gives it back to ([0-9.e+-]+)",
                                  caption).groups()
    return {"worst un-scrambled error": (metric(at, "Un-scrambled differs by"), f"{max(relative):.1e}"),
            "tensors compared": (metric(at, "Tensors compared"), str(len(relative))),
            "weight changed": (changed, f"{np.abs(held - trained).max():.3g}"),
            "weight restored": (restored, f"{np.abs(back - trained).max():.1e}")}


def disagreeing(claims: dict[str, tuple[str, str]]) -> dict:
    return {name: pair for name, pair in claims.items() if pair[0] != pair[1]}


def test_explore_says_what_its_charts_draw():
    at = open_page("explore", model="digits-vit", block_view="weights")  # the block's weight view beside the proof
    claims = explore_claims(at)
    assert disagreeing(claims) == {}
    assert float(claims["worst un-scrambled error"][0]) < 1e-4 and float(claims["weight changed"][0]) > 0.01


def test_control_a_headline_not_taken_from_the_chart_is_caught(monkeypatch):
    monkeypatch.setattr(ExploreResult, "worst_rel", property(lambda self: 0.5))  # the metric's own number, wrong
    at = open_page("explore", model="digits-vit", block_view="weights")
    assert set(disagreeing(explore_claims(at))) == {"worst un-scrambled error"}


def test_backward_headline_is_the_tallest_headline_bar_and_names_it():
    at = open_page("backward")
    chart = next(s for s in specs(at) if title(s).startswith("Gradient error after un-scrambling"))
    bars = chart["data"][0]
    headline = [(y, x) for x, y, color in zip(bars["x"], bars["y"], bars["marker"]["color"], strict=True)
                if color != "#bab0ac"]  # grey: zero in exact arithmetic, reported apart
    worst, name = max(headline)
    assert metric(at, "Max relative gradient error") == f"{worst:.2e}"
    assert f"(worst {worst:.2e}, {name})" in at.success[0].value


def test_rotation_rope_sentence_is_its_chart():
    at = open_page("rotation")
    rope = next(s for s in specs(at) if s["data"] and "RoPE" in title(s))
    plane, general = (max(trace["y"]) for trace in rope["data"][:2])
    sentence = next(m.value for m in at.markdown if "commutes with RoPE" in m.value)
    shown = re.findall(r"\*\*([0-9.e+-]+)\*\*", sentence)
    assert shown == [f"{plane:.1e}", f"{general:.2f}"]
    assert plane < 1e-4 < general


@pytest.mark.parametrize("claims, wrong", [({"a": ("1.0e-15", "1.0e-15"), "b": ("3", "4")}, {"b"}),
                                           ({"a": ("2.2e-16", "2.2e-16")}, set())])
def test_disagreeing_finds_exactly_the_claims_that_differ(claims, wrong):
    assert set(disagreeing(claims)) == wrong
