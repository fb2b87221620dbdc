"""AppTest: the Check page runs the full report on the sidebar's model, input and keys, shows tables and
per-tensor errors, offers JSON, and can be stopped."""

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.conftest import APP
from tests.unit.json_schema import validated

ALL_ON = {f"on_{name}": "1" for name in ("tokens", "channels", "heads", "head_channels", "mlp", "rotation")}


def check_page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in query.items():
        at.query_params[name] = str(value)
    at.run()
    at.switch_page("pages/check.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def controls_of(at: AppTest):
    """The negative controls table (a static table: it wraps instead of clipping), errors as numbers."""
    table = at.table[0].value
    return table.assign(**{"max rel error": table["max rel error"].astype(float)})


def run_button(at: AppTest):
    return next(b for b in at.button if b.label == "Run check")


def test_check_digits_float64_every_symmetry_with_the_sidebar_keys():
    at = check_page(model="digits-vit", dtype="float64", k_heads="9", **ALL_ON)
    assert at.sidebar.selectbox(key="model").value == "digits-vit"  # the one model control on this page
    caption = " ".join(c.value for c in at.caption)
    assert "digits-vit" in caption and "heads 9" in caption and "float64" in caption
    run_button(at).click().run()
    assert not at.exception, [e.value for e in at.exception]
    verdict = at.success[0].value
    assert verdict.startswith("PASSED") and "digits-vit (vit, float64)" in verdict
    checks, controls = at.dataframe[0].value, controls_of(at)
    assert set(checks["direction"]) == {"forward", "backward"}
    assert set(checks["symmetry"]) == {"tokens", "channels", "heads", "head_channels", "mlp", "rotation", "all"}
    assert (checks["max rel error"] <= 1e-9).all() and (checks["result"] == "pass").all()
    assert (controls["max rel error"] > 1e-3).all() and len(controls) >= 5
    assert (controls["result"] == "broken, as it must").all()
    per_tensor = at.dataframe[1].value
    assert per_tensor["judged by |x| because"].map(lambda v: isinstance(v, str)).all()  # never a "None" cell
    stages, chart = (json.loads(c.proto.spec) for c in at.get("plotly_chart")[:2])
    assert stages["layout"]["yaxis"]["type"] == "log" and chart["layout"]["yaxis"]["type"] == "log"
    assert stages["data"][0]["x"][0] == "embeddings" and max(stages["data"][0]["y"]) < 1  # all under tolerance
    downloads = at.get("download_button")
    labels = [d.proto.label for d in downloads]
    assert "Download the report (JSON)" in labels
    assert {"PNG image", "SVG image", "Data (CSV)"} <= set(labels)  # the error chart's export menu


def test_the_report_uses_the_sidebar_keys_and_follows_a_key_change():
    at = check_page(model="random:gpt2", dtype="float64", k_tokens="5", k_channels="6")
    run_button(at).click().run()
    first = controls_of(at)["max rel error"].tolist()
    at.sidebar.text_input(key="k_channels").set_value("7").run()
    assert not at.success, "a report for other keys must not stay on screen"
    run_button(at).click().run()
    assert at.success[0].value.startswith("PASSED")
    assert controls_of(at)["max rel error"].tolist() != first  # the controls drew from the new key


def test_bad_key_and_no_symmetry_are_messages():
    at = check_page(model="random:gpt2", k_tokens=str(10**30))
    assert any("whole number" in e.value for e in at.error) and not any(b.label == "Run check" for b in at.button)
    at.sidebar.text_input(key="k_tokens").set_value("3").run()
    assert not at.error and any(b.label == "Run check" for b in at.button)
    at.sidebar.toggle(key="on_tokens").set_value(False).run()
    at.sidebar.toggle(key="on_channels").set_value(False).run()
    assert any("at least one symmetry" in w.value for w in at.warning)


def test_check_text_model_float32_on_the_sidebar_text():
    at = check_page(model="random:gpt2", dtype="float32", on_channels="0")
    run_button(at).click().run()
    assert not at.exception
    assert at.success[0].value.startswith("PASSED") and "float32" in at.success[0].value
    checks = at.dataframe[0].value
    assert list(checks["symmetry"]) == ["tokens", "tokens"] and (checks["max rel error"] <= 1e-4).all()


def test_a_stopped_check_says_so_and_runs_again_on_request():
    at = check_page(model="random:gpt2", dtype="float64", on_tokens="0", on_channels="0", on_mlp="1", k_mlp="4")
    view = at.session_state["view"]
    at.session_state["_check_stopped"] = ("random:gpt2", "float64", view.device, view.input_id, (("mlp", 4),),
                                          True)  # what Stop leaves
    at.run()
    assert any(w.value.startswith("Stopped: the check") for w in at.warning) and not at.success
    assert [b.label for b in at.button] == ["Run the check again"]
    at.button[0].click().run()
    assert not at.exception and not at.warning
    assert at.success[0].value.startswith("PASSED") and "random:gpt2 (gpt2, float64)" in at.success[0].value


def test_restricted_forms_are_listed_with_the_geometrys_own_reasons():
    from perm_core.families import geometry_of
    from perm_core.models.random_models import build_random_model

    at = check_page(model="random:gemma3", dtype="float64", on_head_channels="1", on_rotation="1")
    run_button(at).click().run()
    assert not at.exception, [e.value for e in at.exception]
    reasons = geometry_of(build_random_model("gemma3")[0]).restrictions()
    shown = next(m.value for m in at.markdown if "**Rotations**" in m.value)
    assert reasons["rotation"] in shown and reasons["head_channels"] in shown
    assert not any("does not have" in h.value for h in at.subheader)


def _reproduced(at: AppTest) -> tuple[str, dict]:
    import shlex
    import subprocess
    import sys

    command = at.code[0].value
    argv = shlex.split(command)
    assert argv[:4] == ["python", "-m", "perm_core", "check"]
    result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=600,
                            cwd=Path(APP).parent)
    assert result.returncode == 0, result.stderr
    return command, validated("check", result.stdout)


@pytest.mark.parametrize("query", [
    {"model": "digits-vit", "digit": "5", "k_tokens": "31", "k_channels": "77", "on_mlp": "1", "k_mlp": "2"},
    {"model": "random:gpt2", "ids_src": "text", "text": "the order of   words 'quoted' here", "k_channels": "3"},
], ids=["digit", "text"])
def test_the_reproduce_command_gives_the_pages_report(query):
    at = check_page(dtype="float64", check_backward="0", **query)
    run_button(at).click().run()
    assert not at.exception, [e.value for e in at.exception]
    command, reproduced = _reproduced(at)
    assert reproduced["keys"] == {name: int(query.get(f"k_{name}", default))
                                  for name, default in (("tokens", 7), ("channels", 42), ("mlp", 11))
                                  if query.get(f"on_{name}", "1" if name in ("tokens", "channels") else "0") == "1"}
    assert "--forward-only" in command and all(c["direction"] == "forward" for c in reproduced["checks"])
    # The controls' breaks (order 1, far above round-off) pin the same model, input and keys.
    assert [f"{c['max_rel_error']:.1e}" for c in reproduced["controls"]] == list(at.table[0].value["max rel error"])
    assert reproduced["passed"] is True


def test_a_failing_check_shows_where_it_first_breaks(monkeypatch):
    """A bug planted in block 1 of digits-vit: the page fails, names the first tensor over tolerance in
    computation order, and charts the error place by place with block 1 the first over the line."""
    from perm_core.verify.subject import Subject

    real = Subject.transformed_params

    def with_bug(self, scramble):
        params = dict(real(self, scramble))
        name = next(n for n, c in self.claims.items() if c.layer == 1 and c.rule.tag == "mlp.out"
                    and n.endswith("weight"))
        params[name] = params[name].flip(0)
        return params

    monkeypatch.setattr(Subject, "transformed_params", with_bug)
    at = check_page(model="digits-vit", dtype="float64", on_mlp="1", on_tokens="0", on_channels="0", on_heads="0",
                    on_head_channels="0", on_rotation="0")
    run_button(at).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.error[0].value.startswith("FAILED")
    checks = at.dataframe[0].value
    forward = checks[checks["direction"] == "forward"].iloc[0]
    assert forward["result"] == "FAIL" and forward["first breaks at"] == "blocks.1.hidden"
    assert "Where it first breaks" in [h.value for h in at.subheader]
    stages = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]
    assert stages["x"][:2] == ["embeddings", "block 0"] and "block 1" in stages["x"]
    over = [x for x, color in zip(stages["x"], stages["marker"]["color"], strict=True) if color == "#e45756"]
    assert over[0] == "block 1"


def test_a_symmetry_the_architecture_lacks_is_named_beside_the_verdict():
    """T5's relative position bias reads token order: with tokens switched on, the green verdict must say that
    tokens is not a symmetry (measured), not only list it further down."""
    at = check_page(model="random:t5", dtype="float64", on_tokens="1", on_channels="1", on_heads="0",
                    on_head_channels="0", on_mlp="0", on_rotation="0")
    run_button(at).click().run()
    assert not at.exception, [e.value for e in at.exception]
    verdict = at.success[0].value
    assert verdict.startswith("PASSED") and "Tokens is NOT a symmetry of this architecture" in verdict
    measured = float(verdict.split("changes the output by ")[1].split(" ")[0])
    assert measured > 1e-3
    checks = at.dataframe[0].value
    assert "tokens" not in set(checks["symmetry"])  # it is in no check: the sentence is where a reader sees it
