"""Every machine-readable output a test reads goes through validated(): strict JSON (no NaN or Infinity literals)
that follows its shipped schema (perm_core/schemas), so a field the code drops or renames fails the test that
reads it, not a researcher's parser."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from perm_core.schemas import schema


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity literals, as a strict parser does."""
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def validator(kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema(kind))


def validated(kind: str, document: str | Path | dict) -> dict:
    """The document (JSON text, a JSON file, or a to_json() dict as strict JSON would carry it), parsed strictly and
    validated against the schema of `kind` (check, compare, matrix, scramble_keys): jsonschema.ValidationError,
    naming the field, when it does not follow it."""
    if isinstance(document, Path):
        document = document.read_text()
    parsed = strict_json(document if isinstance(document, str) else json.dumps(document, allow_nan=False))
    validator(kind).validate(parsed)
    return parsed


def each_required_field_is_named(kind: str, document: dict) -> None:
    """The control for a document a test validated: every required top-level field, removed in turn, fails by name."""
    required = schema(kind)["required"]
    assert "schema_version" in required and len(required) > 1
    for field in required:
        broken = {k: v for k, v in document.items() if k != field}
        errors = [e.message for e in validator(kind).iter_errors(broken)]
        assert f"'{field}' is a required property" in errors, (kind, field, errors)
