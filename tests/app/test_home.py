"""AppTest: the home page explains, shows computed pictures and links to the pages; the app shell works."""

import re

import torch
from streamlit.testing.v1 import AppTest

from perm_core.models.defaults import default_inputs
from perm_core.models.registry import load_model
from perm_core.verify import check
from perm_core.verify.tolerances import worst_rel
from tests.app.conftest import APP
from ui.sidebar import default_model


def test_home_renders_with_sidebar_and_links():
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Transformer Symmetry Explorer"
    assert len(at.get("imgs")) >= 1 or len(at.get("image")) >= 1
    assert len(at.latex) >= 2
    links = [link.proto.label for link in at.get("page_link")]
    assert any(label.startswith("Explore") for label in links) and any(label.startswith("Check") for label in links)
    # Home acts on no model: the sidebar says where the controls are instead of showing idle ones.
    assert not at.sidebar.selectbox and not at.sidebar.text_input
    assert "open one of them" in at.sidebar.caption[0].value


def test_explore_opens_on_the_default_model_and_keys_and_mirrors_them_in_the_url():
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.switch_page("pages/explore.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="model").value == default_model()  # dinov2-s on a photo when its wheel is there
    assert at.text_input(key="k_channels").value == "42"
    assert at.query_params["model"] in (default_model(), [default_model()])


def test_a_bad_key_is_a_message_and_the_page_keeps_working():
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = "digits-vit"
    at.run()
    at.switch_page("pages/explore.py").run()
    at.text_input(key="k_tokens").set_value("-1").run()
    assert not at.exception
    assert any("whole number" in e.value for e in at.error)
    assert at.title[0].value.startswith("Explore")


def test_the_exactness_claim_is_what_a_float64_check_measures():
    """Home says "equal to float64 round-off: relative errors around 1e-15", not "to the last bits"."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    intro = next(m.value for m in at.markdown if "comes back" in m.value)
    assert "last bits of floating point" not in intro and "Not bit for bit" in intro
    claimed = float(re.search(r"relative errors around (1e-\d+)", intro).group(1))
    loaded = load_model("digits-vit", dtype=torch.float64)
    report = check.check(loaded.model, default_inputs(loaded), ["tokens", "channels", "heads", "mlp"], key=42)
    assert report.passed
    # Every tensor on its own scale (the floored exact zeros carry no relative information), forward and backward.
    errors = [t for c in report.checks for t in c.tensors if not t.floor_reason]
    worst = worst_rel(errors)
    assert claimed / 10 <= worst <= claimed * 10, worst
    assert any(t.max_abs_error > 0 for t in errors)  # not bit for bit


def test_the_float32_sentence_is_what_a_float32_check_measures():
    """Home says float32 shows the same rounding as 1e-7 to 1e-5 (Explore starts in float32), and gives each dtype's
    unit round-off: a float32 check of the same model lands in that range, within a decade, as the claim above."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    intro = next(m.value for m in at.markdown if "comes back" in m.value)
    low, high = (float(v) for v in re.search(r"shows as (1e-\d+) to (1e-\d+)", intro).groups())
    assert f"{torch.finfo(torch.float32).eps:.1e}" in intro and f"{torch.finfo(torch.float64).eps:.1e}" in intro
    loaded = load_model("digits-vit", dtype=torch.float32)
    report = check.check(loaded.model, default_inputs(loaded), ["tokens", "channels", "heads", "mlp"], key=42,
                         backward=False)
    errors = [t for c in report.checks for t in c.tensors if not t.floor_reason]
    assert low / 10 <= worst_rel(errors) <= high * 10, worst_rel(errors)
