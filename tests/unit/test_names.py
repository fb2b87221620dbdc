"""The one naming scheme for traced tensors (perm_core.run.trace_names): every name a real trace records parses, and
rebuilding it from its parts gives the same string; the names keep their spelling; and no name is built by hand
(an f-string spelling a traced name's prefix) outside the naming module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from perm_core.models.defaults import default_inputs
from perm_core.models.registry import load_model
from perm_core.run import trace_names
from perm_core.run.trace_names import TracedName, build, parse
from perm_core.verify.subject import Subject

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def traces() -> dict[str, dict]:
    """Each random model's forward and backward trace: a decoder, an encoder-decoder and an image model."""
    found = {}
    for name in ("random:llama", "random:t5", "random:vit"):
        loaded = load_model(name, dtype=torch.float64)
        found[name] = Subject(loaded.model, default_inputs(loaded)).trace(backward=True)
    return found


@pytest.mark.parametrize("model", ["random:llama", "random:t5", "random:vit"])
def test_every_name_in_a_real_trace_parses_and_rebuilds_to_itself(traces, model):
    records = traces[model]
    assert len(records) > 10
    for name in records:
        parts = parse(name)
        assert build(parts) == str(parts) == name
        assert parse(build(parts)) == parts
        assert trace_names.is_grad(name) == parts.grad
        assert trace_names.is_param_grad(name) == (parts.kind == "param")
        assert trace_names.is_output(name) == (parts.kind == "output" and not parts.grad)


def test_the_traces_hold_every_kind_of_name(traces):
    """Between them the three traces record every kind, the decoder's stack and gradients of each part of the run."""
    seen = {(p.kind, p.stack, p.grad) for records in traces.values() for p in map(parse, records)}
    assert {kind for kind, _, _ in seen} == set(trace_names.KINDS)
    assert {("embed", "", False), ("embed", "decoder", False), ("hidden", "", True), ("embed", "", True),
            ("embed", "decoder", True), ("input", "", True), ("param", "", True)} <= seen
    t5 = traces["random:t5"]
    crossed = sorted(parse(n).layer for n in t5 if parse(n).kind == "cross_attn")
    hidden = sorted(parse(n).layer for n in t5 if parse(n).kind == "hidden" and not parse(n).grad)
    assert crossed == hidden[len(hidden) - len(crossed):]  # the decoder's blocks come after the encoder's


def test_each_model_numbers_its_blocks_from_zero_without_gaps(traces):
    for records in traces.values():
        for kind in ("hidden", "attn"):
            layers = sorted(p.layer for p in map(parse, records) if p.kind == kind and not p.grad)
            assert layers == list(range(len(layers))) and layers


def test_the_names_keep_their_spelling():
    assert trace_names.EMBED == "embed" and trace_names.DECODER_EMBED == "decoder.embed"
    assert trace_names.hidden(3) == "blocks.3.hidden" and trace_names.attn(0) == "blocks.0.attn"
    assert trace_names.cross_attn(12) == "blocks.12.cross_attn" and trace_names.block(2, "attn") == "blocks.2.attn"
    assert trace_names.output("start_logits") == "output.start_logits"
    assert (trace_names.LOGITS, trace_names.POOLER, trace_names.LAST_HIDDEN) == (
        "output.logits", "output.pooler", "output.last_hidden")
    assert trace_names.GRAD_INPUT == "grad.input"
    assert trace_names.grad(trace_names.hidden(1)) == "grad.blocks.1.hidden"
    assert trace_names.grad(trace_names.DECODER_EMBED) == "grad.decoder.embed"
    assert trace_names.param_grad("model.layers.0.mlp.up_proj.weight") == "grad.param.model.layers.0.mlp.up_proj.weight"
    assert parse("grad.param.h.0.attn.c_attn.bias") == TracedName("param", field="h.0.attn.c_attn.bias", grad=True)
    assert parse("blocks.10.cross_attn") == TracedName("cross_attn", layer=10)
    assert parse("grad.decoder.embed") == TracedName("embed", stack="decoder", grad=True)
    assert parse("output.pooler") == TracedName("output", field="pooler")
    assert trace_names.differentiated("grad.param.wte.weight") == "wte.weight"
    assert trace_names.differentiated("grad.blocks.0.hidden") == "blocks.0.hidden"
    assert trace_names.differentiated("grad.input") == "input"


@pytest.mark.parametrize("name", ["", "embeds", "encoder.embed", "blocks.1", "blocks.x.hidden", "blocks.01.hidden",
                                  "blocks.-1.hidden", "blocks.1.mlp", "blocks.1.hidden.more", "output.", "grad.",
                                  "grad.param.", "grad.grad.input", "input", "param.w"])
def test_what_no_trace_records_does_not_parse(name):
    with pytest.raises(ValueError):
        parse(name)


@pytest.mark.parametrize("parts", [dict(kind="input"), dict(kind="param", field="w"), dict(kind="hidden"),
                                   dict(kind="embed", layer=0), dict(kind="attn", layer=1, stack="decoder"),
                                   dict(kind="output"), dict(kind="embed", stack="encoder"), dict(kind="mlp", layer=1),
                                   dict(kind="embed", field="x")])
def test_parts_that_name_nothing_are_refused(parts):
    with pytest.raises(ValueError):
        TracedName(**parts)


# Prefixes of traced names: a string that starts so and is built from pieces builds a traced name by hand.
PREFIXES = ("blocks.", "grad.", "output.", "decoder.embed")
NAMING_MODULE = ROOT / "perm_core" / "run" / "trace_names.py"


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _hand_built_names(path: Path, root: Path = ROOT) -> list[str]:
    """f-strings that build a traced name, and literals that spell one whole (a docstring may name them)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith(PREFIXES):
                found.append(f"{path.relative_to(root)}:{node.lineno}: f{first.value!r}...")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and node.value.startswith(PREFIXES) and _is_traced_name(node.value)):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def _is_traced_name(text: str) -> bool:
    if any(c.isspace() for c in text):  # prose that starts with a name, not a name
        return False
    try:
        trace_names.parse(text)
    except ValueError:
        return False
    return True


def test_no_traced_name_is_built_by_hand_outside_the_naming_module():
    files = [p for folder in ("perm_core", "ui", "pages", "benchmarks") for p in (ROOT / folder).rglob("*.py")
             if p != NAMING_MODULE]
    assert len(files) > 100
    assert [line for path in files for line in _hand_built_names(path)] == []


def test_the_scan_finds_a_hand_built_name(tmp_path):
    """The scan above would see what it looks for."""
    probe = ROOT / "perm_core" / "run" / "trace.py"
    assert _hand_built_names(probe) == []
    written = tmp_path / "hand.py"
    written.write_text('"""output.logits, named in a docstring"""\nlayer = 3\nname = f"blocks.{layer}.attn"\n'
                       'other = f"grad.param.{layer}"\nfine = f"{layer}"\nwhole = "output.logits"\n'
                       'prose = "output.logits of the head"\n')
    assert _hand_built_names(written, tmp_path) == ["hand.py:3: f'blocks.'...", "hand.py:4: f'grad.param.'...",
                                                    "hand.py:6: 'output.logits'"]
