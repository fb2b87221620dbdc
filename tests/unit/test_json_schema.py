"""The shipped JSON Schemas: valid draft 2020-12, in step with the code's names, met by real outputs of check,
compare, matrix and scramble's key file, and strict enough to matter: a document with a required field removed, a
direction or status outside its enum, a field no report has, or another schema_version fails (the controls)."""

from __future__ import annotations

import contextlib
import copy
import io
from importlib import resources

import jsonschema
import pytest
import torch

from perm_core.__main__ import main
from perm_core.cli import DTYPES
from perm_core.engine.symmetries import SYMMETRIES, WEIGHT_SYMMETRIES
from perm_core.models.random_models import build_random_model, random_inputs
from perm_core.schemas import KINDS, SCHEMA_VERSION, schema
from perm_core.verify.check import check
from tests.unit.json_schema import validated, validator

pytestmark = pytest.mark.usefixtures("one_thread")


def printed(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(list(argv))
    return out.getvalue()


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, dict]:
    """One real document of each kind, as the CLI writes it (the check through the API, as the app reads it)."""
    model, _ = build_random_model("gpt2", dtype=torch.float64, seed=3)
    report = check(model, random_inputs("gpt2", model, seed=3), ["channels", "tokens"], key=5)
    out = tmp_path_factory.mktemp("json") / "scrambled"
    printed("scramble", "random:gpt2", "--symmetry", "channels", "--symmetry", "heads", "--key", "11", "--dtype",
            "float64", "--out", str(out))
    return {"check": validated("check", report.to_json()),
            "compare": validated("compare", printed("compare", "random:gpt2", str(out), "--json")),
            "matrix": validated("matrix", printed("matrix", "--family", "gpt2", "--json")),
            "scramble_keys": validated("scramble_keys", out / "key.json"),
            "models": validated("models", printed("models", "--json"))}
# The other kinds' real documents come from the tests that run those commands (authorize, fuse, fuse --experiment,
# split-attack: seconds to minutes each), which validate them and remove each required field in turn.
RUN_ELSEWHERE = {"authorize", "fuse", "fuse_experiment", "split_attack"}


@pytest.mark.parametrize("kind", KINDS)
def test_each_schema_is_draft_2020_12_and_ships_in_the_package(kind):
    document = schema(kind)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(document)
    assert document["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert "schema_version" in document["required"] and document["additionalProperties"] is False
    shipped = {p.name for p in resources.files("perm_core.schemas").iterdir() if p.name.endswith(".json")}
    assert shipped == {f"{k}.json" for k in KINDS}
    with pytest.raises(ValueError, match="no schema named 'report'"):
        schema("report")


def test_the_schemas_name_what_the_code_names():
    for kind in ("check", "compare", "matrix", "scramble_keys"):
        assert schema(kind)["$defs"]["symmetry"]["enum"] == list(SYMMETRIES)
        assert set(DTYPES) <= set(schema(kind)["$defs"]["dtype"]["enum"])
    assert schema("check")["$defs"]["check"]["properties"]["symmetry"]["enum"] == [*SYMMETRIES, "all"]
    assert schema("check")["$defs"]["check"]["properties"]["direction"]["enum"] == ["forward", "backward"]
    assert schema("scramble_keys")["properties"]["symmetries"]["propertyNames"]["enum"] == list(WEIGHT_SYMMETRIES)


def test_real_outputs_carry_the_schema_version(documents):
    assert {kind: d["schema_version"] for kind, d in documents.items()} == dict.fromkeys(
        set(KINDS) - RUN_ELSEWHERE, SCHEMA_VERSION)
    assert {"digits-vit", "minilm"} <= {m["name"] for m in documents["models"]["models"]}
    assert documents["check"]["passed"] and documents["compare"]["verdict"] == "same function"
    assert documents["matrix"]["families"][0]["cells"]["channels"]["status"] == "holds"
    assert documents["scramble_keys"]["key"] == 11 and set(documents["scramble_keys"]["symmetries"]) == {
        "channels", "heads"}


@pytest.mark.parametrize("kind", sorted(set(KINDS) - RUN_ELSEWHERE))
def test_a_document_without_any_one_required_field_fails(kind, documents):
    """The control: every required top-level field, removed in turn, is missed by name."""
    for field in schema(kind)["required"]:
        broken = {k: v for k, v in documents[kind].items() if k != field}
        with pytest.raises(jsonschema.ValidationError, match=f"'{field}' is a required property"):
            validated(kind, broken)


def dropped(path: list, field: str):
    def change(document: dict) -> None:
        for step in path:
            document = document[step]
        del document[field]
    return change


def replaced(path: list, field: str, value):
    def change(document: dict) -> None:
        for step in path:
            document = document[step]
        document[field] = value
    return change


BREAKS = {
    "a check's direction removed": ("check", dropped(["checks", 0], "direction")),
    "a direction outside its enum": ("check", replaced(["checks", 0], "direction", "sideways")),
    "a control's verdict removed": ("check", dropped(["controls", 0], "broken")),
    "a tensor's tolerance removed": ("check", dropped(["checks", 0, "tensors", 0], "tolerance")),
    "an error as a bare string": ("check", replaced(["checks", 0], "max_rel_error", "small")),
    "a field no report has": ("check", replaced([], "verdict", "fine")),
    "another schema version": ("check", replaced([], "schema_version", SCHEMA_VERSION + 1)),
    "a key out of range": ("check", replaced(["keys"], "channels", 2**64)),
    "a symmetry it does not know": ("check", replaced(["keys"], "permutations", 1)),
    "the recovered channels' count removed": ("compare", dropped(["recovered", "channels"], "of")),
    "a verdict compare does not give": ("compare", replaced([], "verdict", "probably the same")),
    "a cell's status outside its enum": ("matrix", replaced(["families", 0, "cells", "mlp"], "status", "ok")),
    "a family's passed removed": ("matrix", dropped(["families", 0], "passed")),
    "tokens among the weight symmetries": ("scramble_keys", replaced(["symmetries"], "tokens", "inputs")),
    "a negative key": ("scramble_keys", replaced([], "key", -1)),
    "a model without its family": ("models", dropped(["models", 0], "family")),
    "a model with a field the zoo has not": ("models", replaced(["models", 0], "weights", "big")),
}


@pytest.mark.parametrize("what", BREAKS)
def test_a_document_broken_inside_fails(what, documents):
    kind, change = BREAKS[what]
    broken = copy.deepcopy(documents[kind])
    change(broken)
    assert not validator(kind).is_valid(broken)
    assert validator(kind).is_valid(documents[kind])  # the same document unbroken


def test_non_finite_numbers_are_the_strict_strings_and_nothing_else(documents):
    document = copy.deepcopy(documents["check"])
    for value in ("nan", "inf", "-inf"):
        document["checks"][0]["max_rel_error"] = value
        validated("check", document)
    document["checks"][0]["max_rel_error"] = "NaN"
    with pytest.raises(jsonschema.ValidationError):
        validated("check", document)
    with pytest.raises(ValueError, match="non-standard JSON constant NaN"):
        validated("check", '{"schema_version": 1, "model": NaN}')
