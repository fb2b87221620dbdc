"""Every page's whole state lives in the URL: a link with non-default settings reopens with exactly those
settings, and the page writes them back into the URL. Also: the sidebar shows model controls only where
they act."""


import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP

# page -> (non-default query values, widget key -> the value the widget must then hold)
LINKS = {
    "check": ({"model": "random:gpt2", "dtype": "float64", "on_mlp": "1", "k_mlp": "77", "check_backward": "0"},
              {"model": "random:gpt2", "dtype": "float64", "on_mlp": True, "k_mlp": "77", "check_backward": False}),
    "backward": ({"bw_model": "random:gpt2", "bw_dtype": "float32", "bw_syms": "heads,mlp", "bw_key": "9",
                  "bw_steps": "3", "bw_lr": "0.01"},
                 {"bw_model": "random:gpt2", "bw_dtype": "float32", "bw_syms": ["heads", "mlp"], "bw_key": "9",
                  "bw_steps": 3, "bw_lr": 0.01}),
    "rotation": ({"rotation_model": "minilm", "rotation_key": "77", "rotation_layer": "2", "rotation_head": "3"},
                 {"rotation_model": "minilm", "rotation_key": "77", "rotation_layer": 2, "rotation_head": 3}),
    "fusion": ({"fusion_a": "digits-vit-b", "fusion_b": "digits-vit",
                "fusion_methods": "average,permutation+rotation"},
               {"fusion_a": "digits-vit-b", "fusion_b": "digits-vit",
                "fusion_methods": ["average", "permutation+rotation"]}),
    "authorization": ({"au_model": "digits-vit", "au_key": "31337", "au_wrong_digits-vit": "3"},
                      {"au_model": "digits-vit", "au_key": "31337", "au_wrong_digits-vit": 3}),
    "split_learning": ({"sl_seed": "1", "sl_key": "5", "sl_epochs": "1", "sl_attack_epochs": "1",
                        "sl_victims": "20", "sl_show": "4"},
                       {"sl_seed": 1, "sl_key": "5", "sl_epochs": 1, "sl_attack_epochs": 1, "sl_victims": 20,
                        "sl_show": 4}),
}


def open_link(page: str, query: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=600)
    for name, value in query.items():
        at.query_params[name] = value
    at.run()
    at.switch_page(f"pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("page", sorted(LINKS))
def test_a_link_restores_the_page_and_the_page_writes_its_state_back(page):
    query, expected = LINKS[page]
    at = open_link(page, query)
    assert not [w.value for w in at.warning if "is not a valid value here" in w.value]
    for key, value in expected.items():
        assert at.session_state[key] == value, key
        published = at.query_params[key]
        published = published[0] if isinstance(published, list) else published
        assert published == query[key], key


# A bad value in a link, on every page: the page names it (tests/e2e/test_bad_input.py opens two of these in Chromium)
BAD_LINKS = {
    "explore": ({"model": "no-such-model"}, ["model=no-such-model"]),
    "explore ": ({"model": "digits-vit", "layer": "-1", "head": "-2"}, ["layer=-1", "head=-2"]),
    "check": ({"model": "random:nope", "dtype": "float16"}, ["model=random:nope", "dtype=float16"]),
    "backward": ({"bw_model": "no-such-model", "bw_image": "-1"}, ["bw_model=no-such-model", "bw_image=-1"]),
    "rotation": ({"rotation_model": "evil", "rotation_layer": "-3", "rotation_head": "-1"},
                 ["rotation_model=evil", "rotation_layer=-3"]),
    "authorization": ({"au_model": "../../etc/passwd"}, ["au_model=../../etc/passwd"]),
    "split_learning": ({"sl_epochs": "-1", "sl_key": "abc"}, ["sl_epochs=-1"]),
    "fusion": ({"fusion_a": "no-such-model", "fusion_points": "-1"}, ["fusion_a=no-such-model", "fusion_points=-1"]),
}


@pytest.mark.parametrize("page", list(BAD_LINKS))
def test_a_bad_link_says_what_it_ignored(page):
    query, named = BAD_LINKS[page]
    at = open_link(page.strip(), query)
    warnings = [w.value for w in at.warning if "is not a valid value here" in w.value]
    for field in named:  # (the control, valid links warning of nothing: test_a_link_restores_the_page...)
        assert any(f"`{field}`" in w for w in warnings), (field, warnings)


def test_a_mangled_link_falls_back_to_defaults_without_an_error():
    at = open_link("backward", {"bw_model": "no-such-model", "bw_steps": "many", "bw_syms": "heads,bogus"})
    assert at.session_state["bw_model"] == "digits-vit" and at.session_state["bw_steps"] == 5
    assert at.session_state["bw_syms"] == ["heads"]


@pytest.mark.parametrize("page", ["backward", "rotation", "fusion", "authorization", "split_learning"])
def test_pages_with_their_own_controls_show_none_in_the_sidebar(page):
    at = open_link(page, dict(LINKS[page][0]))
    assert not at.sidebar.selectbox and not at.sidebar.text_input
    # the one switch left, on every page: projector mode acts on how the page is drawn, not on what it computes
    assert [t.key for t in at.sidebar.toggle] == ["projector_sidebar"]
    assert "has its own controls" in at.sidebar.caption[0].value


def test_projector_mode_is_one_switch_for_every_page_and_the_link_keeps_it():
    """projector=1 (or an older link's walk_projector=1) turns it on: large text, every chart enlarged and drawn
    without its export menu; the sidebar's switch turns it off, on the walk too."""
    import json

    for query in ({"projector": "1"}, {"walk_projector": "1"}):
        at = open_link("explore", query)
        assert at.session_state["projector"] is True and at.sidebar.toggle(key="projector_sidebar").value
        assert any("font-size: 1.45rem" in h.proto.body for h in at.get("html"))
        charts = at.get("plotly_chart")
        assert charts and all(json.loads(c.proto.spec)["layout"]["font"]["size"] >= 16 for c in charts)
        assert not [d for d in at.get("download_button") if d.proto.label == "PNG image"]  # no export menus
    at.sidebar.toggle(key="projector_sidebar").set_value(False).run()
    assert at.session_state["projector"] is False
    assert not any("font-size: 1.45rem" in h.proto.body for h in at.get("html"))
    assert [d for d in at.get("download_button") if d.proto.label == "PNG image"]


def test_pages_with_their_own_key_start_from_the_sidebars_key_for_their_symmetry():
    """One key for the class: a lecturer who set the channels key to 99 and the rotation key to 5 in the sidebar
    finds them on Backward, Authorization and Rotation; without a sidebar key a page starts from the app's default."""
    from ui.state import DEFAULT_KEYS

    expected = {"backward": ("bw_key", "channels"), "authorization": ("au_key", "channels"),
                "rotation": ("rotation_key", "rotation"), "walk": ("walk_key", "tokens")}
    for page, (field, symmetry) in expected.items():
        at = AppTest.from_file(APP, default_timeout=300)
        at.query_params["k_channels"], at.query_params["k_rotation"], at.query_params["k_tokens"] = "99", "5", "8"
        at.query_params["model"] = "digits-vit"
        at.run()
        at.switch_page("pages/check.py").run()  # the sidebar's keys, as a lecturer sets them before other pages
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert at.session_state[field] == {"channels": "99", "rotation": "5", "tokens": "8"}[symmetry], page
        fresh = AppTest.from_file(APP, default_timeout=300)
        fresh.run()
        fresh.switch_page(f"pages/{page}.py").run()
        assert fresh.session_state[field] == str(DEFAULT_KEYS[symmetry]), page
