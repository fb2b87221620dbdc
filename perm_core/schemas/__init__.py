"""The JSON Schemas (draft 2020-12) of perm_core's machine-readable outputs, shipped as package data.

    check           `check --json` (verify.results.Report.to_json; a streamed check's report adds `streamed`)
    compare         `compare A B --json` (verify.same_function.Comparison.to_json)
    matrix          `matrix --json` (verify.matrix.to_json)
    scramble_keys   the key.json that `scramble` writes beside the scrambled checkpoint
    models          `models --json` (the zoo: {"models": [...]})
    authorize       `authorize --json` (applications.authorization, with --attack its `attack`)
    fuse            `fuse A B --json` (applications.fusion.FusionResult.to_json)
    fuse_experiment `fuse --experiment --json` (applications.fusion_experiment)
    split_attack    `split-attack --json` (applications.inversion, with --train its `training`)

Every such document carries "schema_version": SCHEMA_VERSION. It counts changes a reader must know of: a field
removed, renamed or given another meaning or type raises it; a new optional field does not. The schemas are read
through importlib.resources, so they are found in an installed wheel as in a checkout (their glob for package data:
perm_core/schemas/*.json). Validating needs a validator such as the `jsonschema` package, which perm_core itself
does not import.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

SCHEMA_VERSION = 1
KINDS = ("check", "compare", "matrix", "scramble_keys", "models", "authorize", "fuse", "fuse_experiment",
         "split_attack")


@functools.cache
def _text(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"no schema named {kind!r}: choose from {', '.join(KINDS)}")
    return resources.files(__name__).joinpath(f"{kind}.json").read_text(encoding="utf-8")


def schema(kind: str) -> dict:
    """The JSON Schema of one kind of document (a fresh dict each call: the caller may change it)."""
    return json.loads(_text(kind))
