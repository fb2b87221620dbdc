"""Each family's stages are declared once, in its own file: perm_core/stream reads them and names no family, no
model type and no transformers class; no stage layout is built anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

from perm_core.families import family_by_name, family_names

ROOT = Path(__file__).resolve().parents[2]
LAYOUT_CLASSES = {"StageLayout", "EncoderDecoderLayout", "Head"}


def _python_files(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _string_constants(tree: ast.AST) -> set[str]:
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings}


def _layouts_built(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in LAYOUT_CLASSES]


def names_of_families() -> set[str]:
    names = set()
    for name in family_names():
        family = family_by_name(name)
        names |= {family.name, *family.model_types, *family.classes}
        names |= {layout.head_class for layout in family.stages}
    return names


def test_every_streamed_family_declares_its_stages_in_its_own_file():
    streamed = [name for name in family_names() if family_by_name(name).stages]
    assert len(streamed) >= 15, streamed  # every family the streamed check runs today, T5 included
    for name in streamed:
        source = (ROOT / "perm_core" / "families" / f"{name}.py").read_text()
        assert "stages=" in source, name


def test_no_stage_layout_is_built_outside_the_family_files():
    allowed = ROOT / "perm_core" / "families"
    found = {str(path.relative_to(ROOT)): lines for path in _python_files("perm_core", "ui", "pages", "benchmarks")
             if path.parent != allowed and (lines := _layouts_built(ast.parse(path.read_text())))}
    assert found == {}


def test_the_streamed_check_names_no_family_and_no_class():
    named = names_of_families()
    found = {str(path.relative_to(ROOT)): sorted(_string_constants(ast.parse(path.read_text())) & named)
             for path in _python_files("perm_core/stream")}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The negative control: a layout built in the stream package and a family named there are both seen."""
    planted = ast.parse('from x import StageLayout\nLAYOUT = StageLayout("GPT2LMHeadModel", blocks="h")\n'
                        'if config["model_type"] == "gpt2":\n    pass\n')
    assert _layouts_built(planted) == [2]
    assert _string_constants(planted) & names_of_families() == {"GPT2LMHeadModel", "gpt2"}


def _imported_modules(tree: ast.AST) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def test_benchmarks_and_tests_share_helpers_through_modules_both_import():
    """A benchmark never imports a test module, and a test never takes a benchmark's private name: what both use
    lives in a module of the project (serve.local_server: the app on a loopback port, Chromium's flags)."""
    from_tests = {str(path.relative_to(ROOT)): module for path in _python_files("benchmarks")
                  for module, _ in _imported_modules(ast.parse(path.read_text())) if module.split(".")[0] == "tests"}
    privates = {str(path.relative_to(ROOT)): (module, names) for path in _python_files("tests")
                for module, names in _imported_modules(ast.parse(path.read_text()))
                if module.split(".")[0] == "benchmarks" and any(name.startswith("_") for name in names)}
    assert from_tests == {} and privates == {}
    planted = ast.parse("from tests.e2e.conftest import CHROMIUM_FLAGS\nfrom benchmarks.x import _helper\n")
    assert _imported_modules(planted) == [("tests.e2e.conftest", ["CHROMIUM_FLAGS"]), ("benchmarks.x", ["_helper"])]
